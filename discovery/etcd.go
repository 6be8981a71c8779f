package discovery

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd is the registry kept in etcd. A rank's record lives at
// /kvxfer/<cluster>/<instance>/<rank>, attached to a lease of the
// configured TTL that the registry keeps alive; every registry watches the
// cluster's prefix. A key that disappears without its rank marking it
// leaving is a Down with reason "lease expired", for every peer at once,
// and that incarnation is refused from then on.
//
// Values read from etcd are peer bytes: each is decoded and validated
// (DecodeRecord); one that fails is reported as a Rejected event naming
// its key, counted (Rejected), and changes nothing.
type Etcd struct {
	cli     *clientv3.Client
	ownCli  bool
	cluster string
	prefix  string
	opts    options
	q       *eventQueue

	// ctx ends at Close (or fail): the watch, the keepalive and a
	// Register in flight stop with it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// regs counts the Registers in flight, added under mu while not
	// closed: Close waits for each before it reads what is registered,
	// withdraws it, and (its own client) closes the client.
	regs sync.WaitGroup
	// registering is regs' count, for tests (a WaitGroup does not tell).
	registering atomic.Int32

	// cliCancel ends the context of a client of its own (shut).
	cliCancel context.CancelFunc

	mu         sync.Mutex
	m          *members
	registered bool
	closed     bool
	self       Record
	key        string
	value      []byte
	lease      clientv3.LeaseID
	// readKeys is how many keys the last read of the prefix held (push).
	readKeys int
	// stopKeepalive ends the keepalive of the registration in progress.
	stopKeepalive context.CancelFunc
	closeOnce     sync.Once

	// errMu guards err apart from mu: the event queue fails the registry
	// from inside a push made under mu.
	errMu sync.Mutex
	err   error
}

var _ Registry = (*Etcd)(nil)

