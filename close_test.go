package kvxfer_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestCloseWithADeadlineAlreadyPast: an engine with nothing live closes
// cleanly even when Close's ctx has already ended (Close(0) from the C
// ABI): nothing was left to drain, so that is no failure to drain.
// (Checked to fail with the ctx's end taken as undrained whatever the
// parents say: 5 of 5 closes failed.)
func TestCloseWithADeadlineAlreadyPast(t *testing.T) {
	l := smallLayout()
	tp1 := kvcache.Parallel{TP: 1, PP: 1}
	for i := range 5 {
		c := startCluster(t, l, tp1, tp1, 1)
		transfer(t, c, l, "before-close", i+1, 64, 32, i%2 == 0)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		for _, e := range append(c.gen, c.ctx...) {
			if err := e.Close(done); err != nil {
				t.Fatalf("round %d: Close with its ctx ended, nothing live: %v", i, err)
			}
		}
	}
}

// TestFinishedRequestsHoldNoTimers: once every request is over, no timer
// of the engine is left armed: a request that waited for destination
// blocks stops its queue deadline when it starts, instead of leaving a
// timer (and, through it, the engine) alive until the deadline. (Checked
// to fail without the stop: one timer per request stayed armed.)
func TestFinishedRequestsHoldNoTimers(t *testing.T) {
	clk := actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))
	l := smallLayout()
	tp1 := kvcache.Parallel{TP: 1, PP: 1}
	c := &cluster{link: control.NewMemLink(), ctxPar: tp1, genPar: tp1}
	for _, inst := range []string{"ctx", "gen"} {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 4 << 20,
			Workers: 1, Link: c.link, TransferTimeout: 20 * time.Second, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		if inst == "ctx" {
			c.ctx = append(c.ctx, e)
		} else {
			c.gen = append(c.gen, e)
		}
	}
	for i := range 3 {
		transfer(t, c, l, "timers-"+string(rune('a'+i)), i+1, 64, 32, i%2 == 0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for clk.Pending() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d timers still armed 10 s after every request ended", clk.Pending())
		}
		time.Sleep(time.Millisecond)
	}
	checkNoLeaks(t, c)
}
