package faulty

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Clock runs a function after a delay; Delay uses it.
type Clock interface {
	// AfterFunc calls f on some goroutine d from now, unless stop is
	// called first; stop reports whether it prevented the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// realClock is time.AfterFunc.
type realClock struct{}

func (realClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// ManualClock is a Clock whose time moves only when Advance is called; due
// functions run on Advance's caller. Safe for concurrent use.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Duration
	seq    uint64
	timers []*manualTimer
}

type manualTimer struct {
	due time.Duration
	seq uint64 // ties broken by creation order
	f   func()
}

var _ Clock = (*ManualClock)(nil)

// NewManualClock returns a clock at time 0.
func NewManualClock() *ManualClock { return &ManualClock{} }

// AfterFunc schedules f at now+d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{due: c.now + d, seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i < 0 {
			return false
		}
		c.timers = slices.Delete(c.timers, i, i+1)
		return true
	}
}

// Advance moves time forward by d and runs, in due order, every function
// due by then.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now += d
	var due []*manualTimer
	c.timers = slices.DeleteFunc(c.timers, func(t *manualTimer) bool {
		if t.due <= c.now {
			due = append(due, t)
			return true
		}
		return false
	})
	c.mu.Unlock()
	slices.SortFunc(due, func(a, b *manualTimer) int {
		return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.seq, b.seq))
	})
	for _, t := range due {
		t.f()
	}
}

// Pending is the number of functions scheduled and not yet run or stopped.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