// NewEtcd connects to etcd (unless WithClient gives a client), reads the
// cluster's current members (each an Up on Events) and starts watching.
func NewEtcd(ctx context.Context, endpoints []string, cluster string, opts ...Option) (*Etcd, error) {
	if err := CheckCluster(cluster); err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	e := &Etcd{cluster: cluster, prefix: ClusterPrefix(cluster), opts: o, m: newMembers(cluster)}
	if o.client != nil {
		e.cli = o.client
	} else {
		if len(endpoints) == 0 {
			return nil, fmt.Errorf("%w: no etcd endpoint", ErrInvalidURL)
		}
		// The client lives until Close, not ctx; but with a user it
		// authenticates as it is made, and that wait ends with ctx too.
		cctx, ccancel := context.WithCancel(context.Background())
		stop := context.AfterFunc(ctx, ccancel)
		cli, err := dial(cctx, endpoints, o, true)
		if !stop() {
			if err == nil {
				_ = cli.Close()
			}
			ccancel()
			return nil, explain(fmt.Errorf("discovery: etcd %v%s: connecting: %w", endpoints, e.authNote(), context.Cause(ctx)), endpoints, o.tls)
		}
		if err != nil {
			ccancel()
			return nil, explain(fmt.Errorf("discovery: etcd %v%s: %w", endpoints, e.authNote(), err), endpoints, o.tls)
		}
		e.cli, e.ownCli, e.cliCancel = cli, true, ccancel
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.q = newEventQueue(o.queue, e.fail)

	gctx, cancel := context.WithTimeout(ctx, o.dialTimeout)
	defer cancel()
	resp, err := e.cli.Get(gctx, e.prefix, clientv3.WithPrefix())
	if err != nil {
		e.shut()
		err = fmt.Errorf("discovery: etcd %v%s: reading %s: %w", e.cli.Endpoints(), e.authNote(), e.prefix, err)
		if o.client == nil {
			err = explain(err, endpoints, o.tls)
		}
		return nil, err
	}
	e.mu.Lock()
	e.sync(resp)
	e.mu.Unlock()
	if err := e.Err(); err != nil {
		e.shut()
		return nil, fmt.Errorf("discovery: etcd %v: reading %s: %w", e.cli.Endpoints(), e.prefix, err)
	}
	e.wg.Add(1)
	go e.watch(resp.Header.Revision + 1)
	return e, nil
}

// dial makes a client of endpoints with o's TLS (https://: required,
// never dropped) and auth, within ctx (with a user, clientv3.New
// authenticates before it returns); keepalive adds the registry's gRPC
// keepalive (a long-lived client).
func dial(ctx context.Context, endpoints []string, o options, keepalive bool) (*clientv3.Client, error) {
	eps := endpoints
	if o.tls != nil {
		eps = make([]string, len(endpoints))
		for i, ep := range endpoints {
			eps[i] = "https://" + ep
		}
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: o.dialTimeout, TLS: o.tls,
		Username: o.user, Password: o.pass, Logger: zap.NewNop(), Context: ctx}
	if keepalive {
		cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout = keepAlivePing, keepAlivePingTimeout
	}
	return clientv3.New(cfg)
}

// keepAlivePing and keepAlivePingTimeout are the gRPC keepalive of the
// registry's own client: a connection to an etcd member that answers
// nothing (its host froze or dropped off the network, without a FIN or
// an RST) is given up after keepAlivePing + keepAlivePingTimeout, and its
// watch and lease keepalive move to another member (the lease outlives
// that only with a TTL above those 15 s: under the default 5 s, a rank
// whose keepalive ran over that connection is Lost first). Without them the
// watch waited on such a connection until the kernel gave up on it, many
// minutes later: the registry saw no arrival or departure meanwhile.
// gRPC pings no more often than every 10 s; etcd refuses pings more
// often than every 5 s (--grpc-keepalive-min-time) or on a connection
// without a stream (the client sends none there: PermitWithoutStream is
// off, and the registry's watch is a stream while it runs).
const (
	keepAlivePing        = 10 * time.Second
	keepAlivePingTimeout = 5 * time.Second
)

// authNote names the etcd user in an error ("" without auth).
func (e *Etcd) authNote() string {
	if e.opts.user == "" {
		return ""
	}
	return fmt.Sprintf(" as user %q", e.opts.user)
}

func snapshot(kvs []*mvccpb.KeyValue) map[string]storedValue {
	s := make(map[string]storedValue, len(kvs))
	for _, kv := range kvs {
		s[string(kv.Key)] = storedValue{value: kv.Value, lease: kv.Lease}
	}
	return s
}

// fail stops the registry for good with err: Events delivers what is
// pending, then closes; Err says why.
func (e *Etcd) fail(err error) {
	e.errMu.Lock()
	if e.err == nil {
		e.err = err
	}
	e.errMu.Unlock()
	e.cancel()
	e.q.end()
}

// watch follows the prefix from rev. A watch that breaks without a
// compaction (etcd lost its leader — the watch requires one, so every
// rank's watch is cancelled at once —, or cancelled it, or an error)
// resumes after the last event it delivered: etcd still holds every event
// since, and sends them, each once and in order. Only a compaction past
// rev (events this registry never saw are gone) makes it read the prefix
// again and apply the difference, then watch from after that read.
//
// Each retry — a watch again, a read after a compaction — first waits a
// random time below a bound (e.opts.jitter), so that the ranks of a
// cluster whose watches broke together come back spread out, not at the
// same moment. The bound starts at watchRetryMin and doubles with each
// retry that finds etcd no better (a watch that delivered nothing), up to
// retryMax; it starts over once a watch delivered something. A read after
// a compaction (and each retry of one that failed) waits within retryMax
// from the first: every rank reads the whole prefix then.
func (e *Etcd) watch(rev int64) {
	defer e.wg.Done()
	maxWait := e.opts.retryMax()
	bound := watchRetryMin
	compacted := false
	for e.ctx.Err() == nil {
		if compacted {
			// Resynchronise: what happened while the watch was broken
			// shows as the difference between the table and the prefix
			// now.
			if !e.pause(maxWait) {
				return
			}
			gctx, cancel := context.WithTimeout(e.ctx, e.opts.dialTimeout)
			resp, err := e.cli.Get(gctx, e.prefix, clientv3.WithPrefix())
			cancel()
			if err != nil {
				if e.cli.Ctx().Err() != nil {
					break
				}
				continue
			}
			e.mu.Lock()
			e.sync(resp)
			e.mu.Unlock()
			rev, compacted = resp.Header.Revision+1, false
		}
		wch := e.cli.Watch(clientv3.WithRequireLeader(e.ctx), e.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
		delivered := false
		for resp := range wch {
			// (etcd may also say so as a cancellation's reason.)
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				compacted = true
				break
			}
			if resp.Err() != nil {
				break
			}
			delivered = true
			// Within one revision (one transaction), apply incarnation keys
			// before records: a registration writes both at once.
			evs := slices.Clone(resp.Events)
			slices.SortStableFunc(evs, func(a, b *clientv3.Event) int {
				if c := cmp.Compare(a.Kv.ModRevision, b.Kv.ModRevision); c != 0 {
					return c
				}
				return cmp.Compare(incKeyLast(a.Kv.Key), incKeyLast(b.Kv.Key))
			})
			e.mu.Lock()
			for _, ev := range evs {
				switch ev.Type {
				case clientv3.EventTypePut:
					e.push(e.m.put(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.Lease)...)
				case clientv3.EventTypeDelete:
					e.push(e.m.del(string(ev.Kv.Key))...)
				}
			}
			e.mu.Unlock()
			// Resume after the last event applied, not after the header's
			// revision: etcd sends a watcher that fell behind its events in
			// batches of 1000 revisions (a revision's events never split),
			// each with the store's current revision, and a watch resumed
			// from there would skip the rest.
			if n := len(evs); n > 0 {
				rev = max(rev, evs[n-1].Kv.ModRevision+1)
			}
		}
		if e.ctx.Err() != nil {
			return
		}
		if e.cli.Ctx().Err() != nil {
			break
		}
		if delivered {
			bound = watchRetryMin
		}
		if compacted {
			continue // the read waits
		}
		if !e.pause(bound) {
			return
		}
		bound = min(2*bound, maxWait)
	}
	if e.ctx.Err() == nil {
		e.lose(ReasonKeepaliveStopped)
		e.fail(fmt.Errorf("%w: its etcd client was closed", ErrClosed))
	}
}

// watchRetryMin is the first bound of the random wait before the watch
// is retried.
const watchRetryMin = 50 * time.Millisecond

// pause waits a random time below bound (false: the registry closed
// meanwhile).
func (e *Etcd) pause(bound time.Duration) bool {
	t := time.NewTimer(e.opts.jitter(bound))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-e.ctx.Done():
		return false
	}
}

