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

// Issue 17: Hello carries its sender's process identity (pid, start time,
// host and pid namespace); it survives the wire, a Hello without it
// decodes with none, and a malformed one is refused.
func TestHelloProcessRoundTrip(t *testing.T) {
	h := sampleHello()
	h.Process = messages.ProcessID{Pid: 4242, StartTime: 123456, Host: "0b1c2d3e-aaaa-bbbb-cccc-0123456789ab/pid:[4026531836]"}
	b, err := messages.Encode(h)
	if err != nil {
		t.Fatal(err)
	}
	got, err := messages.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, h) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, h)
	}
	plain := sampleHello()
	if b, err = messages.Encode(plain); err != nil {
		t.Fatal(err)
	}
	if got, err = messages.Decode(b); err != nil || !got.(*messages.Hello).Process.IsZero() {
		t.Fatalf("a Hello without a process decodes with %+v (%v)", got, err)
	}
	for _, bad := range []messages.ProcessID{
		{Pid: 0, StartTime: 1, Host: "h"},
		{Pid: 1, StartTime: 0, Host: "h"},
		{Pid: 1, StartTime: 1},
		{Pid: 1, StartTime: 1, Host: "a b"},
		{Pid: 1 << 23, StartTime: 1, Host: "h"},
	} {
		h := sampleHello()
		h.Process = bad
		if err := h.Validate(); err == nil {
			t.Errorf("process %+v validates", bad)
		}
	}
}
