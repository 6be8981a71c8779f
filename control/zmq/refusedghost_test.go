package zmq

import (
	"testing"
	"time"
)

// A connection whose Hello was refused at a bound, and whose first frame
// came while the directory held another incarnation of the peer (a
// restarted peer whose old connections still counted, the new one's
// heartbeat Hello not taken yet), is bound at a later frame once the
// directory holds its incarnation and there is room: revive forgot the
// refused Hello at that first frame, and the connection's frames were
// refused (no_hello) for good, its Conn not saying Hello again. (Checked
// to fail: with revive forgetting the refused Hello at the first frame,
// c3's second Result was rejected, no_hello.) The first frame is held,
// not rejected (its sender took it as sent), and delivered first once
// the connection is bound. (Checked to fail without holding: the first
// Result was rejected, no_hello, and only the second came.)
func TestRefusedHelloOutlivesAnEarlyFrame(t *testing.T) {
	f := newBoundFixture(t, false, 1000, 2)
	f.probeRouter()
	gen := pid("gen", 0)
	f.mustHello("c1", gen, 1, "")
	f.mustHello("c2", gen, 1, "")
	for _, b := range f.s.conns {
		b.probedAt = time.Now() // just probed: a Hello finds no room
	}
	if f.hello("c3", gen, 2, "") {
		t.Fatal("incarnation 2's Hello on c3 taken past the bound: the test does not show the refusal")
	}
	// c3's first frame: the directory still holds incarnation 1.
	noHello := f.s.l.Stats().Rejected[RejectNoHello]
	f.s.handle("c3", mustEncode(t, result(gen, 1)), "", 1)
	if n := f.s.l.Stats().Rejected[RejectNoHello] - noHello; n != 0 || len(f.in.from(gen)) != 0 {
		t.Fatalf("c3's frame while the directory holds incarnation 1: %d rejected (no_hello), %d delivered; want 0, 0 (held)", n, len(f.in.from(gen)))
	}
	// Incarnation 2's Hello is taken on another connection, once a probe
	// may find c1 and c2 gone (they are: the ROUTER does not hold them).
	for _, b := range f.s.conns {
		b.probedAt = b.probedAt.Add(-2 * probeEvery)
	}
	f.mustHello("c4", gen, 2, "")
	f.s.handle("c3", mustEncode(t, result(gen, 2)), "", 1)
	if n := f.s.l.Stats().Rejected[RejectNoHello] - noHello; n != 0 || f.requests() != "[req-1 req-2]" {
		t.Fatalf("c3's frames once the directory holds incarnation 2: %d rejected (no_hello) in all, delivered %s; want 0, [req-1 req-2]", n, f.requests())
	}
	if b := f.s.conns["c3"]; b == nil || b.peer != gen || b.inc != 2 {
		t.Fatalf("c3 bound as %+v, want gen/0's incarnation 2", b)
	}
}