func (e *Etcd) lose(reason string) {
	e.mu.Lock()
	e.push(e.m.lose(reason)...)
	e.mu.Unlock()
}

// push queues evs (callers hold mu). The queue's bound is on a consumer
// that falls behind, not on the cluster's size: beyond it there is room
// for two events per rank the table holds (each rank's Up as a rank
// starts in a running cluster, a Down and an Up per rank as a
// resynchronisation finds them changed) and one per key the last read of
// the prefix held (a Rejected for each value no peer accepts). A cluster
// of more ranks than the bound, or many ranks registering at once,
// stopped every registry that started in it with ErrEventOverflow.
func (e *Etcd) push(evs ...Event) {
	e.q.pushWithin(e.q.limit+2*len(e.m.ranks)+e.readKeys, evs...)
}

// sync applies a read of the prefix (callers hold mu).
func (e *Etcd) sync(resp *clientv3.GetResponse) {
	e.readKeys = len(resp.Kvs)
	e.push(e.m.sync(snapshot(resp.Kvs), resp.Header.Revision)...)
}

// Register publishes r under its key, attached to a new lease kept alive
// until Close. When the key still holds an older incarnation of the rank
// (a previous run whose lease has not expired yet), Register waits for it
// to go, within ctx. It refuses (ErrStaleIncarnation) an incarnation not
// above the one the rank's incarnation key names, nor above the one its
// record holds under a live lease (also when the incarnation key was
// deleted), or one this registry has seen.
//
// Close cuts a Register in flight short and waits for it: that Register
// fails with ErrClosed and leaves no record, lease or goroutine behind; a
// Register after Close is ErrClosed as well. A failure of the registry
// (Err) cuts it short the same way, and its error names that failure.
//
// Register returns nil only once etcd has renewed the new lease once (the
// keepalive's first reply, awaited within ctx and the dial timeout + 1 s): from
// then on the registration is Lost only when its lease is not renewed for
// its TTL, or its record goes.
//
// A Register that fails once its lease was granted revokes it (within the
// dial timeout), so that a record etcd committed goes with it; when etcd
// cannot be reached for that, the record stays until the lease's TTL, and
// this registry never lists it nor reports it (no Up, no Down): other
// registries see it come and go.
//
// Lost is said only of a registration whose Register returned nil. One
// whose lease ends or whose record goes before Register returns (etcd
// stopped answering for the TTL while it waited) fails that Register,
// with an error that says so, and no Lost is ever delivered for it.
func (e *Etcd) Register(ctx context.Context, r Record) error {
	value, err := r.Encode()
	if err != nil {
		return err
	}
	key := Key(e.cluster, r.Instance, r.Rank)
	e.mu.Lock()
	switch {
	case e.Err() != nil:
		e.mu.Unlock()
		return fmt.Errorf("%w: cannot register %s: the registry stopped: %w", ErrClosed, r, e.Err())
	case e.closed:
		e.mu.Unlock()
		return fmt.Errorf("%w: cannot register %s", ErrClosed, r)
	case e.registered:
		e.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrRegistered, e.self)
	}
	if err := e.m.register(r); err != nil {
		e.mu.Unlock()
		return err
	}
	e.registered, e.self, e.key, e.value = true, r, key, value
	e.regs.Add(1)
	e.registering.Add(1)
	e.mu.Unlock()
	defer e.regs.Done()
	defer e.registering.Add(-1)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(e.ctx, func() { cancel(nil) }) // Close cuts it short
	defer stop()

	// Bounded as the first read is: until the keepalive runs, nothing
	// else would end a wait on an etcd that stopped answering.
	gctx, gcancel := context.WithTimeout(ctx, e.opts.dialTimeout)
	lease, err := e.cli.Grant(gctx, e.opts.ttlSeconds())
	gcancel()
	if err != nil {
		return e.unregister(fmt.Errorf("discovery: etcd %v%s: lease for %s: %w", e.cli.Endpoints(), e.authNote(), key, err), 0)
	}
	e.mu.Lock()
	e.lease = lease.ID
	e.mu.Unlock()
	kctx, kcancel := context.WithCancel(e.ctx)
	e.mu.Lock()
	e.stopKeepalive = kcancel
	e.mu.Unlock()
	ka, err := e.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		return e.unregister(fmt.Errorf("discovery: etcd: keepalive for %s: %w", key, err), lease.ID)
	}
	if err := e.firstRenewal(ctx, ka, key, lease.ID); err != nil {
		return e.unregister(err, lease.ID)
	}
	e.wg.Add(1)
	// The end of the lease ends a registration still in progress (waiting
	// for an older incarnation to go, or for etcd): it can never complete.
	go e.keepalive(kctx, ka, func() { cancel(errLeaseEnded) })
	rev, err := e.put(ctx, r, key, value, lease.ID)
	if err != nil {
		if errors.Is(context.Cause(ctx), errLeaseEnded) {
			err = fmt.Errorf("discovery: etcd: registering %s: its lease %x ended before the registration completed "+
				"(not renewed for its TTL, %ds: etcd stopped or unreachable); it was: %w", key, lease.ID, lease.TTL, err)
		}
		return e.unregister(err, lease.ID)
	}
	// The registration completes only if its record and lease are still
	// there: one lost meanwhile (the keepalive stopped, the key was
	// deleted or taken) fails the Register, and is no Lost.
	e.mu.Lock()
	err = e.m.confirm(rev)
	e.mu.Unlock()
	if err != nil {
		return e.unregister(fmt.Errorf("discovery: etcd: registering %s under lease %x: %w", key, lease.ID, err), lease.ID)
	}
	return nil
}

