package control

import (
	"fmt"
	"testing"
	"time"
)

// TestThrottle: each (peer, kind) gets a burst, then one line per period;
// held-back lines are reported with the next one let through; keys are
// independent, bounded in number, and all keys together share a budget.
func TestThrottle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	th := NewThrottle(3, time.Second, 8)
	allowed := func(now time.Time, peer, kind string, n int) (ok, held int) {
		for range n {
			if a, h := th.Allow(now, peer, kind); a {
				ok++
				held += h
			}
		}
		return ok, held
	}
	if ok, _ := allowed(t0, "gen/0", "send", 100); ok != 3 {
		t.Fatalf("a burst of 100 let %d through, want 3", ok)
	}
	// Another kind, another peer: their own budgets.
	if ok, _ := allowed(t0, "gen/0", "dial", 10); ok != 3 {
		t.Fatalf("another kind let %d through, want 3", ok)
	}
	if ok, _ := allowed(t0, "gen/1", "send", 10); ok != 3 {
		t.Fatalf("another peer let %d through, want 3", ok)
	}
	// A period later: one more line, which says what was held back.
	ok, held := th.Allow(t0.Add(time.Second), "gen/0", "send")
	if !ok || held != 97 {
		t.Fatalf("after a period: ok %v, held %d; want true, 97", ok, held)
	}
	if ok, _ := th.Allow(t0.Add(time.Second), "gen/0", "send"); ok {
		t.Fatal("a second line in the same period")
	}
	// The number of keys is bounded.
	for i := range 100 {
		th.Allow(t0.Add(2*time.Second), fmt.Sprintf("p%d", i), "x")
	}
	if n := th.Len(); n > 8 {
		t.Fatalf("remembers %d keys, want at most 8", n)
	}
	// All keys together: at most 16 bursts at once, however many keys.
	g := NewThrottle(1, time.Hour, 1<<20)
	if ok, _ := func() (int, int) {
		n := 0
		for i := range 1000 {
			if a, _ := g.Allow(t0, fmt.Sprintf("p%d", i), "x"); a {
				n++
			}
		}
		return n, 0
	}(); ok != globalBurstFactor {
		t.Fatalf("1000 keys let %d lines through, want the shared budget %d", ok, globalBurstFactor)
	}
	var nilT *Throttle
	if ok, _ := nilT.Allow(t0, "p", "k"); !ok {
		t.Fatal("a nil Throttle held a line back")
	}
}
