package discovery

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
