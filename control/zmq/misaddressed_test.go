package zmq

import (
	"path/filepath"
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

// The crash-restart window over zmq: a generation rank's DEALER to a
// context rank that crashed reconnects, with its routing id, to the
// incarnation restarted on the same endpoint, which has no binding for
// it, and it says Hello again only once its link hears the new
// incarnation's. A RequestData it sends meanwhile, addressed to the
// crashed incarnation, used to be rejected (no_hello), unanswered: its
// request, taken as delivered, was lost. Such a RequestData, when its
// sender takes a Misaddressed answer (RequestData.Features), is delivered
// (the engine drops and answers it), without binding the connection or
// counting as a sign of life; every other frame before Hello is rejected
// as before: a RequestData addressed to this incarnation or to none, or
// whose sender does not take the answer (an older build), and any other
// kind. Checked: without listener.misaddressed the first one is rejected.
func TestMisaddressedBeforeHelloIsDelivered(t *testing.T) {
	f := newDepartedFixture(t) // gen/0 incarnation 1 said Hello on c1
	f.s.selfInc = 10
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	rd := func(to uint64, features uint64) *messages.RequestData {
		r := requestData(f.peer, 1)
		r.Incarnations = messages.Incarnations{FromIncarnation: 1, ToIncarnation: to}
		r.Features = features
		return r
	}
	before := f.rejected(RejectNoHello)
	f.s.handle("c9", mustEncode(t, rd(5, messages.FeatureMisaddressed)), f.old.public, 1)
	if len(got) != 1 {
		t.Fatalf("a RequestData addressed to an earlier incarnation before Hello: %d delivered, want 1 (%+v)", len(got), f.s.l.Stats().Rejected)
	}
	if n := f.rejected(RejectNoHello) - before; n != 0 {
		t.Fatalf("it was also counted as rejected (no_hello): %d", n)
	}
	if f.s.conns["c9"] != nil {
		t.Fatal("the connection was bound")
	}
	for name, fr := range map[string]messages.Frame{
		"addressed to this incarnation": rd(10, messages.FeatureMisaddressed),
		"addressed to none":             rd(0, messages.FeatureMisaddressed),
		"from an older build":           rd(5, 0),
		"a Result":                      result(f.peer, 2),
		"a Cancel":                      &messages.Cancel{RequestID: "r", From: f.peer, Incarnations: messages.Incarnations{FromIncarnation: 1, ToIncarnation: 5}},
	} {
		before := f.rejected(RejectNoHello)
		f.s.handle("c9", mustEncode(t, fr), f.old.public, 1)
		if len(got) != 1 || f.rejected(RejectNoHello)-before != 1 {
			t.Fatalf("%s before Hello: delivered %d, rejected %d; want rejected (no_hello)", name, len(got)-1, f.rejected(RejectNoHello)-before)
		}
	}
}

// A Misaddressed is often the first frame a just-restarted context rank
// sends the generation rank (its answer to a RequestData addressed to its
// predecessor), on a Conn dialled for it, whose connection is not up yet.
// It waits in the Conn's terminal backlog, behind the Conn's Hello, and
// arrives once the connection is up, as a Result would; it used to be
// refused (ErrQueueFull: "1 frames (a Hello …) wait in the backlog") and
// dropped, and the request it answered waited until its deadline.
// Checked: without Misaddressed in messages.Terminal Send returns ErrQueueFull.
func TestMisaddressedWaitsForTheConnection(t *testing.T) {
	endpoint := "ipc://" + filepath.Join(t.TempDir(), "gen.sock")
	ctx := listen(t, pid("ctx", 0), Config{Insecure: true})
	genID := pid("gen", 0)
	if err := ctx.link.AddPeer(genID, endpoint); err != nil {
		t.Fatal(err)
	}
	conn, err := ctx.link.Dial(genID) // nobody listens there yet
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mis := &messages.Misaddressed{RequestID: "r1", Epoch: 7, From: ctx.id, Addressed: 1,
		Incarnations: messages.Incarnations{FromIncarnation: 2, ToIncarnation: 5}}
	if err := conn.Send(mis); err != nil {
		t.Fatalf("a Misaddressed on a Conn not connected yet: %v, want it kept until the connection is up", err)
	}
	gen := listen(t, genID, Config{Insecure: true, Bind: endpoint})
	waitFor(t, patience, "the Misaddressed", func() bool { return gen.in.len() >= 1 })
	if got, ok := gen.in.snapshot()[0].(*messages.Misaddressed); !ok || got.RequestID != "r1" {
		t.Fatalf("delivered %+v, want the Misaddressed of r1", gen.in.snapshot()[0])
	}
}
