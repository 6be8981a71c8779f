package zmq

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// A peer incarnation that said goodbye stays gone after a full directory
// forgot the peer to make room (forgetDownPeerLocked): its late Hello (a
// Conn's, which left its backlog after the goodbye) does not bring it
// back, as before the directory forgot it. The listener forgot the
// goodbye with the peer (liveness.forget), and the late Hello was taken
// as a live peer's: Link.Hello answered it, OnHello was called.
// (Checked to fail: without the goodbyes kept at forget, the late Hello
// made gen1/0 alive again.)
func TestGoodbyeOutlivesAFullDirectory(t *testing.T) {
	old := maxPeers
	maxPeers = 2
	t.Cleanup(func() { maxPeers = old })
	clock := &fakeClock{}
	clock.advance(time.Hour)
	s := bareListener(t, clock)
	hellos := 0
	s.l.cfg.OnHello = func(*messages.Hello) { hellos++ }
	say := func(conn string, p messages.PeerID, inc uint64) {
		t.Helper()
		s.handle(conn, mustEncode(t, incHello(p, inc)), "", 1)
	}
	a, b, c := pid("gen1", 0), pid("gen2", 0), pid("gen3", 0)
	say("a1", a, 1)
	s.handle("a1", mustEncode(t, &messages.Heartbeat{From: a, Seq: 1, FromIncarnation: 1, Leaving: true}), "", 1)
	s.goodbyes()
	if _, err := s.l.Hello(a); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("gen1/0 after its goodbye: %v, want ErrPeerClosed", err)
	}
	say("b1", b, 1)
	say("c1", c, 1) // the directory is full: gen1/0, down, goes
	if _, err := s.l.Hello(c); err != nil {
		t.Fatalf("gen3/0's Hello in a full directory: %v", err)
	}
	s.l.mu.Lock()
	forgot := s.l.peers[a] == nil
	s.l.mu.Unlock()
	if !forgot {
		t.Fatal("the full directory did not forget gen1/0: the test does not show it")
	}
	s.l.RemovePeer(b) // room for gen1/0 again
	hellos = 0
	say("a2", a, 1) // incarnation 1's late Hello
	if h, err := s.l.Hello(a); err == nil || hellos != 0 {
		t.Fatalf("gen1/0's late Hello after its goodbye: Hello %v (%v), OnHello %d times; want it gone, none", h, err, hellos)
	} else if !errors.Is(err, control.ErrPeerGone) {
		t.Fatalf("gen1/0's late Hello after its goodbye: %v, want ErrPeerGone", err)
	}
	// A new incarnation is welcome; the old one's late Hello does not
	// take the name back from it.
	say("a3", a, 2)
	say("a4", a, 1)
	if h, err := s.l.Hello(a); err != nil || h.Incarnation != 2 {
		t.Fatalf("gen1/0 after incarnation 2's Hello and 1's: %+v (%v), want incarnation 2", h, err)
	}
}
