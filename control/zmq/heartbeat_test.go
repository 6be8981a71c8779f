package zmq

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// downLog records OnPeerDown calls.
type downLog struct {
	mu    sync.Mutex
	peers []messages.PeerID
	at    []time.Time
}

func (d *downLog) record(p messages.PeerID) {
	d.mu.Lock()
	d.peers = append(d.peers, p)
	d.at = append(d.at, time.Now())
	d.mu.Unlock()
}

func (d *downLog) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.peers)
}

func (d *downLog) get(i int) (messages.PeerID, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peers[i], d.at[i]
}

// Stopping a link makes its peer's OnPeerDown fire, once; it fires again
// only after the peer came back and went silent again. How soon it fires
// is logged, not asserted (tests do not time the machine):
// TestInjectedClockDrivesPeerDown checks the timing rule on a fake clock.
func TestHeartbeatPeerDown(t *testing.T) {
	const (
		interval = 50 * time.Millisecond
		misses   = 5 // a live peer must stall 250 ms to be declared dead
		bound    = interval * (misses + 2)
	)
	downs := &downLog{}
	a := listen(t, pid("ctx", 0), Config{Insecure: true, HeartbeatInterval: interval, HeartbeatMisses: misses, OnPeerDown: downs.record})
	bID := pid("gen", 0)
	startB := func(agent string) *Link {
		l, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: interval, HeartbeatMisses: misses,
			Peers: map[messages.PeerID]string{a.id: a.link.Endpoint()}, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Listen(helloOf(bID, agent), func(messages.Frame) {}); err != nil {
			l.Close()
			t.Fatal(err)
		}
		if err := a.link.AddPeer(bID, l.Endpoint()); err != nil {
			t.Fatal(err)
		}
		return l
	}
	helloIs := func(agent string) func() bool {
		return func() bool {
			h, err := a.link.Hello(bID)
			return err == nil && string(h.AgentAddr) == "agent-"+agent
		}
	}

	b1 := startB("1")
	waitFor(t, patience, "b's first Hello", helloIs("1"))
	if n := downs.count(); n != 0 {
		t.Fatalf("OnPeerDown fired %d times while b was alive", n)
	}
	stopped := time.Now()
	b1.Close()
	waitFor(t, patience, "OnPeerDown", func() bool { return downs.count() == 1 })
	p, at := downs.get(0)
	if p != bID {
		t.Fatalf("OnPeerDown(%s), want %s", p, bID)
	}
	took := at.Sub(stopped)
	t.Logf("OnPeerDown %v after b stopped (interval×(misses+2) = %v)", took, bound)
	if _, err := a.link.Hello(bID); !errors.Is(err, control.ErrPeerGone) {
		t.Fatalf("Hello of a down peer: %v, want ErrPeerGone", err)
	}

	// b comes back (a new incarnation), then stops again.
	b2 := startB("2")
	defer b2.Close()
	waitFor(t, patience, "b's second Hello", helloIs("2"))
	if n := downs.count(); n != 1 {
		t.Fatalf("OnPeerDown fired %d times, want still 1 after b came back", n)
	}
	b2.Close()
	waitFor(t, patience, "the second OnPeerDown", func() bool { return downs.count() == 2 })
	if p, _ := downs.get(1); p != bID {
		t.Fatalf("second OnPeerDown(%s), want %s", p, bID)
	}
}

// Heartbeats alone introduce a link to the peers in its directory.
func TestHeartbeatSaysHello(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			a, b := pair(t, secure, Config{HeartbeatInterval: 10 * time.Millisecond, HeartbeatMisses: 1000})
			waitFor(t, patience, "Hellos both ways", func() bool {
				_, errA := a.link.Hello(b.id)
				_, errB := b.link.Hello(a.id)
				return errA == nil && errB == nil
			})
			if a.in.len()+b.in.len() != 0 {
				t.Fatal("a Hello or Heartbeat was delivered as a frame")
			}
			if r := a.link.Rejected() + b.link.Rejected(); r != 0 {
				t.Fatalf("%d heartbeat frames rejected", r)
			}
		})
	}
}

