package zmq

import (
	"fmt"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/messages"
)

// heldFixture is a bound fixture (gen/0 may hold 2 connections) where
// c1 and c2 are bound and were just probed, and c3's Hello came within
// the probe's second and was refused (full): the window in which a
// peer's new connection finds its closed ones still counted.
func heldFixture(t *testing.T) *boundFixture {
	f := newBoundFixture(t, false, 1000, 2)
	f.probeRouter()
	gen := pid("gen", 0)
	f.mustHello("c1", gen, 1, "")
	f.mustHello("c2", gen, 1, "")
	for _, b := range f.s.conns {
		b.probedAt = time.Now() // just probed: a Hello finds no room
	}
	if f.hello("c3", gen, 1, "") {
		t.Fatal("c3's Hello taken past the bound: the test does not show the window")
	}
	return f
}

// oldProbes makes every probe of f's bindings a second old: the next
// need of room probes them again, and finds c1 and c2 gone (the bare
// ROUTER holds no connection).
func oldProbes(f *boundFixture) {
	for _, b := range f.s.conns {
		b.probedAt = b.probedAt.Add(-2 * probeEvery)
	}
}

func (f *boundFixture) requests() string {
	var ids []string
	for _, fr := range f.in.from(pid("gen", 0)) {
		ids = append(ids, fr.Request())
	}
	return fmt.Sprint(ids)
}

// Frames on a connection whose Hello was refused at a bound, in the
// window before a probe can find the peer's closed connections gone, are
// held, in order, instead of rejected (full): their sender took them as
// sent (its Send returned nil) and never learns of a rejection, so a
// Result or Misaddressed rejected there left the peer's request to its
// deadline. Once a later frame finds room, the held frames are delivered
// first, in the order they came. (Checked to fail without holding: the
// two Results in the window were rejected, full, and only req-3 came.)
func TestFramesInTheBoundWindowAreHeld(t *testing.T) {
	f := heldFixture(t)
	gen := pid("gen", 0)
	full := f.s.l.Stats().Rejected[RejectFull]
	f.s.handle("c3", mustEncode(t, result(gen, 1)), "", 1)
	f.s.handle("c3", mustEncode(t, result(gen, 2)), "", 1)
	if n := f.s.l.Stats().Rejected[RejectFull] - full; n != 0 {
		t.Fatalf("%d frames in the window rejected (full), want them held", n)
	}
	if got := f.in.from(gen); len(got) != 0 {
		t.Fatalf("%d frames delivered before c3 is bound, want none yet", len(got))
	}
	oldProbes(f)
	f.s.handle("c3", mustEncode(t, result(gen, 3)), "", 1)
	if got := f.requests(); got != "[req-1 req-2 req-3]" {
		t.Fatalf("delivered %s, want [req-1 req-2 req-3] (held frames first, in order)", got)
	}
	if n := f.s.l.Stats().Rejected[RejectFull] - full; n != 0 {
		t.Fatalf("%d rejected (full), want 0", n)
	}
	if f.s.heldBytes != 0 {
		t.Fatalf("%d bytes still held once c3 is bound", f.s.heldBytes)
	}
}

// Held frames do not wait for a later frame on their connection: the
// listener tries their connection's room again after its waits
// (retryHeld), and delivers them once a probe finds room. The last frame
// a Conn sends (its last Result) has no later frame behind it.
func TestHeldFramesAreDeliveredWithoutALaterFrame(t *testing.T) {
	f := heldFixture(t)
	gen := pid("gen", 0)
	f.s.handle("c3", mustEncode(t, result(gen, 1)), "", 1)
	f.s.retryHeld()
	if got := f.in.from(gen); len(got) != 0 {
		t.Fatalf("%d frames delivered while there is no room", len(got))
	}
	oldProbes(f)
	f.s.retryHeld()
	if got := f.requests(); got != "[req-1]" {
		t.Fatalf("delivered %s once there is room, want [req-1]", got)
	}
	if b := f.s.conns["c3"]; b == nil || b.peer != gen {
		t.Fatalf("c3 bound as %+v, want gen/0", b)
	}
}

// Held frames are bounded, per connection (maxHeldPerConn) and in all
// (maxHeldBytes): past that a frame is rejected (full) as before, and
// counted; those held still arrive, in order.
func TestHeldFramesAreBounded(t *testing.T) {
	old := maxHeldPerConn
	maxHeldPerConn = 2
	t.Cleanup(func() { maxHeldPerConn = old })
	f := heldFixture(t)
	gen := pid("gen", 0)
	full := f.s.l.Stats().Rejected[RejectFull]
	for i := 1; i <= 3; i++ {
		f.s.handle("c3", mustEncode(t, result(gen, i)), "", 1)
	}
	if n := f.s.l.Stats().Rejected[RejectFull] - full; n != 1 {
		t.Fatalf("%d rejected (full) past maxHeldPerConn, want 1", n)
	}
	oldProbes(f)
	f.s.retryHeld()
	if got := f.requests(); got != "[req-1 req-2]" {
		t.Fatalf("delivered %s, want [req-1 req-2]", got)
	}
}

