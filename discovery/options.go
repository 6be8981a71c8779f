package discovery

import (
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTTL is the etcd lease TTL: how long a rank that stopped renewing
// (dead, paused, cut off from etcd) stays registered.
const DefaultTTL = 5 * time.Second

// DefaultDialTimeout bounds connecting to etcd.
const DefaultDialTimeout = 5 * time.Second

// Option configures a registry.
type Option func(*options)

type options struct {
	ttl         time.Duration
	dialTimeout time.Duration
	client      *clientv3.Client
	queue       int
	tls         *tls.Config
	user, pass  string
	onHeld      func(held Record)
	// jitter draws the random wait before a retry of the watch, below
	// its bound (randomWait; tests record the bounds).
	jitter func(bound time.Duration) time.Duration
}

func buildOptions(opts []Option) options {
	o := options{ttl: DefaultTTL, dialTimeout: DefaultDialTimeout, queue: DefaultEventQueue, jitter: randomWait}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithTTL sets the etcd lease TTL (rounded up to whole seconds, at least
// 1 s; etcd raises it to its own minimum, 1.5 election timeouts).
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithDialTimeout bounds connecting to etcd.
func WithDialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// WithClient makes the etcd registry use c instead of dialling its own;
// the registry never closes c.
func WithClient(c *clientv3.Client) Option { return func(o *options) { o.client = c } }

// WithTLS makes the etcd registry speak TLS with cfg (LoadTLS builds one
// from PEM files). Open gives an etcds:// URL a default (the system's
// roots) and refuses WithTLS with a plaintext etcd:// URL. cfg is used as
// it is for the registry's life: its RootCAs are not read again (LoadTLS
// reads the CA file once; a rotated CA needs a restart), its
// GetClientCertificate is asked at each handshake.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// ReadPassword reads a password file for WithAuth: its first line,
// without a trailing CR. An empty first line is an error.
func ReadPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	pw, _, _ := strings.Cut(string(b), "\n")
	if pw = strings.TrimSuffix(pw, "\r"); pw == "" {
		return "", errors.New("its first line is empty")
	}
	return pw, nil
}

// WithAuth makes the etcd registry authenticate as user with password
// (etcd's auth; the user needs read and write access to the cluster's
// prefix, /kvxfer/<cluster>/). Over a plaintext etcd:// URL the password
// crosses the network in the clear.
func WithAuth(user, password string) Option {
	return func(o *options) { o.user, o.pass = user, password }
}

// WithOnHeld calls f, on Register's goroutine, each time Register finds
// its rank's key held by an older incarnation under a live lease and
// starts waiting for it to go: another process running as the same rank,
// or a previous run whose lease has not expired yet. The wait is silent
// otherwise (it lasts as long as the holder lives).
func WithOnHeld(f func(held Record)) Option { return func(o *options) { o.onHeld = f } }

// WithEventQueue bounds the events held for a slow consumer of Events.
// The etcd registry holds room for its cluster's size beyond it: two
// events per rank it knows and one per key its last read of the prefix
// held.
func WithEventQueue(n int) Option { return func(o *options) { o.queue = n } }

// ttlSeconds is the TTL etcd is asked for.
func (o options) ttlSeconds() int64 {
	s := int64((o.ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// retryMax bounds the random wait before a retry of the etcd registry's
// watch: a quarter of the TTL, at most 2 s (at least watchRetryMin). The
// ranks of a cluster whose watches etcd cancelled together (a lost
// leader, a compaction) come back spread over it: the wait adds that
// much at most to how late they learn of a change made meanwhile, well
// within the TTL a rank that dies takes to be seen.
func (o options) retryMax() time.Duration {
	ttl := time.Duration(o.ttlSeconds()) * time.Second
	return max(watchRetryMin, min(ttl/4, 2*time.Second))
}

// randomWait is uniform in [0, bound): never one delay every rank shares.
func randomWait(bound time.Duration) time.Duration {
	if bound <= 0 {
		return 0
	}
	return rand.N(bound)
}
