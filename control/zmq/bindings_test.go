package zmq

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// bareListener is a listener's state without its sockets: a test hands it
// messages with handle, on its own goroutine, as the listener goroutine
// would, and reads what it remembers.
func bareListener(t *testing.T, clock *fakeClock) *listener {
	t.Helper()
	l, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: time.Second, HeartbeatMisses: 3,
		Clock: clock.now, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	self := pid("ctx", 0)
	l.mu.Lock()
	l.self = helloOf(self, "self")
	l.mu.Unlock()
	return &listener{l: l, self: self, deliver: func(messages.Frame) {}, conns: map[string]*binding{}, live: newLiveness(l.liveTimeout())}
}

// A peer the full directory forgot (down, known only from its Hello) no
// longer holds its connections' bindings once the listener needs room:
// before, forgetDownConns freed only the bindings of peers liveness still
// tracked as down, and a forgotten peer is not tracked at all, so with
// names that come and go (restarted pods under new names) the bindings of
// forgotten peers filled maxConns for good and every new connection's
// Hello was refused (full). Nor did the listener forget when it last
// told OnPeerAlive about a forgotten peer: that table grew with every
// name ever heard.
func TestForgottenPeersFreeTheirConnections(t *testing.T) {
	oldPeers, oldConns := maxPeers, maxConns
	maxPeers, maxConns = 1, 3
	t.Cleanup(func() { maxPeers, maxConns = oldPeers, oldConns })
	clock := &fakeClock{}
	clock.advance(time.Hour)
	s := bareListener(t, clock)
	s.l.cfg.OnPeerAlive = func(messages.PeerID) {}
	hello := func(conn string, id messages.PeerID) {
		t.Helper()
		before := s.l.Rejected()
		s.handle(conn, mustEncode(t, helloOf(id, conn)), "", 1)
		if n := s.l.Rejected(); n != before {
			t.Fatalf("Hello as %s on connection %s rejected (%+v)", id, conn, s.l.Stats().Rejected)
		}
	}
	// gen/1 says Hello on two connections, then falls silent.
	hello("a1", pid("gen", 1))
	hello("a2", pid("gen", 1))
	clock.advance(time.Hour)
	// gen/2 takes gen/1's place in the full directory; gen/1's two
	// bindings stay (its connections' last frames are still delivered).
	hello("b1", pid("gen", 2))
	if _, err := s.l.Hello(pid("gen", 1)); err == nil {
		t.Fatal("gen/1 is still in the directory")
	}
	// Nor does the listener remember gen/1 elsewhere: each name ever
	// heard would stay.
	if _, ok := s.told[pid("gen", 1)]; ok || s.live.tracks(pid("gen", 1)) {
		t.Fatal("the listener still remembers forgotten gen/1 (OnPeerAlive's table, liveness)")
	}
	// gen/2's second connection needs room: gen/1's bindings make it.
	hello("b2", pid("gen", 2))
	if len(s.conns) > maxConns {
		t.Fatalf("%d bindings, want at most %d", len(s.conns), maxConns)
	}
	for _, c := range []string{"a1", "a2"} {
		if s.conns[c] != nil {
			t.Fatalf("connection %s of forgotten gen/1 still bound while room was needed", c)
		}
	}
}

// A peer RemovePeer forgot (an etcd Down) is forgotten by the listener too
// once its silence has put it down: its liveness entry, and when
// OnPeerAlive was last told of it. Before, only a peer the full directory
// forgot was (forgetPeer); with RemovePeer the directory never fills, so
// with names that come and go (restarted pods under new names, each Down
// removed) every name ever heard stayed in liveness, walked at each expiry
// and each wait, and in OnPeerAlive's table: memory and work that grew
// for as long as the link lived.
func TestRemovedPeersAreForgottenOnceDown(t *testing.T) {
	clock := &fakeClock{}
	clock.advance(time.Hour)
	s := bareListener(t, clock)
	s.l.cfg.OnPeerAlive = func(messages.PeerID) {}
	downs := 0
	s.l.cfg.OnPeerDown = func(messages.PeerID) { downs++ }
	const names = 50
	for i := range names {
		id := pid(fmt.Sprintf("gen-%d", i), 0)
		conn := fmt.Sprintf("c%d", i)
		h := helloOf(id, conn)
		h.Incarnation = uint64(i + 1)
		s.handle(conn, mustEncode(t, h), "", 1)
		s.handle(conn, mustEncode(t, &messages.Heartbeat{From: id, Seq: 1}), "", 1)
		if !s.live.tracks(id) {
			t.Fatalf("%s not tracked after its Hello (%+v)", id, s.l.Stats().Rejected)
		}
		s.l.RemovePeer(id)
		clock.advance(time.Hour) // silence: it goes down
		s.live.expire(clock.now(), s.down)
	}
	if downs != names {
		t.Fatalf("OnPeerDown told %d times, want once for each of the %d removed names", downs, names)
	}
	if n := len(s.live.peers); n != 0 {
		t.Fatalf("liveness still tracks %d of %d names RemovePeer forgot, all down", n, names)
	}
	if n := len(s.told); n != 0 {
		t.Fatalf("OnPeerAlive's table still holds %d of %d names RemovePeer forgot, all down", n, names)
	}
	// A name said Hello again after its removal is a peer as any other.
	id := pid("gen-0", 0)
	h := helloOf(id, "again")
	h.Incarnation = 100
	s.handle("again", mustEncode(t, h), "", 1)
	if _, err := s.l.Hello(id); err != nil || !s.live.tracks(id) {
		t.Fatalf("gen-0/0 back after its removal: Hello %v, tracked %v", err, s.live.tracks(id))
	}
}

