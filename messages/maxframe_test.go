package messages_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

// Hello says the largest frame its sender's listener takes
// (MaxFrameBytes): the value survives the wire, a Hello without it (an
// older peer) decodes with 0, one past messages.MaxFrameBytes (a later
// build's) is taken, bounding nothing past this build's limit
// (PeerFrameLimit), and one below MinFrameLimit is invalid, named.
func TestHelloMaxFrameBytes(t *testing.T) {
	for _, v := range []uint64{messages.MinFrameLimit, 65536, messages.MaxFrameBytes} {
		h := sampleHello()
		h.MaxFrameBytes = v
		got, err := messages.Decode(mustEncode(t, h))
		if err != nil {
			t.Fatalf("MaxFrameBytes %d: %v", v, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Fatalf("MaxFrameBytes %d round trip:\n got %+v\nwant %+v", v, got, h)
		}
	}
	got, err := messages.Decode(mustEncode(t, sampleHello()))
	if err != nil || got.(*messages.Hello).MaxFrameBytes != 0 {
		t.Fatalf("a Hello that says no limit decodes with %+v (%v)", got, err)
	}
	// Past this build's limit (a later build's larger one, or any value a
	// peer writes): valid, and it bounds nothing this build can send.
	for _, big := range []uint64{messages.MaxFrameBytes + 1, 1 << 31, 1 << 63, 1<<64 - 1} {
		var env pb.Envelope
		if err := proto.Unmarshal(mustEncode(t, sampleHello()), &env); err != nil {
			t.Fatal(err)
		}
		env.GetHello().MaxFrameBytes = big
		b, err := proto.Marshal(&env)
		if err != nil {
			t.Fatal(err)
		}
		got, err := messages.Decode(b)
		if err != nil {
			t.Fatalf("Decode of a Hello with MaxFrameBytes %d: %v, want it taken", big, err)
		}
		if l := got.(*messages.Hello).PeerFrameLimit(); l != messages.MaxFrameBytes {
			t.Errorf("PeerFrameLimit of MaxFrameBytes %d: %d, want %d", big, l, messages.MaxFrameBytes)
		}
	}
	for v, want := range map[uint64]int{0: messages.MaxFrameBytes, messages.MinFrameLimit: messages.MinFrameLimit, 65536: 65536, messages.MaxFrameBytes: messages.MaxFrameBytes} {
		h := sampleHello()
		h.MaxFrameBytes = v
		if l := h.PeerFrameLimit(); l != want {
			t.Errorf("PeerFrameLimit of MaxFrameBytes %d: %d, want %d", v, l, want)
		}
	}
	// Below MinFrameLimit the Hello's sender would drop the frames that
	// end a request: invalid, naming the value.
	for _, v := range []uint64{1, 1024, messages.MinFrameLimit - 1} {
		h := sampleHello()
		h.MaxFrameBytes = v
		err := h.Validate()
		if want := fmt.Sprintf("hello max frame bytes %d, want 0 (not said) or at least MinFrameLimit %d", v, messages.MinFrameLimit); !errors.Is(err, messages.ErrInvalid) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("Validate of a Hello with MaxFrameBytes %d: %v, want ErrInvalid: %s", v, err, want)
		}
	}
}

// TestMinFrameLimitFitsEveryEnd: every frame that ends a request, with
// each field at its bound (the longest request id, instance, error text
// and reason; the largest numbers), encodes within MinFrameLimit, so a
// listener at that limit takes them all.
func TestMinFrameLimitFitsEveryEnd(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	from := messages.PeerID{Instance: long(messages.MaxInstanceLen), Rank: messages.MaxRank - 1}
	id := long(messages.MaxRequestIDLen)
	incs := messages.Incarnations{FromIncarnation: 1<<64 - 1, ToIncarnation: 1<<64 - 1}
	for _, f := range []messages.Frame{
		&messages.Result{RequestID: id, Epoch: 1<<64 - 1, From: from, Status: messages.StatusFailed, Bytes: 1<<64 - 1,
			Error: long(messages.MaxErrorLen), ErrorKind: messages.ErrorKindPromptMismatch, Incarnations: incs},
		&messages.Cancel{RequestID: id, Epoch: 1<<64 - 1, From: from, Reason: long(messages.MaxErrorLen), Incarnations: incs},
		&messages.CancelAck{RequestID: id, Epoch: 1<<64 - 1, From: from, Incarnations: incs},
		&messages.Misaddressed{RequestID: id, Epoch: 1<<64 - 1, From: from, Addressed: 1<<64 - 2, Incarnations: incs},
	} {
		b, err := messages.Encode(f)
		if err != nil {
			t.Fatalf("%T: %v", f, err)
		}
		t.Logf("%T at its bounds: %d bytes", f, len(b))
		if len(b) > messages.MinFrameLimit {
			t.Errorf("%T at its bounds: %d bytes, past MinFrameLimit %d", f, len(b), messages.MinFrameLimit)
		}
	}
}
