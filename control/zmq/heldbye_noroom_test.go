package zmq

import (
	"fmt"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// TestHeldFramesComeBeforeTheSendersGoodbyeWithoutRoom: as
// TestHeldFramesComeBeforeTheSendersGoodbye, but the peer's bound
// connections were probed just now, so there is no room for the held
// connection when the goodbye comes: the goodbye waits behind the held
// SUCCESS Result (else its drained proof would fail the request the
// writer finished), and is acted on once the Result was delivered.
func TestHeldFramesComeBeforeTheSendersGoodbyeWithoutRoom(t *testing.T) {
	f := heldFixture(t)
	gen := pid("gen", 0)
	var order []string
	f.s.deliver = func(fr messages.Frame) {
		f.in.deliver(fr)
		order = append(order, fr.Request())
	}
	f.s.l.cfg.OnPeerDrained = func(p messages.PeerID, inc uint64) {
		order = append(order, fmt.Sprintf("drained %s/%d", p, inc))
	}
	f.s.handle("c3", mustEncode(t, result(gen, 1)), "", 1) // held: no room for c3
	bye := &messages.Heartbeat{From: gen, Seq: 1, Leaving: true, Drained: true}
	f.s.handle("c1", mustEncode(t, bye), "", 1)
	f.s.afterWait()
	if len(order) != 0 {
		t.Fatalf("handled %v while the Result is held without room, want nothing yet (the goodbye waits behind it)", order)
	}
	oldProbes(f)
	f.s.afterWait()
	if got := fmt.Sprint(order); got != fmt.Sprintf("[req-1 drained %s/1]", gen) {
		t.Fatalf("handled %s, want the held Result before the drained goodbye: [req-1 drained %s/1]", got, gen)
	}
}
