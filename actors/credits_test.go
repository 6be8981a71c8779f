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

// A peer's Cancels spend credits of their own: a storm of re-sent Cancels
// (requests that timed out together, each Cancel re-sent every second)
// sheds only Cancels, and the peer's new RequestData still enter (a
// review found 2,744 of 3,000 new requests waiting their full deadline
// behind such a storm).
func TestCancelsSpendCreditsOfTheirOwn(t *testing.T) {
	a := messages.PeerID{Instance: "a"}
	c := newFrameCredits(2)
	cancel := &messages.Cancel{RequestID: "old", From: a}
	for i := range 2 {
		if !c.take(cancel) {
			t.Fatalf("Cancel %d of 2 refused", i+1)
		}
	}
	if c.take(cancel) {
		t.Fatal("a Cancel past the limit was taken")
	}
	rd := &messages.RequestData{RequestID: "new", From: a}
	for i := range 2 {
		if !c.take(rd) {
			t.Fatalf("RequestData %d of 2 refused while only Cancels spent their credits", i+1)
		}
	}
	if c.take(rd) {
		t.Fatal("a RequestData past its own limit was taken")
	}
	c.give(cancel)
	if !c.take(cancel) {
		t.Fatal("a Cancel's credit given back was not taken again")
	}
	if c.take(rd) {
		t.Fatal("a Cancel's credit given back went to RequestData")
	}
	c.give(cancel)
	c.give(cancel)
	c.give(rd)
	c.give(rd)
	if len(c.held) != 0 || len(c.cancels) != 0 {
		t.Fatalf("credits left after every one came back: held %v, cancels %v", c.held, c.cancels)
	}
}

// A peer's held frames are bounded by what they keep in memory too: a
// RequestData that would take the peer's held weight past byteLimit is
// refused though frame credits are left, a lighter one still enters, a
// terminal frame always does, and a frame heavier than the whole budget
// enters when the peer holds nothing else. Weight comes back with give.
// (Checked to fail: with take ignoring weight, the second heavy frame is
// taken; with give not returning it, the heavy frame is refused after.)
func TestFrameCreditsWeighTheirBlocks(t *testing.T) {
	a, b := messages.PeerID{Instance: "a"}, messages.PeerID{Instance: "b"}
	c := newFrameCredits(100)
	c.byteLimit = 1000
	rd := func(from messages.PeerID, blocks int) *messages.RequestData {
		return &messages.RequestData{RequestID: "r", From: from,
			Groups: []messages.GroupDest{{Blocks: make([]int32, blocks)}}}
	}
	heavy, light := rd(a, 200), rd(a, 10) // 800 and 40 bytes
	if !c.take(heavy) {
		t.Fatal("the first heavy RequestData was refused")
	}
	if c.take(rd(a, 200)) {
		t.Fatal("a RequestData past the peer's byte budget was taken (800 + 800 > 1000)")
	}
	if !c.take(light) {
		t.Fatal("a light RequestData within the byte budget was refused")
	}
	if !c.take(&messages.Result{RequestID: "r", From: a}) {
		t.Fatal("a terminal frame was refused")
	}
	if !c.take(rd(b, 200)) {
		t.Fatal("another peer's RequestData was refused")
	}
	c.give(light)
	c.give(heavy)
	if c.weight[a] != 0 {
		t.Fatalf("weight of a = %d after its frames came back, want 0", c.weight[a])
	}
	if !c.take(rd(a, 200)) {
		t.Fatal("a heavy RequestData refused after the weight came back")
	}
	whale := rd(b, 10000) // 40,000 bytes: more than the whole budget
	if c.take(whale) {
		t.Fatal("a frame past the budget was taken while the peer holds another")
	}
	c.give(rd(b, 200))
	if !c.take(whale) {
		t.Fatal("a frame heavier than the budget was refused while its peer holds nothing: it could never enter")
	}
}

// TestFrameCreditsWeighResults: a held Result's payload (up to 64 KiB)
// counts in its peer's byte budget — the Result itself is never shed, but
// a RequestData past the budget is — and is given back with it. (Checked
// to fail with frameBytes weighing a Result 0: the RequestData is taken.)
func TestFrameCreditsWeighResults(t *testing.T) {
	a := messages.PeerID{Instance: "a"}
	c := newFrameCredits(100)
	c.byteLimit = 1 << 16
	res := &messages.Result{RequestID: "r", From: a, Payload: make([]byte, 60<<10)}
	if !c.take(res) {
		t.Fatal("a terminal frame was refused")
	}
	rd := &messages.RequestData{RequestID: "s", From: a, Groups: []messages.GroupDest{{Blocks: make([]int32, 2048)}}}
	if c.take(rd) {
		t.Fatalf("a RequestData of %d bytes taken past the byte budget (%d held of %d)", frameBytes(rd), c.weight[a], c.byteLimit)
	}
	c.give(res)
	if !c.take(rd) {
		t.Fatal("the RequestData refused once the Result's payload was given back")
	}
}