// firstRenewal waits for the first reply of the lease's keepalive, within
// ctx and the client's first keepalive timeout (its dial timeout + 1 s,
// the client's own bound). Until a keepalive has had a reply, the etcd
// client gives it only its first keepalive timeout (the client's dial
// timeout + 1 s, not the lease's TTL, which it does not know yet) before
// it closes it: a Register that returned before that reply left its rank
// to be Lost a few seconds after, whatever its TTL, if etcd went silent
// just then. Once a reply came, the client keeps the keepalive for a TTL
// after each reply, and so a registration is Lost only per its TTL.
func (e *Etcd) firstRenewal(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse, key string, lease clientv3.LeaseID) error {
	// The client sends a new keepalive's first request on its next tick (up
	// to 500 ms later) and gives the keepalive up a dial timeout + 1 s after
	// it began: waiting that long, not a dial timeout, leaves a loaded
	// machine's reply its whole chance.
	bound := e.opts.dialTimeout + time.Second
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	select {
	case _, ok := <-ka:
		if ok {
			return nil
		}
		return fmt.Errorf("discovery: etcd %v%s: keepalive for %s: the client gave up lease %x before etcd renewed it once "+
			"(no reply within its first keepalive timeout, or the lease had expired)", e.cli.Endpoints(), e.authNote(), key, lease)
	case <-wctx.Done():
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("discovery: etcd: keepalive for %s: waiting for the first renewal of lease %x: %w", key, lease, err)
		}
		return fmt.Errorf("discovery: etcd %v%s: keepalive for %s: no renewal of lease %x within %v: %w",
			e.cli.Endpoints(), e.authNote(), key, lease, bound, wctx.Err())
	}
}

