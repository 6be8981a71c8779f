package kvxfer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
)

// countingClock is a fake clock that counts the timers armed on it and
// the ones stopped after they fired (held by their session until its Stop).
type countingClock struct {
	*actors.FakeClock
	mu        sync.Mutex
	armed     int
	lateStops atomic.Int64
}

type countedTimer struct {
	actors.Timer
	c     *countingClock
	fired atomic.Bool
}

func (c *countingClock) AfterFunc(d time.Duration, f func()) actors.Timer {
	t := &countedTimer{c: c}
	c.mu.Lock()
	c.armed++
	c.mu.Unlock()
	t.Timer = c.FakeClock.AfterFunc(d, func() { t.fired.Store(true); f() })
	return t
}

func (t *countedTimer) Stop() bool {
	if t.fired.Load() {
		t.c.lateStops.Add(1)
	}
	return t.Timer.Stop()
}

// TestQuarantinedSessionHoldsFewTimers: a session quarantined for a long
// time (its writer suspected, partitioned) re-sends Cancel every second on
// one timer chain, and does not keep the timers that fired: it armed two
// chains once its deadline passed, and held every timer it ever armed
// until its Stop (~600 after five minutes, ~170,000 after a day).
func TestQuarantinedSessionHoldsFewTimers(t *testing.T) {
	l := smallLayout()
	clk := &countingClock{FakeClock: actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))}
	c, link := startPartClusterWith(t, l, func(inst string, cfg *kvxfer.Config) {
		if inst == "gen" {
			cfg.Clock = clk
		}
	})
	gen, ce := c.gen[0], c.ctx[0]
	rx := receiveAtWriter(t, gen, link, "q1")
	link.setCut(true)
	gen.PeerDown(ce.Hello().From) // suspicion: quarantined until a proof
	waitOutcome(t, rx.Done())
	waitUntil(t, "q1's blocks quarantined", func() bool { return gen.Pools().Quarantined() > 0 })
	const secs = 300 // past the request's deadline
	clk.mu.Lock()
	before := clk.armed
	clk.mu.Unlock()
	for range secs {
		clk.Advance(time.Second)
		settle(t, clk.FakeClock)
	}
	clk.mu.Lock()
	armed := clk.armed - before
	clk.mu.Unlock()
	if armed > secs+secs/10 {
		t.Errorf("%d timers armed in %d s of quarantine: more than one Cancel re-send chain", armed, secs)
	}
	link.setCut(false) // the proof (CancelAck) comes: the session stops
	waitUntil(t, "the quarantine to empty", func() bool { return gen.Stats().QuarantinedBytes == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := gen.Close(ctx); err != nil { // every session stopped: its timers too
		t.Fatal(err)
	}
	if late := clk.lateStops.Load(); late > 10 {
		t.Errorf("the session held %d fired timers until its Stop: it kept every timer it armed", late)
	}
}