// A peer that restarts again and again while never down long enough (a
// crash loop under one name) does not fill maxConns with its superseded
// incarnations' bindings: once room is needed they go, and its newest
// incarnation's Hello, or another peer's, is taken. (Checked to fail:
// without forgetDownConns' superseded pass the third incarnation's Hello
// was refused, the table full of the first two's bindings.)
func TestSupersededIncarnationsFreeTheirConnections(t *testing.T) {
	oldConns := maxConns
	maxConns = 3
	t.Cleanup(func() { maxConns = oldConns })
	clock := &fakeClock{}
	clock.advance(time.Hour)
	s := bareListener(t, clock)
	hello := func(conn string, id messages.PeerID, inc uint64) {
		t.Helper()
		before := s.l.Rejected()
		h := helloOf(id, conn)
		h.Incarnation = inc
		s.handle(conn, mustEncode(t, h), "", 1)
		if n := s.l.Rejected(); n != before {
			t.Fatalf("Hello of incarnation %d of %s on connection %s rejected (%+v)", inc, id, conn, s.l.Stats().Rejected)
		}
	}
	gen := pid("gen", 1)
	hello("a1", gen, 1)
	hello("a2", gen, 1)
	hello("b1", gen, 2) // restarted: the table is full
	hello("c1", gen, 3) // restarted again, never down
	for _, c := range []string{"a1", "a2"} {
		if s.conns[c] != nil {
			t.Fatalf("connection %s of superseded incarnation 1 still bound while room was needed", c)
		}
	}
	if b := s.conns["c1"]; b == nil || b.inc != 3 {
		t.Fatalf("the newest incarnation's connection: %+v, want bound to incarnation 3", b)
	}
	if len(s.conns) > maxConns {
		t.Fatalf("%d bindings, want at most %d", len(s.conns), maxConns)
	}
	hello("d1", pid("gen", 2), 7) // another peer finds room too
}

// A name that went down before RemovePeer forgot it — the usual order: a
// crashed peer misses its heartbeats (3 s by default) before its etcd
// lease runs out (5 s), and a closing one's goodbye may come before the
// etcd Down — is forgotten by the listener too. Before, only a name that
// went down after its removal was (down): one already down was never told
// down again, and stayed in liveness, in OnPeerAlive's table and in every
// expiry walk for as long as the link lived, one entry per name ever
// heard. A removed name still up, and a down name the directory still
// holds, stay tracked.
func TestPeersRemovedOnceDownAreForgotten(t *testing.T) {
	clock := &fakeClock{}
	clock.advance(time.Hour)
	s := bareListener(t, clock)
	s.l.cfg.OnPeerAlive = func(messages.PeerID) {}
	const names = 20
	say := func(id messages.PeerID, conn string, inc uint64) {
		t.Helper()
		h := helloOf(id, conn)
		h.Incarnation = inc
		s.handle(conn, mustEncode(t, h), "", 1)
		s.handle(conn, mustEncode(t, &messages.Heartbeat{From: id, Seq: 1}), "", 1)
		if !s.live.tracks(id) {
			t.Fatalf("%s not tracked after its Hello (%+v)", id, s.l.Stats().Rejected)
		}
	}
	for i := range names {
		id := pid(fmt.Sprintf("gen-%d", i), 0)
		conn := fmt.Sprintf("c%d", i)
		say(id, conn, uint64(i+1))
		if i%2 == 0 {
			// A crash: silence puts it down, then etcd's Down removes it.
			clock.advance(time.Hour)
			s.live.expire(clock.now(), s.down)
		} else {
			// A close: its goodbye, then etcd's Down.
			s.handle(conn, mustEncode(t, &messages.Heartbeat{From: id, Seq: 2, FromIncarnation: uint64(i + 1), Leaving: true}), "", 1)
			s.goodbyes()
		}
		if !s.live.isDown(id) {
			t.Fatalf("%s not down", id)
		}
		s.l.RemovePeer(id)
		clock.advance(2 * time.Second)
		s.afterWait()
	}
	// A name down but still in the directory, and one removed but up.
	kept, up := pid("kept", 0), pid("up", 0)
	say(kept, "kept", 1)
	clock.advance(time.Hour)
	s.live.expire(clock.now(), s.down)
	say(up, "up", 1)
	s.l.RemovePeer(up)
	clock.advance(2 * time.Second)
	s.afterWait()
	if !s.live.tracks(kept) || !s.live.tracks(up) {
		t.Fatalf("kept tracked %v, up tracked %v: want both", s.live.tracks(kept), s.live.tracks(up))
	}
	if n := len(s.live.peers); n != 2 {
		t.Fatalf("liveness tracks %d names, want 2: the %d names removed once down are not forgotten", n, names)
	}
	if n := len(s.told); n != 2 {
		t.Fatalf("OnPeerAlive's table holds %d names, want 2", n)
	}
	// A forgotten name that says Hello again is a peer as any other.
	again := pid("gen-0", 0)
	say(again, "again", 100)
	if _, err := s.l.Hello(again); err != nil {
		t.Fatalf("gen-0/0 back after its removal: %v", err)
	}
}
