package actors

import (
	"testing"
	"time"
)

// TestFakeClock: timers fire only when Advance reaches them, each once;
// a stopped timer never fires; a timer armed in the past fires on the next
// Advance; Now moves only by Advance.
func TestFakeClock(t *testing.T) {
	start := time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewFakeClock(start)
	fired := make(chan string, 8)
	c.AfterFunc(2*time.Second, func() { fired <- "2s" })
	c.AfterFunc(time.Second, func() { fired <- "1s" })
	stopped := c.AfterFunc(time.Second, func() { fired <- "stopped" })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop: want true once, then false")
	}
	if c.Pending() != 2 {
		t.Fatalf("pending %d, want 2", c.Pending())
	}
	c.Advance(999 * time.Millisecond)
	if c.Pending() != 2 || !c.Now().Equal(start.Add(999*time.Millisecond)) {
		t.Fatalf("at 999ms: pending %d, now %v", c.Pending(), c.Now())
	}
	c.Advance(time.Millisecond)
	if got := <-fired; got != "1s" {
		t.Fatalf("fired %q at 1s", got)
	}
	c.AfterFunc(-time.Hour, func() { fired <- "past" })
	c.Advance(0)
	if got := <-fired; got != "past" {
		t.Fatalf("fired %q, want the timer armed in the past", got)
	}
	c.Advance(time.Second)
	if got := <-fired; got != "2s" {
		t.Fatalf("fired %q at 2s", got)
	}
	if c.Pending() != 0 || len(fired) != 0 {
		t.Fatalf("pending %d, %d more fired", c.Pending(), len(fired))
	}
}
