package zmq

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// A goodbye read in a batch that did not empty the ROUTER waits: the
// frames its sender sent before it, fair-queued on its other connections,
// may still be in the ROUTER, and are handled while the peer is alive. It
// is acted on once a read finds the ROUTER empty, or, while other
// connections keep the ROUTER busy, once it waited the heartbeat timeout.
// (Checked to fail: with afterWait acting on every goodbye after each
// wait, a full batch's goodbye took its peer down while 660 of the 900
// Results it sent before the goodbye still waited in the ROUTER.)
func TestGoodbyeWaitsWhileTheRouterIsBusy(t *testing.T) {
	f := newDepartedFixture(t)
	log := &goodbyeLog{}
	f.s.l.cfg.OnPeerGoodbye, f.s.l.cfg.OnPeerDown = log.goodbye, log.down
	var results []uint64
	f.s.deliver = func(fr messages.Frame) {
		if r, ok := fr.(*messages.Result); ok {
			if n, _ := log.counts(); n > 0 {
				t.Errorf("Result %d delivered after its sender was taken down by its goodbye", r.Epoch)
			}
			results = append(results, r.Epoch)
		}
	}
	busy := func() { // a wait that ended with a full batch
		f.s.timedOut, f.s.busy = false, true
		f.s.afterWait()
	}
	f.s.handle("c1", mustEncode(t, &messages.Heartbeat{From: f.peer, Seq: 1, FromIncarnation: 1, Leaving: true}), f.old.public, 1)
	busy()
	if n, _ := log.counts(); n != 0 {
		t.Fatal("a goodbye read in a full batch was acted on before the ROUTER was found empty")
	}
	// The Result the peer sent before its goodbye, read in the next batch.
	f.s.handle("c1", mustEncode(t, result(f.peer, 7)), f.old.public, 1)
	f.clock.advance(f.s.byeWaitMax() - time.Millisecond)
	busy()
	if n, _ := log.counts(); n != 0 {
		t.Fatal("a goodbye was acted on before its wait for the ROUTER ran out")
	}
	f.s.busy = false
	f.s.afterWait()
	if n, downs := log.counts(); n != 1 || downs != 0 || len(results) != 1 {
		t.Fatalf("after the ROUTER was found empty: %d goodbyes, %d downs, Results %v; want 1, 0 and [7]", n, downs, results)
	}

	// A busy ROUTER holds a goodbye back at most byeWaitMax.
	f.hello("c2", 2, f.old.public)
	f.s.handle("c2", mustEncode(t, &messages.Heartbeat{From: f.peer, Seq: 1, FromIncarnation: 2, Leaving: true}), f.old.public, 1)
	busy()
	if n, _ := log.counts(); n != 1 {
		t.Fatal("incarnation 2's goodbye was acted on in a full batch")
	}
	f.clock.advance(f.s.byeWaitMax())
	busy()
	if n, _ := log.counts(); n != 2 {
		t.Fatalf("incarnation 2's goodbye not acted on after waiting %v behind a busy ROUTER (%d goodbyes)", f.s.byeWaitMax(), n)
	}
}

// A listener held past the heartbeat timeout by a slow delivery reads the
// heartbeats that came meanwhile before it judges anyone silent: the
// peer, which beat all along, is not taken down. (Checked to fail: with
// the expiry run first after the wait's deadline, the peer was declared
// down once.)
func TestStalledListenerReadsWaitingBeatsBeforeExpiry(t *testing.T) {
	ctxID, genID := pid("ctx", 0), pid("gen", 0)
	const interval, misses = 50 * time.Millisecond, 10 // a 500 ms timeout
	var downs atomic.Int64
	cb := Config{Insecure: true, HeartbeatInterval: interval, HeartbeatMisses: misses,
		OnPeerDown: func(messages.PeerID) { downs.Add(1) }}
	gate := make(chan struct{})
	var once sync.Once
	var delivered atomic.Uint64 // the last Result's epoch
	deliver := func(f messages.Frame) {
		r, ok := f.(*messages.Result)
		if !ok {
			return
		}
		if r.Epoch == 1 {
			once.Do(func() { <-gate })
		}
		delivered.Store(r.Epoch)
	}
	cb.Bind, cb.Logger = "tcp://127.0.0.1:0", testLogger(t)
	b, err := New(cb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Listen(incHello(genID, 3), deliver); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	a := listenAs(t, incHello(ctxID, 7), Config{Insecure: true, HeartbeatInterval: interval, HeartbeatMisses: misses,
		Peers: map[messages.PeerID]string{genID: b.Endpoint()}}).link
	waitFor(t, patience, "ctx's Hello at gen", func() bool { _, err := b.Hello(ctxID); return err == nil })
	c, err := a.Dial(genID)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(result(ctxID, 1)); err != nil {
		t.Fatal(err)
	}
	// The stall itself is the scenario: gen's listener is held in the
	// delivery of Result 1 for twice the heartbeat timeout while ctx
	// beats every interval.
	<-time.After(2 * interval * misses)
	close(gate)
	if err := c.Send(result(ctxID, 2)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "Result 2 delivered", func() bool { return delivered.Load() == 2 })
	if n := downs.Load(); n != 0 {
		t.Fatalf("ctx/0, which beat every %v throughout, was declared down %d times after gen's listener stalled", interval, n)
	}
}
