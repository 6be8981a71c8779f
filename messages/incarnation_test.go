package messages_test

import (
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// Issue 17: Hello carries the rank's incarnation, and RequestData, Result,
// Cancel and CancelAck the incarnations they come from and are addressed
// to; every one survives the wire, and a frame without them (an older
// peer) decodes with 0 (not known).
func TestIncarnationsRoundTrip(t *testing.T) {
	in := messages.Incarnations{FromIncarnation: 1<<63 + 5, ToIncarnation: 42}
	h := sampleHello()
	h.Incarnation = 1<<64 - 1
	rd := sampleRequestData(2)
	rd.Incarnations = in
	res := sampleResult()
	res.Incarnations = in
	frames := []messages.Frame{h, rd, res,
		&messages.Cancel{RequestID: "r", Epoch: 7, From: testPeer, Reason: "x", Incarnations: in},
		&messages.CancelAck{RequestID: "r", Epoch: 7, From: testPeer, Incarnations: in}}
	for _, f := range frames {
		b, err := messages.Encode(f)
		if err != nil {
			t.Fatalf("%T: %v", f, err)
		}
		got, err := messages.Decode(b)
		if err != nil {
			t.Fatalf("%T: %v", f, err)
		}
		if !reflect.DeepEqual(got, f) {
			t.Fatalf("%T round trip:\n got %+v\nwant %+v", f, got, f)
		}
		if i, ok := got.(messages.Incarnated); ok && i.Incarnation() != in {
			t.Fatalf("%T: Incarnation() = %+v, want %+v", f, i.Incarnation(), in)
		}
	}
	old, err := messages.Encode(&messages.CancelAck{RequestID: "r", Epoch: 7, From: testPeer})
	if err != nil {
		t.Fatal(err)
	}
	got, err := messages.Decode(old)
	if err != nil {
		t.Fatal(err)
	}
	if i := got.(messages.Incarnated).Incarnation(); i != (messages.Incarnations{}) {
		t.Fatalf("a frame without incarnations decodes with %+v", i)
	}
}
