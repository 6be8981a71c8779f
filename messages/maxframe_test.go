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
// older peer) decodes with 0, and one past messages.MaxFrameBytes is
// refused, naming the value, as any out-of-range peer input.
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
	for _, bad := range []uint64{messages.MaxFrameBytes + 1, 1 << 31, 1 << 63, 1<<64 - 1} {
		h := sampleHello()
		h.MaxFrameBytes = bad
		if err := h.Validate(); !errors.Is(err, messages.ErrInvalid) {
			t.Fatalf("Validate of MaxFrameBytes %d: %v, want ErrInvalid", bad, err)
		}
		// The same value from a peer: written past Encode's validation.
		var env pb.Envelope
		if err := proto.Unmarshal(mustEncode(t, sampleHello()), &env); err != nil {
			t.Fatal(err)
		}
		env.GetHello().MaxFrameBytes = bad
		b, err := proto.Marshal(&env)
		if err != nil {
			t.Fatal(err)
		}
		_, err = messages.Decode(b)
		if !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("max frame bytes %d", bad)) {
			t.Fatalf("Decode of a Hello with MaxFrameBytes %d: %v, want ErrInvalid naming the value", bad, err)
		}
	}
}
