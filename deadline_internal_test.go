package kvxfer

import (
	"context"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
)

// TestRequestDeadlineOnTheEngineClock: a request's deadline is on the
// engine's clock, its timeout (or TransferTimeout) shortened by the time
// left to ctx's deadline, never ctx's wall-clock instant itself: on a
// clock that reads 2040, a ctx an hour away leaves a 5 s timeout alone,
// and a ctx 2 s away makes it 2 s.
func TestRequestDeadlineOnTheEngineClock(t *testing.T) {
	start := time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)
	e := &Engine{cfg: resolved{Config: Config{Clock: actors.NewFakeClock(start), TransferTimeout: 30 * time.Second}}}
	hour, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	two, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		timeout  time.Duration
		min, max time.Duration // of the deadline past start
	}{
		{"no ctx deadline", context.Background(), 5 * time.Second, 5 * time.Second, 5 * time.Second},
		{"the default", context.Background(), 0, 30 * time.Second, 30 * time.Second},
		{"ctx an hour away", hour, 5 * time.Second, 5 * time.Second, 5 * time.Second},
		{"ctx 2 s away", two, 5 * time.Second, time.Second, 2 * time.Second},
		{"huge timeout", context.Background(), 1<<63 - 1, 100 * 365 * 24 * time.Hour, 1<<63 - 1},
	} {
		got := e.requestDeadline(tc.ctx, tc.timeout).Sub(start)
		if got < tc.min || got > tc.max {
			t.Errorf("%s: deadline %v past the engine clock's now, want [%v, %v]", tc.name, got, tc.min, tc.max)
		}
	}
}