// errLeaseEnded is the cause that ends a Register whose lease ended.
var errLeaseEnded = errors.New("discovery: the registration's lease ended")

// put writes the record once the key is free (or holds a value no peer
// accepts), together with the rank's incarnation key in one transaction;
// it waits for an older incarnation's key to go (also one holding a
// value this build cannot read under the lease the incarnation key
// names: a later build's record), and refuses an incarnation the
// incarnation key says was already registered, or one not above the
// record the key holds under a live lease, and an incarnation
// key it cannot decode (left as it is). The incarnation key
// alone does not do: it has no lease and etcd's compaction keeps it, but
// anyone may delete it, and a lower incarnation would then replace a live
// higher one. Each write is conditional on the record key being as read
// (absent, or at the revision checked), so the check holds at the commit.
func (e *Etcd) put(ctx context.Context, r Record, key string, value []byte, lease clientv3.LeaseID) (rev int64, err error) {
	incKey := key + IncarnationSuffix
	writes := []clientv3.Op{
		clientv3.OpPut(incKey, string(registration{Incarnation: r.Incarnation, Lease: int64(lease)}.encode())),
		clientv3.OpPut(key, string(value), clientv3.WithLease(lease)),
	}
	for {
		g, err := e.cli.Get(ctx, incKey)
		if err != nil {
			return 0, fmt.Errorf("discovery: etcd: reading %s: %w", incKey, err)
		}
		var incRev int64
		var cur registration
		named := false // the incarnation key names a registration
		if len(g.Kvs) > 0 {
			incRev = g.Kvs[0].ModRevision
			// An incarnation key this build cannot decode is never
			// rewritten: it may be a later build's (another version), and
			// name an incarnation above r's; rewriting it would let that
			// incarnation back. Someone must look at it.
			c, err := decodeRegistration(g.Kvs[0].Value)
			if err != nil {
				return 0, fmt.Errorf("discovery: etcd: %s holds a value this build cannot decode, %.80q: %w; "+
					"registering %s would overwrite it, and it may name a later incarnation (a later build's "+
					"format): it is left as it is (delete it by hand only if it is damaged and no run of %s is up)",
					incKey, g.Kvs[0].Value, err, r, r.Peer())
			}
			cur, named = c, true
			if cur.Incarnation >= r.Incarnation {
				// The registration named, live (its record under its
				// lease), is another process of the rank: say so.
				if h, err := e.cli.Get(ctx, key); err == nil && len(h.Kvs) > 0 && h.Kvs[0].Lease == cur.Lease {
					if old, _, derr := decodeRecord(h.Kvs[0].Value); derr == nil && old.Peer() == r.Peer() && old.Incarnation == cur.Incarnation {
						return 0, heldBelow(r, old, incKey)
					}
				}
				return 0, fmt.Errorf("%w: %s names incarnation %d, not below %d", ErrStaleIncarnation, incKey, cur.Incarnation, r.Incarnation)
			}
		}
		incSame := clientv3.Compare(clientv3.ModRevision(incKey), "=", incRev)
		resp, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), incSame).
			Then(writes...).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return 0, fmt.Errorf("discovery: etcd: registering %s: %w", key, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue // the incarnation key moved, or the key went meanwhile
		}
		kv := kvs[0]
		old, _, derr := decodeRecord(kv.Value)
		if derr == nil && old.Peer() == r.Peer() && kv.Lease != 0 && old.Incarnation >= r.Incarnation {
			// A live holder not below r: another process of the rank
			// (started together with this one and stamped later, or
			// the incarnation key deleted by hand), as heldBelow says.
			names := fmt.Sprintf("%s named %d when read", incKey, cur.Incarnation)
			if incRev == 0 {
				names = incKey + " was missing when read"
			}
			return 0, heldError{fmt.Errorf("%w: %s holds incarnation %d at %s under live lease %x (%s): incarnation %d is not above it. "+
				"Another process runs as %s (same instance and rank?): give this one its own instance or rank, or stop that one",
				ErrStaleIncarnation, key, old.Incarnation, old.ControlEndpoint, kv.Lease, names, r.Incarnation, r.Peer())}
		}
		switch {
		case derr != nil && named && kv.Lease == cur.Lease:
			// A value this build cannot read, under the very lease the
			// incarnation key names: that registration's own record (a
			// later build's version), live while its lease is. Waited
			// for below, as any live holder; replacing it pushed a live
			// process of the rank out.
			old = Record{Instance: r.Instance, Rank: r.Rank, Incarnation: cur.Incarnation}
		case derr != nil || old.Peer() != r.Peer() || kv.Lease == 0 ||
			named && (old.Incarnation != cur.Incarnation || kv.Lease != cur.Lease):
			// A value no peer accepts holds the key (malformed, another
			// rank's, held by no lease, or not the registration the
			// incarnation key names): replace it. With that key missing,
			// an older record of the rank under a live lease is waited
			// for: registries that saw its registration still hold it
			// up, and it may be a live holder.
			resp, err := e.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision), incSame).
				Then(writes...).Commit()
			if err != nil {
				return 0, fmt.Errorf("discovery: etcd: registering %s over a value no peer accepts: %w", key, err)
			}
			if resp.Succeeded {
				return resp.Header.Revision, nil
			}
			continue
		}
		if e.opts.onHeld != nil {
			e.opts.onHeld(old)
		}
		if err := e.waitGone(ctx, key, kv.ModRevision); err != nil {
			return 0, heldError{fmt.Errorf("discovery: etcd: %s is still held by incarnation %d (its lease has not expired): %w", key, old.Incarnation, err)}
		}
	}
}

