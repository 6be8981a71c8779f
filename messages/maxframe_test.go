package messages_test

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

// Hello says the largest frame its sender's listener takes
// (MaxFrameBytes): the value survives the wire, a Hello without it (an
// older peer) decodes with 0, and one past messages.MaxFrameBytes (a
// later build's) is taken, bounding nothing past this build's limit
// (PeerFrameLimit).
func TestHelloMaxFrameBytes(t *testing.T) {
	for _, v := range []uint64{1, 4096, messages.MaxFrameBytes} {
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
	for v, want := range map[uint64]int{0: messages.MaxFrameBytes, 1: 1, 4096: 4096, messages.MaxFrameBytes: messages.MaxFrameBytes} {
		h := sampleHello()
		h.MaxFrameBytes = v
		if l := h.PeerFrameLimit(); l != want {
			t.Errorf("PeerFrameLimit of MaxFrameBytes %d: %d, want %d", v, l, want)
		}
	}
}
