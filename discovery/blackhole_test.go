package discovery

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// holeProxy forwards TCP connections to target until hole is set; from
// then on it forwards nothing and closes nothing, as an etcd member whose
// host froze or dropped off the network does (no FIN, no RST).
type holeProxy struct {
	l      net.Listener
	target string
	hole   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newHoleProxy(t *testing.T, target string) *holeProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{l: l, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *holeProxy) addr() string { return p.l.Addr().String() }

func (p *holeProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if p.hole.Load() {
			p.track(c) // accepted, never served
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c)
		p.track(u)
		p.wg.Add(2)
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

func (p *holeProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

// pipe copies until the hole opens; then it stops reading (the bytes in
// flight stay unread) and waits for close.
func (p *holeProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.hole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil || p.hole.Load() {
			if err == nil {
				_, _ = io.Copy(io.Discard, src) // swallow, answer nothing, until closed
			}
			return
		}
	}
}

func (p *holeProxy) close() {
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestEtcdWatchLeavesAFrozenMember: a registry whose connection to one
// etcd member goes silent (the member's host froze or dropped off the
// network: no FIN, no RST) moves to another member, its watch and its
// lease's keepalive with it, and sees what happens in the cluster. Its
// client sent no gRPC keepalive pings: nothing noticed the silent
// connection, its watch waited on it (a peer's arrival or departure was
// never seen) until the kernel gave up on the connection, many minutes
// later, while the other member answered all along.
//
// The member goes silent right after Register returns. Register waited
// for no renewal of its lease then: when etcd's reply to the first one
// had not come yet, the client gave the keepalive only its dial timeout
// + 1 s, and the rank was Lost (keepalive stopped) about 6 s later,
// despite its 60 s TTL. Register now returns only once the lease was
// renewed (TestEtcdRegisterWaitsForTheFirstRenewal), and the keepalive
// has its TTL to move to the other member.
func TestEtcdWatchLeavesAFrozenMember(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for gRPC keepalive to give up on a connection (over 10 s)")
	}
	direct := etcdEndpoints(t)[0]
	frozen := newHoleProxy(t, direct)
	cluster := clusterName(t)
	r, err := NewEtcd(ctxFor(t, 10*time.Second), []string{frozen.addr()}, cluster, WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if err := r.Register(ctxFor(t, 10*time.Second), testRecord("gen", 0, 1)); err != nil {
		t.Fatal(err)
	}
	// Every stream runs over the one connection to the frozen member;
	// now a second member is known too.
	r.cli.SetEndpoints(frozen.addr(), newHoleProxy(t, direct).addr())
	frozen.hole.Store(true)

	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("ctx", 0, 7), lease.ID)
	ev := waitEvent(t, r, time.Minute, "ctx/0 up past the frozen member", func(e Event) bool {
		return e.Kind == EventUp || e.Kind == EventLost
	})
	if ev.Kind != EventUp || ev.Record.Incarnation != 7 {
		t.Fatalf("got %v, want UP ctx/0#7", ev)
	}
}

// TestEtcdRegisterEndsWithItsLease: a Register waiting for an older
// incarnation to go ends, with an error that says so, once etcd stops
// answering for the TTL of its own lease: the lease is gone and the
// registration can never complete. It waited on for as long as its
// caller let it (kvxfer gen hung after logging that its membership was
// lost, until interrupted).
func TestEtcdRegisterEndsWithItsLease(t *testing.T) {
	direct := etcdEndpoints(t)[0]
	p := newHoleProxy(t, direct)
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("gen", 0, 1), lease.ID) // a live holder
	held := make(chan Record, 1)
	r, err := NewEtcd(ctxFor(t, 10*time.Second), []string{p.addr()}, cluster, WithTTL(time.Second),
		WithDialTimeout(time.Second), WithOnHeld(func(h Record) {
			select {
			case held <- h:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx := ctxFor(t, 5*time.Minute)
	done := make(chan error, 1)
	go func() { done <- r.Register(ctx, testRecord("gen", 0, 2)) }()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("Register returned %v before waiting for the holder", err)
	case <-time.After(waitFor):
		t.Fatal("Register did not find the holder")
	}
	p.hole.Store(true) // etcd stops answering
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("Register still waits, two minutes after etcd stopped answering (its lease's TTL is 1 s)")
	}
	if err == nil || ctx.Err() != nil || errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "lease") ||
		!strings.Contains(err.Error(), Key(cluster, "gen", 0)) {
		t.Fatalf("Register: %v (its context: %v), want an error naming the key and the end of its lease", err, ctx.Err())
	}
	t.Logf("Register: %v", err)
}

// TestEtcdRegisterBoundsItsLeaseGrant: a Register that finds etcd no
// longer answering when it asks for its lease fails within the dial
// timeout, naming the key. It waited for as long as its caller let it:
// no lease yet, so no keepalive to end it.
func TestEtcdRegisterBoundsItsLeaseGrant(t *testing.T) {
	p := newHoleProxy(t, etcdEndpoints(t)[0])
	r, err := NewEtcd(ctxFor(t, 10*time.Second), []string{p.addr()}, clusterName(t), WithTTL(time.Second), WithDialTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	p.hole.Store(true) // etcd stops answering
	ctx := ctxFor(t, 5*time.Minute)
	done := make(chan error, 1)
	go func() { done <- r.Register(ctx, testRecord("gen", 0, 1)) }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("Register still waits for its lease, two minutes after etcd stopped answering (dial timeout 1 s)")
	}
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "lease") || !strings.Contains(err.Error(), Key(r.cluster, "gen", 0)) {
		t.Fatalf("Register: %v (its context: %v), want an error naming the key and its lease", err, ctx.Err())
	}
	t.Logf("Register: %v", err)
}

// silentLease answers nothing on the keepalives it hands out, as an etcd
// that stopped answering just after it granted the lease does: the
// channel stays open and empty until its context ends; with reaped, it
// closes at once without a reply, as the client does with a keepalive
// that had no reply within its first keepalive timeout. The lease is
// never renewed. kept receives the id of each lease given a keepalive.
type silentLease struct {
	clientv3.Lease
	reaped bool
	kept   chan clientv3.LeaseID
}

func (l *silentLease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	select {
	case l.kept <- id:
	default:
	}
	out := make(chan *clientv3.LeaseKeepAliveResponse)
	if l.reaped {
		close(out)
		return out, nil
	}
	go func() {
		<-ctx.Done()
		close(out)
	}()
	return out, nil
}

// TestEtcdRegisterWaitsForTheFirstRenewal: Register returns nil only once
// etcd has renewed its lease once; a lease whose keepalive has no reply
// within the dial timeout (or whose keepalive the client gives up before
// any reply) fails the Register, naming the key, leaves no record and no
// lease, and no Lost is delivered. Register returned nil as soon as its
// record was written, with no renewal yet: the client gives a keepalive
// that never had a reply only its dial timeout + 1 s, not the TTL, so a
// rank registered with a 60 s TTL whose etcd went silent just then was
// Lost about 6 s later (TestEtcdWatchLeavesAFrozenMember failed so).
func TestEtcdRegisterWaitsForTheFirstRenewal(t *testing.T) {
	for _, reaped := range []bool{false, true} {
		name := "silent"
		if reaped {
			name = "reaped"
		}
		t.Run(name, func(t *testing.T) {
			cluster := clusterName(t)
			cli := newClient(t)
			defer cli.Close()
			sl := &silentLease{Lease: cli.Lease, reaped: reaped, kept: make(chan clientv3.LeaseID, 1)}
			cli.Lease = sl
			r, err := NewEtcd(ctxFor(t, 10*time.Second), nil, cluster, WithClient(cli), WithTTL(time.Minute),
				WithDialTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var evs []Event
			read := make(chan struct{})
			go func() {
				defer close(read)
				for ev := range r.Events() {
					evs = append(evs, ev)
				}
			}()
			closed := false
			t.Cleanup(func() {
				if !closed {
					_ = r.Close()
					<-read
				}
			})
			ctx := ctxFor(t, 5*time.Minute)
			key := Key(cluster, "gen", 0)
			err = r.Register(ctx, testRecord("gen", 0, 1))
			if err == nil || ctx.Err() != nil || errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "keepalive") ||
				!strings.Contains(err.Error(), key) {
				t.Fatalf("Register with no renewal of its lease: %v (its context: %v), want an error naming the key and its keepalive", err, ctx.Err())
			}
			t.Logf("Register: %v", err)
			g, err := cli.Get(ctxFor(t, 10*time.Second), key)
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Kvs) != 0 {
				t.Errorf("after the failed Register: %s = %s, want no record", key, g.Kvs[0].Value)
			}
			lease := receive(t, sl.kept, waitFor, "the keepalive of Register's lease")
			ttl, err := cli.TimeToLive(ctxFor(t, 10*time.Second), lease)
			if err != nil {
				t.Fatal(err)
			}
			if ttl.TTL != -1 {
				t.Errorf("after the failed Register: its lease %x has %d s to live, want it revoked", lease, ttl.TTL)
			}
			closed = true
			_ = r.Close()
			<-read
			for _, ev := range evs {
				if ev.Kind == EventLost {
					t.Errorf("%v after Register failed with %v: want no Lost for a registration that never completed", ev, err)
				}
			}
		})
	}
}