// waitGone waits until key changes after rev (deleted or rewritten).
//
// Once etcd compacted past rev a watch from rev+1 is refused at once, for
// as long as the key is unchanged (a holder's key keeps the revision it
// was registered at): the key is read then, and the watch starts again
// after that read while it still holds rev, instead of the caller looking
// again as fast as etcd answers, for as long as the holder lives.
func (e *Etcd) waitGone(ctx context.Context, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.ctx, cancel) // Close ends the wait too
	defer stop()
	from := rev + 1
	for {
		compacted := false
		for resp := range e.cli.Watch(wctx, key, clientv3.WithRev(from)) {
			// (etcd may also say so as a cancellation's reason.)
			if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
				compacted = true
				break
			}
			if resp.Err() != nil || len(resp.Events) > 0 {
				return nil // look again
			}
		}
		if !compacted {
			break
		}
		g, err := e.cli.Get(wctx, key)
		if err != nil || len(g.Kvs) == 0 || g.Kvs[0].ModRevision != rev {
			break // changed (or unreadable): look again
		}
		from = g.Header.Revision + 1
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return e.ctx.Err()
}

// unregister undoes a failed Register; one that failed because Close (or
// a failure of the registry) cut it short says so with ErrClosed.
func (e *Etcd) unregister(err error, lease clientv3.LeaseID) error {
	e.mu.Lock()
	if e.stopKeepalive != nil {
		e.stopKeepalive() // before the revoke: a failed Register is no Lost
	}
	if e.ctx.Err() != nil && !errors.Is(err, ErrClosed) {
		if ferr := e.Err(); ferr != nil {
			// Not a Close: the registry failed meanwhile (its event queue
			// overflowed, its etcd client was closed), and that is why.
			err = fmt.Errorf("%w: registering %s cut short: the registry stopped: %w: %w", ErrClosed, e.self, ferr, err)
		} else {
			err = fmt.Errorf("%w: registering %s cut short: %w", ErrClosed, e.self, err)
		}
	}
	e.mu.Unlock()
	if lease != 0 {
		rctx, cancel := context.WithTimeout(context.Background(), e.opts.dialTimeout)
		_, _ = e.cli.Revoke(rctx, lease)
		cancel()
	}
	e.mu.Lock()
	e.registered, e.lease, e.stopKeepalive = false, 0, nil
	e.m.unregister(int64(lease))
	e.mu.Unlock()
	return err
}

