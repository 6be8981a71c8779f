package actors

import (
	"errors"
	"testing"
)

var openReplySink txOpenReply

// TestOpenReplyAllocatesOnce pins an open request's reply (Engine.Send
// and Receive make one a request) to one allocation, its channel of empty
// structs; a buffered channel of the answer took two. The answer given
// is the one the caller reads.
func TestOpenReplyAllocatesOnce(t *testing.T) {
	want := errors.New("refused")
	if n := testing.AllocsPerRun(100, func() {
		o := newOpenReply[txOpenReply]()
		o.answer(txOpenReply{err: want})
		<-o.done
		openReplySink = o.r
	}); n != 1 {
		t.Fatalf("an open reply allocates %v objects, want 1", n)
	}
	if openReplySink.err != want {
		t.Fatalf("the caller read %v, want the answer given (%v)", openReplySink.err, want)
	}
}
