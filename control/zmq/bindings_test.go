package zmq

import (
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
