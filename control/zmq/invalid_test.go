package zmq

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

// invalidRequestData encodes a RequestData from "from" naming request id
// whose destination block is negative: it fails Validate, its naming
// fields do not.
func invalidRequestData(t testing.TB, id string, from messages.PeerID) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.Envelope{Version: messages.Version, Body: &pb.Envelope_RequestData{RequestData: &pb.RequestData{
		RequestId: id, Epoch: 3, From: &pb.PeerID{Instance: from.Instance, Rank: from.Rank},
		GenParallel: &pb.Parallel{Tp: 1, Pp: 1}, Groups: []*pb.GroupDest{{Blocks: []int32{-5}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// invalidResult encodes a Result from "from" naming request id with a
// status this version does not know (as a newer writer's would be).
func invalidResult(t testing.TB, id string, from messages.PeerID) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Result{Result: &pb.Result{
		RequestId: id, Epoch: 3, From: &pb.PeerID{Instance: from.Instance, Rank: from.Rank}, Status: 99,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInvalidRequestDataGoesOnWhenItsSenderSpeaks: a RequestData or a
// Result that fails validation but names its request is delivered (for
// the engine to fail the request at once) only from a connection that
// said Hello as its sender; before Hello, or naming another sender, it is
// rejected as a valid frame would be (no_hello, sender), not counted as
// undecodable.
func TestInvalidRequestDataGoesOnWhenItsSenderSpeaks(t *testing.T) {
	a := listen(t, pid("ctx", 0), Config{Insecure: true})
	evil, other := pid("evil", 7), pid("gen", 0)

	defer sendRaw(t, a.link.Endpoint(),
		[][]byte{invalidRequestData(t, "before-hello", evil)},
		[][]byte{mustEncode(t, helloOf(evil, "x"))},
		[][]byte{invalidRequestData(t, "spoofed", other)},
		[][]byte{invalidResult(t, "spoofed-result", other)},
		[][]byte{invalidRequestData(t, "named", evil)},
		[][]byte{invalidResult(t, "named-result", evil)})()

	waitFor(t, patience, "the named ones delivered", func() bool { return a.in.len() >= 2 })
	waitFor(t, patience, "the other three rejected", func() bool { return a.link.Rejected() >= 3 })
	got := a.in.snapshot()
	if len(got) != 2 {
		t.Fatalf("delivered %d frames, want the two named by their own sender", len(got))
	}
	if r, ok := got[1].(*messages.Result); !ok || r.RequestID != "named-result" || r.From != evil || r.Validate() == nil {
		t.Fatalf("delivered %+v second, want the invalid Result \"named-result\" from %s", got[1], evil)
	}
	rd, ok := got[0].(*messages.RequestData)
	if !ok || rd.RequestID != "named" || rd.From != evil || rd.Epoch != 3 || rd.Validate() == nil {
		t.Fatalf("delivered %+v, want the invalid RequestData \"named\" from %s", got[0], evil)
	}
	if n, by := a.link.Rejected(), a.link.FramesRejected(); n != 3 || by["no_hello"] != 1 || by["sender"] != 2 {
		t.Fatalf("Rejected() = %d %v, want one no_hello (before Hello) and two sender (another sender)", n, by)
	}
}