// TestEtcdRegisterEndedIsNoLost: a Register whose lease ends before it
// completes (it waited for an older holder while etcd stopped answering)
// fails, and no Lost is delivered: nothing was registered, so nothing was
// lost, and the caller already has Register's error. A Lost came as well
// (the keepalive's end reported this rank's membership lost), so that a
// node both failed to start and logged its membership lost.
func TestEtcdRegisterEndedIsNoLost(t *testing.T) {
	p := newHoleProxy(t, etcdEndpoints(t)[0])
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("gen", 0, 1), lease.ID) // a live holder
	held := make(chan struct{}, 1)
	r, err := NewEtcd(ctxFor(t, 10*time.Second), []string{p.addr()}, cluster, WithTTL(time.Second),
		WithDialTimeout(time.Second), WithOnHeld(func(Record) {
			select {
			case held <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	read := make(chan struct{})
	go func() {
		defer close(read)
		for ev := range r.Events() {
			evs = append(evs, ev)
		}
	}()
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = r.Close()
			<-read
		}
	})
	ctx := ctxFor(t, 5*time.Minute)
	done := make(chan error, 1)
	go func() { done <- r.Register(ctx, testRecord("gen", 0, 2)) }()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("Register returned %v before waiting for the holder", err)
	case <-time.After(waitFor):
		t.Fatal("Register did not find the holder")
	}
	p.hole.Store(true) // etcd stops answering: the lease ends
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("Register still waits, two minutes after etcd stopped answering (its lease's TTL is 1 s)")
	}
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Register: %v (its context: %v), want the end of its lease", err, ctx.Err())
	}
	// Close waits for the keepalive goroutine: a Lost it pushed (as it did
	// when its lease ended, about a second before Register returned:
	// Register's revoke waits its dial timeout on the silent etcd) has
	// been read by then.
	closed = true
	_ = r.Close()
	<-read
	for _, ev := range evs {
		if ev.Kind == EventLost {
			t.Errorf("%v after Register failed with %v: want no Lost for a registration that never completed", ev, err)
		}
	}
}
