package actors

import (
	"fmt"
	"testing"
)

// TestEndedBeforeSendForgetThenAddAgain: an id forgotten (a Send took it)
// and added again keeps its record until its own slot is the oldest; the
// forgotten slot's eviction does not take it. Bounded all the while.
func TestEndedBeforeSendForgetThenAddAgain(t *testing.T) {
	var u endedBeforeSend
	u.add("a", Outcome{Status: StatusFailed})
	u.forget("a")
	u.add("a", Outcome{Status: StatusCancelled})
	// Fill to the bound: the next add evicts the oldest slot, a's
	// forgotten one.
	for i := range endedBeforeSendN - 2 { // the two slots of a, and these: full
		u.add(fmt.Sprintf("r%d", i), Outcome{Status: StatusFailed})
	}
	if o, ok := u.get("a"); !ok || o.Status != StatusCancelled {
		t.Fatalf("a's second record before any eviction: %v, %v", o.Status, ok)
	}
	u.add("late", Outcome{Status: StatusFailed}) // evicts a's forgotten slot
	if o, ok := u.get("a"); !ok || o.Status != StatusCancelled {
		t.Fatalf("a's second record after its forgotten slot was evicted: %v, %v; want it kept", o.Status, ok)
	}
	u.add("later", Outcome{Status: StatusFailed}) // evicts a's own slot
	if _, ok := u.get("a"); ok {
		t.Fatal("a kept past its own slot's eviction")
	}
	if len(u.byID) > endedBeforeSendN || len(u.order) > endedBeforeSendN {
		t.Fatalf("%d records, %d slots: past the bound %d", len(u.byID), len(u.order), endedBeforeSendN)
	}
}
