package actors

import (
	"sort"
	"sync"
	"time"
)

// Clock is the engine's time (DESIGN.md §7: time comes from an injected
// clock, in the steps and the shells alike). The shells read Now before
// each step and arm every timer — session deadlines, drain and re-send
// timers, the allocation queue's deadlines — with AfterFunc; the root
// package computes request deadlines from Now. SystemClock is the only
// place that reads the wall clock; FakeClock moves only when told.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f on its own goroutine once d has passed (at once
	// for d ≤ 0), unless the timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer armed by Clock.AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not happened yet, and reports
	// whether it did so.
	Stop() bool
}

// SystemClock is the wall clock: time.Now and time.AfterFunc.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc implements Clock.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var (
	_ Clock = SystemClock{}
	_ Clock = (*FakeClock)(nil)
)

// FakeClock is a Clock whose time moves only by Advance: timers fire, in
// order of their due time (then of arming), from the Advance that reaches
// them, each on its own goroutine as time.AfterFunc's do. Tests use it to
// drive deadlines without waiting.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer
}

type fakeTimer struct {
	c   *FakeClock
	at  time.Time
	seq uint64
	f   func()
}

// NewFakeClock returns a fake clock reading start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now implements Clock.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc implements Clock. A timer due now or earlier fires on the next
// Advance (Advance(0) included).
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(max(d, 0)), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop implements Timer.
func (t *fakeTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, u := range c.timers {
		if u == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Advance moves the clock d forward and fires every timer due by then.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
		} else {
			due = append(due, t)
		}
	}
	clear(c.timers[len(kept):])
	c.timers = kept
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool {
		if !due[i].at.Equal(due[j].at) {
			return due[i].at.Before(due[j].at)
		}
		return due[i].seq < due[j].seq
	})
	for _, t := range due {
		go t.f()
	}
}

// Pending is the number of armed timers that have not fired or stopped.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
