package ucx

import (
	"fmt"
	"strings"
	"time"
)

// Option configures an Agent.
type Option func(*options)

type options struct {
	spin      time.Duration
	busySpin  time.Duration
	tick      time.Duration
	keepalive time.Duration
	close     time.Duration
	handshake time.Duration
	revoke    time.Duration
	mmErrors  bool
	cpus      []int // the progress thread's affinity (none: the scheduler's choice)
	admit     func(addr []byte) bool
	identity  string
}

func defaultOptions() options {
	return options{
		spin:      50 * time.Microsecond,
		busySpin:  50 * time.Microsecond,
		tick:      time.Second,
		keepalive: time.Second,
		close:     10 * time.Second,
		handshake: 10 * time.Second,
		revoke:    10 * time.Second,
		mmErrors:  true,
	}
}

// WithSpin sets how long the progress goroutine keeps polling after its
// last piece of work before it sleeps on the worker's event fd: idle is the
// figure with nothing outstanding, busy with operations in flight (default
// 50µs each). Zero sleeps at once. On a machine with few cores, spinning
// takes time from the threads that do the work (the peer's, in one
// process); on a dedicated core it saves a wakeup per burst.
func WithSpin(idle, busy time.Duration) Option {
	return func(o *options) { o.spin, o.busySpin = max(idle, 0), max(busy, 0) }
}

// WithProgressCPUs pins the agent's progress thread, the one thread that
// makes every UCX call and, over shared memory, every copy, to these CPUs
// (sched_setaffinity), as UCX's and NIXL's progress-thread affinity
// settings do: on a machine with cores to spare, a CPU of its own near the
// NIC. Other goroutines still run wherever the scheduler puts them (an
// endpoint's dispatcher moves off the progress thread's CPU before it
// naps). New fails if a CPU is out of range or the affinity is refused.
// None (the default) leaves the thread to the scheduler.
func WithProgressCPUs(cpus ...int) Option {
	return func(o *options) { o.cpus = append([]int(nil), cpus...) }
}

// WithKeepalive sets UCX's keepalive interval, which bounds how long a
// dead peer goes unnoticed on transports that cannot see it die (shared
// memory). Default 1s; a UCX_KEEPALIVE_INTERVAL in the environment wins.
func WithKeepalive(d time.Duration) Option {
	return func(o *options) { o.keepalive = d }
}

// WithCloseTimeout bounds how long closing an endpoint waits for writes
// already on the wire to be acknowledged before it forces the endpoint
// closed (default 10s). See doc.go for what a forced close does not prove.
func WithCloseTimeout(d time.Duration) Option {
	return func(o *options) { o.close = d }
}

// WithHandshakeTimeout bounds how long Connect waits for the peer agent's
// answer (default 10s); then Connect fails with rdma.ErrPeerGone.
func WithHandshakeTimeout(d time.Duration) Option {
	return func(o *options) { o.handshake = d }
}

// WithRevokeTimeout bounds how long Deregister and Close wait for each
// peer's acknowledgement (default 10s). A Deregister that times out fails
// with rdma.ErrRegionBusy and changes nothing.
func WithRevokeTimeout(d time.Duration) Option {
	return func(o *options) { o.revoke = d }
}

// WithAdmission makes the agent link only with agents whose address admit
// accepts: a hello from any other agent is dropped, so that an agent
// nobody vouched for learns nothing of this one and
// costs it no endpoint. admit gets the address the hello carries (what
// the other agent's Address returns); it runs on the progress goroutine
// and must not block. A node admits the agent addresses its
// authenticated peers sent in their Hellos (a writer connects only after
// its Hello reached this node's engine). Connect is not affected: this
// agent links with the addresses it is given.
func WithAdmission(admit func(addr []byte) bool) Option {
	return func(o *options) { o.admit = admit }
}

// WithIdentity names whom this agent serves (a node: its rank,
// "instance/rank"; at most 256 bytes, else New fails). Its hello and
// welcome carry it, sealed under each link key, and the endpoints of a
// peer's agent report it (rdma.IdentifiedEndpoint), so that a writer can
// check that an agent address a peer named reaches that peer's agent, not
// another's.
func WithIdentity(id string) Option {
	return func(o *options) { o.identity = id }
}

// WithSharedMemoryErrorHandling says whether UCX's shared-memory transports
// (posix, sysv) offer peer-failure handling, which their keepalive
// provides (UCX_MM_ERROR_HANDLING; default yes). UCX 1.13 turns it off, and
// endpoints with peer error handling, as this backend's are, then cannot
// use shared memory at all: between processes of one host UCX falls back
// to tcp over the loopback. A UCX_MM_ERROR_HANDLING, UCX_POSIX_ or
// UCX_SYSV_ERROR_HANDLING in the environment wins.
func WithSharedMemoryErrorHandling(on bool) Option {
	return func(o *options) { o.mmErrors = on }
}

// configMods is what the agent changes in UCX's configuration, as
// "NAME=VALUE" lines for ucp_config_modify: only what the environment
// leaves unset.
func configMods(o options, getenv func(string) string) string {
	var mods []string
	if getenv("UCX_KEEPALIVE_INTERVAL") == "" && o.keepalive > 0 {
		mods = append(mods, fmt.Sprintf("KEEPALIVE_INTERVAL=%dus", o.keepalive.Microseconds()))
	}
	if o.mmErrors && getenv("UCX_MM_ERROR_HANDLING") == "" && getenv("UCX_POSIX_ERROR_HANDLING") == "" && getenv("UCX_SYSV_ERROR_HANDLING") == "" {
		mods = append(mods, "MM_ERROR_HANDLING=y")
	}
	return strings.Join(mods, "\n")
}
