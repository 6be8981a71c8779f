package kvxfer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// TestWriterRestartedInProcessIsAddressed: a context engine closed and
// started again with the same name (a framework restarting its engine in
// one process; or a rank restarted on another host: no exit proof either
// way) has a new incarnation, which drops every frame addressed to the
// old one. The generation engine, which had learnt the old incarnation
// from its first request, must address later requests to the new one
// (the link holds its Hello). Before, it asked for a writer's Hello only
// while it knew none: every request after the restart failed at its
// deadline, its session held and its blocks quarantined for good, and the
// generation engine's Close failed on sessions that never drained (found
// by a leak review: +1 actor and +7 quarantined blocks per request).
func TestWriterRestartedInProcessIsAddressed(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	gen := startOn(t, link, l, "gen")
	for i := range 3 {
		ctxE := startOn(t, link, l, "ctx") // the same name, a new incarnation each time
		c := &cluster{link: link, ctx: []*kvxfer.Engine{ctxE}, gen: []*kvxfer.Engine{gen}, ctxPar: tp1, genPar: tp1}
		transfer(t, c, l, fmt.Sprintf("after-restart-%d", i), i+1, 64, 32, true)
		closeWithin(t, ctxE, "ctx")
	}
	closeWithin(t, gen, "gen")
	if q := gen.Pools().Quarantined(); q != 0 {
		t.Errorf("%d blocks quarantined on the generation engine, want 0", q)
	}
}

// closeWithin closes e, failing t unless it drains within a minute.
func closeWithin(t *testing.T, e *kvxfer.Engine, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("close %s: %v", name, err)
	}
}

// countingLink is a Link that counts the connections open to each peer.
type countingLink struct {
	control.Link
	mu   sync.Mutex
	open map[messages.PeerID]int
}

func (l *countingLink) Dial(peer messages.PeerID) (control.Conn, error) {
	c, err := l.Link.Dial(peer)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.open[peer]++
	l.mu.Unlock()
	return &countedConn{Conn: c, l: l, peer: peer}, nil
}

func (l *countingLink) opened(peer messages.PeerID) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[peer]
}

type countedConn struct {
	control.Conn
	l    *countingLink
	peer messages.PeerID
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open[c.peer]--
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// TestPeerDownClosesTheWorkersConnections: a peer declared down (one
// that will never come back: an instance scaled away under etcd) keeps no
// connection of this engine's workers. Before, each worker kept its
// connection to every peer it had sent a frame to for the engine's life:
// over zmq a DEALER socket, redialling a dead endpoint (+1 descriptor per
// worker per departed peer; found by a leak review). A peer that comes
// back is dialled afresh (here the same name restarted).
func TestPeerDownClosesTheWorkersConnections(t *testing.T) {
	l := smallLayout()
	mem := control.NewMemLink()
	counted := &countingLink{Link: mem, open: map[messages.PeerID]int{}}
	start := func(inst string, link control.Link) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Parallel: tp1, Rank: tp1.RankAt(0),
			Layout: &l, PoolBytes: 4 << 20, Workers: 2, Link: link, TransferTimeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		return e
	}
	gen := start("gen", counted)
	defer closeWithin(t, gen, "gen")
	peer := messages.PeerID{Instance: "ctx"}
	for i := range 3 { // down, then back (a new incarnation), and down again
		name := fmt.Sprintf("ctx (incarnation %d)", i+1)
		ctxE := start("ctx", mem)
		c := &cluster{link: mem, ctx: []*kvxfer.Engine{ctxE}, gen: []*kvxfer.Engine{gen}, ctxPar: tp1, genPar: tp1}
		transfer(t, c, l, fmt.Sprintf("round-%d", i), i+1, 64, 32, true)
		if n := counted.opened(peer); n == 0 {
			t.Fatalf("no connection of gen's workers to %s after a transfer: the test sees nothing", name)
		}
		closeWithin(t, ctxE, name)
		gen.PeerDown(peer)
		deadline := time.Now().Add(time.Minute)
		for counted.opened(peer) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections of gen's workers to %s a minute after it was declared down, want 0", counted.opened(peer), name)
			}
			time.Sleep(5 * time.Millisecond) // poll with a deadline
		}
	}
}
