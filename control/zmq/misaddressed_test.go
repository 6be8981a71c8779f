package zmq

import (
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// A Misaddressed is held to its connection's incarnation as every frame
// is (ownIncarnation): it says which incarnation of the writer dropped a
// RequestData, and the generation side addresses the request to that one
// on its word, so a connection of one incarnation may not claim another
// (a departed process's, claiming its successor's: the request would be
// addressed to an incarnation that never got it, and answered by one
// that might). Checked: without the Misaddressed case in ownIncarnation
// the forged one is delivered.
func TestMisaddressedIncarnationIsItsConnections(t *testing.T) {
	f := newDepartedFixture(t)
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	f.s.l.RemovePeer(f.peer) // etcd's Down of incarnation 1
	next := newKeys(t)
	f.add(next.public) // etcd's Up of incarnation 2, with a new key
	f.hello("c2", 2, next.public)
	mis := func(by uint64) messages.Frame {
		return &messages.Misaddressed{RequestID: "r1", Epoch: 7, From: f.peer, Addressed: 1,
			Incarnations: messages.Incarnations{FromIncarnation: by, ToIncarnation: 5}}
	}
	before := f.rejected(RejectSender)
	// Incarnation 1's connection claims incarnation 2 dropped it.
	f.s.handle("c1", mustEncode(t, mis(2)), f.old.public, 1)
	if len(got) != 0 {
		t.Fatalf("a Misaddressed of incarnation 1's connection claiming incarnation 2 delivered: %+v", got[0])
	}
	if n := f.rejected(RejectSender) - before; n != 1 {
		t.Fatalf("%d of 1 Misaddressed claiming another incarnation rejected (sender) (%+v)", n, f.s.l.Stats().Rejected)
	}
	// Incarnation 2's own passes as it is.
	f.s.handle("c2", mustEncode(t, mis(2)), next.public, 1)
	if len(got) != 1 || got[0].(*messages.Misaddressed).FromIncarnation != 2 {
		t.Fatalf("incarnation 2's Misaddressed: delivered %+v", got)
	}
}
