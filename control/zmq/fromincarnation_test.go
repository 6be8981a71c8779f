package zmq

import (
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// A connection's frames come from the incarnation its Hello named: a frame
// on it that claims another incarnation of the sender (FromIncarnation) is
// rejected, and one that names none is taken as that Hello's. Before, the
// listener bound a connection to its Hello's incarnation for heartbeats
// only, and passed on whatever incarnation a frame claimed: a departed
// incarnation (RemovePeer; its key, rotated away, may still speak for the
// name for its last frames) could send, on its old connection, a CancelAck
// or Result stamped with the new incarnation's number (or with none, which
// an engine takes from any incarnation), and the generation side took it
// as the new incarnation's proof that its writes were over.
func TestFrameIncarnationIsItsConnections(t *testing.T) {
	f := newDepartedFixture(t)
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	f.s.l.RemovePeer(f.peer) // etcd's Down of incarnation 1
	next := newKeys(t)
	f.add(next.public) // etcd's Up of incarnation 2, with a new key
	f.hello("c2", 2, next.public)
	if inc := f.current(); inc != 2 {
		t.Fatalf("gen/0's Hello: incarnation %d, want 2 (%+v)", inc, f.s.l.Stats().Rejected)
	}
	stamped := func(fr messages.Frame, from uint64) messages.Frame {
		in := messages.Incarnations{FromIncarnation: from}
		switch m := fr.(type) {
		case *messages.Result:
			m.Incarnations = in
		case *messages.CancelAck:
			m.Incarnations = in
		case *messages.Cancel:
			m.Incarnations = in
		case *messages.RequestData:
			m.Incarnations = in
		}
		return fr
	}
	before := f.rejected(RejectSender)
	// Incarnation 1, on its own connection, claims to be incarnation 2.
	for i := 0; i < 4; i++ {
		f.s.handle("c1", mustEncode(t, stamped(frameOf(f.peer, i), 2)), f.old.public, 1)
	}
	if len(got) != 0 {
		t.Fatalf("%d frames of incarnation 1's connection claiming incarnation 2 delivered: %+v", len(got), got[0])
	}
	if n := f.rejected(RejectSender) - before; n != 4 {
		t.Fatalf("%d of 4 frames claiming another incarnation rejected (sender) (%+v)", n, f.s.l.Stats().Rejected)
	}
	// Its own last Result, stamped or not, is delivered as incarnation 1's.
	f.s.handle("c1", mustEncode(t, stamped(result(f.peer, 7), 1)), f.old.public, 1)
	f.s.handle("c1", mustEncode(t, stamped(result(f.peer, 8), 0)), f.old.public, 1)
	if len(got) != 2 {
		t.Fatalf("%d of incarnation 1's 2 last Results delivered (%+v)", len(got), f.s.l.Stats().Rejected)
	}
	for _, fr := range got {
		if inc := fr.(*messages.Result).FromIncarnation; inc != 1 {
			t.Fatalf("Result %s delivered from incarnation %d, want its connection's, 1", fr.Request(), inc)
		}
	}
	// The new incarnation's frames pass as they are.
	got = nil
	f.s.handle("c2", mustEncode(t, stamped(result(f.peer, 9), 2)), next.public, 1)
	if len(got) != 1 || got[0].(*messages.Result).FromIncarnation != 2 {
		t.Fatalf("incarnation 2's Result: delivered %+v", got)
	}
}

// A peer that predates incarnations (its Hello names none) is not held to
// one: its frames pass with whatever incarnations they carry, as before.
func TestFrameIncarnationOfAnOlderPeer(t *testing.T) {
	f := newDepartedFixture(t)
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	f.s.handle("c0", mustEncode(t, helloOf(f.peer, "old")), f.old.public, 1)
	r := result(f.peer, 1)
	r.FromIncarnation = 5
	f.s.handle("c0", mustEncode(t, r), f.old.public, 1)
	f.s.handle("c0", mustEncode(t, result(f.peer, 2)), f.old.public, 1)
	if len(got) != 2 || got[0].(*messages.Result).FromIncarnation != 5 || got[1].(*messages.Result).FromIncarnation != 0 {
		t.Fatalf("an older peer's Results: delivered %+v (%+v)", got, f.s.l.Stats().Rejected)
	}
}
