package actors

import (
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// The credits of one peer: a frame past the limit is refused unless it is
// terminal; a refused RequestData's answer credits are ShedAnswers per
// peer, another peer's are its own, and each comes back with giveAnswer.
// (Checked to fail: with giveAnswer not decrementing, the last takeAnswer
// is refused.)
func TestFrameCredits(t *testing.T) {
	a, b := messages.PeerID{Instance: "a"}, messages.PeerID{Instance: "b"}
	c := newFrameCredits(2)
	rd := &messages.RequestData{RequestID: "r", From: a}
	for i := range 2 {
		if !c.take(rd) {
			t.Fatalf("frame %d of 2 (the limit) was refused", i+1)
		}
	}
	if c.take(rd) {
		t.Fatal("a RequestData past the limit was taken")
	}
	if !c.take(&messages.Result{RequestID: "r", From: a}) {
		t.Fatal("a terminal frame past the limit was refused")
	}
	for i := range ShedAnswers {
		if !c.takeAnswer(a) {
			t.Fatalf("answer credit %d of %d refused", i+1, ShedAnswers)
		}
	}
	if c.takeAnswer(a) {
		t.Fatalf("answer credit %d taken", ShedAnswers+1)
	}
	if !c.takeAnswer(b) {
		t.Fatal("another peer's answer credit refused")
	}
	for range ShedAnswers {
		c.giveAnswer(a)
	}
	if n := len(c.answers); n != 1 {
		t.Fatalf("answers = %v after every credit of a came back, want b's only", c.answers)
	}
	if !c.takeAnswer(a) {
		t.Fatal("an answer credit given back was not taken again")
	}
}