// keepalive drains the lease's keepalive responses; when they stop (the
// lease expired, was revoked, or etcd could not be reached for a TTL)
// this rank is out of the cluster, and a Register still in progress ends
// (ended).
func (e *Etcd) keepalive(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse, ended func()) {
	defer e.wg.Done()
	for range ka {
	}
	if ctx.Err() == nil {
		ended()
		e.lose(ReasonKeepaliveStopped)
	}
}

// Events implements Registry.
func (e *Etcd) Events() <-chan Event { return e.q.out }

// Peers implements Registry.
func (e *Etcd) Peers() []Record {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m.peers()
}

// Rejected counts the values under the prefix this registry refused.
func (e *Etcd) Rejected() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m.rejected
}

// Err says why Events closed before Close (nil while running or after a
// plain Close).
func (e *Etcd) Err() error {
	e.errMu.Lock()
	defer e.errMu.Unlock()
	return e.err
}

// Close marks the record leaving (peers see Down with reason "left"),
// revokes the lease, stops watching and closes Events. A registry that
// reported its record Lost withdraws what etcd still holds of it, if etcd
// answers, and reports no failure to. A Register in
// flight is cut short first (it fails with ErrClosed and undoes itself),
// and Close returns only after it did. The error is the failure to
// withdraw the record, if any (its lease then expires on its own).
func (e *Etcd) Close() error {
	var err error
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true // no Register starts from now on
		e.mu.Unlock()
		e.cancel()
		e.regs.Wait()
		e.mu.Lock()
		registered, lease, key, value, self := e.registered, e.lease, e.key, e.value, e.self
		lost := e.m.lost
		e.mu.Unlock()
		// A registry that failed (ErrEventOverflow) withdraws its record
		// too: its keepalive stopped with it, and its record would stay a
		// TTL. One whose client was closed cannot. One that reported its
		// record Lost tries as well, and says nothing of a failure: its
		// client gave the lease up after a TTL without etcd's answer, but
		// an etcd that comes back from a restart (or a lost quorum)
		// renews every lease it held for a TTL, record included, and the
		// rank reopened would wait that TTL behind its own dead record.
		// (A record deleted or taken over is left alone: the withdrawal
		// marks the key only while it holds this registry's value.)
		if registered && lease != 0 && e.cli.Ctx().Err() == nil {
			if werr := e.leave(self, key, value, lease); !lost {
				err = werr
			}
		}
		e.shut()
	})
	return err
}

func (e *Etcd) leave(self Record, key string, value []byte, lease clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.dialTimeout)
	defer cancel()
	var errs []error
	if leaving, err := self.encode(stateLeaving); err == nil {
		_, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", string(value))).
			Then(clientv3.OpPut(key, string(leaving), clientv3.WithLease(lease))).Commit()
		if err != nil {
			errs = append(errs, fmt.Errorf("discovery: etcd: marking %s leaving: %w", key, err))
		}
	}
	if _, err := e.cli.Revoke(ctx, lease); err != nil {
		errs = append(errs, fmt.Errorf("discovery: etcd: revoking the lease of %s: %w", key, err))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrNotWithdrawn, errors.Join(errs...))
}

func (e *Etcd) shut() {
	e.cancel()
	e.wg.Wait()
	e.q.close()
	if e.ownCli {
		_ = e.cli.Close()
		e.cliCancel()
	}
}

// incKeyLast orders a revision's events: 0 for an incarnation key, 1 for
// anything else.
func incKeyLast(key []byte) int {
	if bytes.HasSuffix(key, []byte(IncarnationSuffix)) {
		return 0
	}
	return 1
}