// fakeClock is a Config.Clock a test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// The listener judges silence by the injected clock, not the wall clock:
// with a one-hour interval, moving the clock three hours makes a peer that
// said Hello down at the next poll.
func TestInjectedClockDrivesPeerDown(t *testing.T) {
	clock := &fakeClock{}
	clock.advance(time.Hour)
	downs := &downLog{}
	a := listen(t, pid("ctx", 0), Config{Insecure: true, HeartbeatInterval: time.Hour, HeartbeatMisses: 3,
		Clock: clock.now, OnPeerDown: downs.record})
	b := listen(t, pid("gen", 0), Config{Insecure: true})
	introduce(t, b, a)
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, patience, "b's Hello", func() bool { _, err := a.link.Hello(b.id); return err == nil })
	clock.advance(3*time.Hour - time.Nanosecond)
	// A frame after the move proves the listener has polled since; still alive.
	if err := conn.Send(result(b.id, 0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "a frame", func() bool { return a.in.len() == 1 })
	if n := downs.count(); n != 0 {
		t.Fatalf("down after less than misses×interval of (fake) silence: %d", n)
	}
	clock.advance(3 * time.Hour)
	waitFor(t, patience, "OnPeerDown on the fake clock", func() bool { return downs.count() == 1 })
	if p, _ := downs.get(0); p != b.id {
		t.Fatalf("OnPeerDown(%s), want %s", p, b.id)
	}
	// Any frame is a sign of life: b is back, Hello works again.
	if err := conn.Send(result(b.id, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "b back", func() bool { _, err := a.link.Hello(b.id); return err == nil })
}

// Close does not wait out the listener's and the ZAP handler's long idle
// waits (idleWait: an idle link with an hour's heartbeat waits that long
// between wakes): it interrupts them; with CURVE both waits are idle,
// the ZAP handler's after the handshake it answered. (Checked to fail:
// with stopListening's interrupts removed, Close takes idleWait; with the
// ZAP handler's alone removed, the curve case does.)
func TestCloseInterruptsIdleWaits(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			a, b := pair(t, secure, Config{HeartbeatInterval: time.Hour})
			conn, err := b.link.Dial(a.id)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// A frame handled (after its connection's handshake, with
			// CURVE): a's listener and ZAP handler are back in their
			// waits, idle.
			if err := conn.Send(result(b.id, 0)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, patience, "the frame", func() bool { return a.in.len() == 1 })
			closed := make(chan error, 1)
			go func() { closed <- a.link.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(patience):
				t.Fatalf("Close still waiting after %v (idle waits are %v)", patience, idleWait)
			}
		})
	}
}

// Closing the Listener stops the link's goroutines; the link still closes.
func TestListenerCloseStopsGoroutines(t *testing.T) {
	before := goleak.IgnoreCurrent()
	l, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: 10 * time.Millisecond,
		Peers: map[messages.PeerID]string{pid("gen", 0): "tcp://127.0.0.1:1"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := l.Listen(helloOf(pid("ctx", 0), "1"), func(messages.Frame) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// Issue 17: OnHello gets a peer's Hello when it binds a connection, and
// OnPeerAlive is called on the peer's frames at most once per heartbeat
// interval (by the link's clock): twenty frames in one interval make one
// call, the next interval's frame another.
func TestOnHelloAndRateLimitedOnPeerAlive(t *testing.T) {
	clock := &fakeClock{}
	clock.advance(time.Hour)
	var mu sync.Mutex
	var hellos []*messages.Hello
	var alive []messages.PeerID
	a := listen(t, pid("gen", 0), Config{Insecure: true, HeartbeatInterval: time.Hour, HeartbeatMisses: 1000, Clock: clock.now,
		OnHello: func(h *messages.Hello) { mu.Lock(); hellos = append(hellos, h); mu.Unlock() },
		OnPeerAlive: func(p messages.PeerID) {
			mu.Lock()
			alive = append(alive, p)
			mu.Unlock()
		}})
	b := listen(t, pid("ctx", 0), Config{Insecure: true})
	introduce(t, b, a)
	c, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(from, to int) {
		for i := from; i < to; i++ {
			if err := c.Send(terminalOf(b.id, i)); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, patience, "the frames", func() bool { return a.in.len() == to })
	}
	send(0, 20)
	mu.Lock()
	if len(hellos) != 1 || hellos[0].From != b.id {
		t.Errorf("OnHello got %d Hellos, want b's one", len(hellos))
	}
	if len(alive) != 1 || alive[0] != b.id {
		t.Errorf("OnPeerAlive calls in one interval: %v, want one for %s", alive, b.id)
	}
	mu.Unlock()
	clock.advance(time.Hour)
	send(20, 21)
	mu.Lock()
	defer mu.Unlock()
	if len(alive) != 2 {
		t.Errorf("OnPeerAlive calls after the next interval's frame: %d, want 2", len(alive))
	}
}

// OnFrame sees each of a peer's frames once, before it is delivered, and
// not its Hello or heartbeats (node checks a writer's mappings on it
// before the engine hears the writer's Result).
func TestOnFrameBeforeDelivery(t *testing.T) {
	in := &inbox{}
	var mu sync.Mutex
	var seen []messages.Frame
	var deliveredBefore []int
	id := pid("gen", 0)
	la := listenWith(t, id, Config{Insecure: true, HeartbeatInterval: 10 * time.Millisecond, HeartbeatMisses: 1000,
		OnFrame: func(f messages.Frame) {
			mu.Lock()
			seen = append(seen, f)
			deliveredBefore = append(deliveredBefore, in.len())
			mu.Unlock()
		}}, in.deliver)
	a := &node{id: id, link: la, in: in}
	b := listen(t, pid("ctx", 0), Config{Insecure: true, HeartbeatInterval: 10 * time.Millisecond, HeartbeatMisses: 1000})
	introduce(t, b, a)
	c, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 20
	for i := 0; i < n; i++ {
		if err := c.Send(terminalOf(b.id, i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, patience, "the frames", func() bool { return a.in.len() == n })
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("OnFrame saw %d frames, want the %d sent (no Hello, no heartbeat)", len(seen), n)
	}
	for i, f := range seen {
		if f.Request() != in.snapshot()[i].Request() || deliveredBefore[i] != i {
			t.Errorf("frame %d (%s): OnFrame with %d frames delivered, want %d", i, f.Request(), deliveredBefore[i], i)
		}
	}
}