// A RequestData addressed to an earlier incarnation of this listener, on
// a connection whose Hello was refused at a bound while the directory
// holds another incarnation of its sender, is answered now (delivered,
// for the engine to drop and answer Misaddressed), not held.
func TestMisaddressedOnAHeldConnectionIsNotHeld(t *testing.T) {
	f := newBoundFixture(t, false, 1000, 2)
	f.probeRouter()
	f.s.selfInc = 10
	gen := pid("gen", 0)
	f.mustHello("c1", gen, 1, "")
	f.mustHello("c2", gen, 1, "")
	for _, b := range f.s.conns {
		b.probedAt = time.Now()
	}
	if f.hello("c3", gen, 2, "") {
		t.Fatal("c3's Hello taken past the bound")
	}
	rd := requestData(gen, 1)
	rd.Incarnations = messages.Incarnations{FromIncarnation: 2, ToIncarnation: 5}
	rd.Features = messages.FeatureMisaddressed
	f.s.handle("c3", mustEncode(t, rd), "", 1)
	if got := f.in.from(gen); len(got) != 1 || len(f.s.ghosts["c3"].held) != 0 {
		t.Fatalf("a misaddressed RequestData on c3: %d delivered, %d held; want 1, 0", len(got), len(f.s.ghosts["c3"].held))
	}
}

// A frame held on a connection without binding came before its sender's
// goodbye, which the listener reads on another connection: the goodbye
// waits until the ROUTER is drained (goodbyes) so that the peer's last
// frames on its other connections are handled first, and a held frame
// is one of them. Its last Result (SUCCESS) must reach the engine before
// the drained goodbye's proof (OnPeerDrained), which fails every request
// still addressed to that incarnation: else a request the writer
// finished is failed instead of READY.
func TestHeldFramesComeBeforeTheSendersGoodbye(t *testing.T) {
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
	if len(f.s.ghosts["c3"].held) != 1 {
		t.Fatalf("the Result on c3 is not held (%d held): the test does not show the window", len(f.s.ghosts["c3"].held))
	}
	// The peer closes after draining: its goodbye on c1, read after the
	// Result; its closed connections then leave room.
	bye := &messages.Heartbeat{From: gen, Seq: 1, Leaving: true, Drained: true}
	f.s.handle("c1", mustEncode(t, bye), "", 1)
	oldProbes(f)
	f.s.afterWait()
	if got := fmt.Sprint(order); got != fmt.Sprintf("[req-1 drained %s/1]", gen) {
		t.Fatalf("handled %s, want the held Result before the drained goodbye: [req-1 drained %s/1]", got, gen)
	}
}

// A frame the listener holds (hold) ends the wait in which it came, so
// that its room is tried again (retryHeld) every heldRetryEvery: that
// wait's deadline was set with nothing held (up to idleWait, 30 s with
// heartbeats off), and a hold that probes nothing (the bindings in the
// way were probed less than probeEvery ago, or, here, the directory does
// not hold the refused Hello's incarnation yet) sends nothing that would
// end it. (Checked to fail without it: the wait went on to its deadline;
// end to end, TestClosedConnectionsLeaveRoom's Result, held behind its
// refused Hello, was neither delivered nor rejected in 10 s, about 1
// run in 100.)
func TestHeldFrameEndsTheListenersWait(t *testing.T) {
	f := newBoundFixture(t, false, 1000, 1)
	gen := pid("gen", 0)
	f.mustHello("c1", gen, 1, "")
	// No ROUTER yet: nothing is probed, c2's Hello (incarnation 2) is
	// refused at gen/0's bound.
	if f.hello("c2", gen, 2, "") {
		t.Fatal("c2's Hello taken past the bound")
	}
	f.probeRouter()
	d, err := f.s.l.zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeSocket(d) }) // before the ROUTER's, and the link's Close
	if err := d.SetIdentity("c2"); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect("inproc://probe-router-" + t.Name()); err != nil {
		t.Fatal(err)
	}
	w, err := newSockWait(f.s.router)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	type waited struct {
		timedOut bool
		err      error
	}
	done := make(chan waited, 1)
	go func() {
		timedOut, err := w.serve(time.Hour, f.s.drain)
		done <- waited{timedOut, err}
	}()
	r := result(gen, 1)
	r.FromIncarnation = 2
	if _, err := d.SendBytes(mustEncode(t, r), 0); err != nil {
		t.Fatal(err)
	}
	var got waited
	select {
	case got = <-done:
	case <-time.After(patience):
		w.interrupt()
		<-done
		t.Fatalf("the listener's wait went on for %v after it held c2's Result: its room is tried again only at the wait's deadline", patience)
	}
	if got.timedOut || got.err != nil {
		t.Fatalf("serve = %v, %v; want false, nil", got.timedOut, got.err)
	}
	if n := len(f.s.ghosts["c2"].held); n != 1 {
		t.Fatalf("%d frames held on c2, want its Result", n)
	}
}
