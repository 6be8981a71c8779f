package kvxfer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
)

// TestClock_FakeClockDrivesDeadlines: an engine on a fake clock computes
// request deadlines and runs its timers on that clock alone. A context-side
// request nobody asks for and a generation-side request whose context
// instance does not exist (its RequestData is refused and re-sent on the
// clock's timers) both stay live through 4.9 s of fake time — the fake
// clock starts years away from the wall clock, so a deadline taken from
// the wall clock would already have passed — and fail by their 5 s
// deadline once the clock passes it, without any real waiting.
func TestClock_FakeClockDrivesDeadlines(t *testing.T) {
	clk := actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))
	l := smallLayout()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "solo", Layout: &l, PoolBytes: 1 << 20,
		Workers: 1, Link: control.NewMemLink(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	ctx := context.Background()
	tx, err := e.Send(ctx, kvxfer.SendRequest{ID: "a", PromptLen: 32, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := e.Receive(ctx, kvxfer.ReceiveRequest{ID: "b", PromptLen: 32, Context: "nobody", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for range 49 {
		clk.Advance(100 * time.Millisecond)
	}
	// Whatever the timers that fired did, it must have been stepped by
	// now: a deadline reached by then would show in Decided. Let the
	// actors catch up by polling the clock's timers (the sessions re-arm
	// re-send timers as they step), bounded in real time.
	settle(t, clk)
	if err := tx.Err(); err != nil {
		t.Fatalf("context side decided at 4.9 s of a 5 s deadline: %v", err)
	}
	select {
	case o := <-rx.Done():
		t.Fatalf("generation side finished at 4.9 s of a 5 s deadline: %s %v", o.Status, o.Err)
	default:
	}
	to, ro := advanceUntil(t, clk, tx.Done(), rx.Done())
	if to.OK || !errors.Is(to.Err, kvxfer.ErrTimeout) {
		t.Fatalf("context side: %s %v, want a failure by ErrTimeout", to.Status, to.Err)
	}
	if ro.Status != kvxfer.StatusTimedOut || !errors.Is(ro.Err, kvxfer.ErrTimeout) {
		t.Fatalf("generation side: %s %v, want TIMED_OUT by ErrTimeout", ro.Status, ro.Err)
	}
	if now := clk.Now(); now.Before(time.Date(2040, 1, 1, 0, 0, 5, 0, time.UTC)) {
		t.Fatalf("finished at fake time %v, before the deadline", now)
	}
}

// settle waits until the fake clock's armed timers stop changing for a
// few polls, at most 5 s of real time: the actors have stepped what the
// last Advance fired.
func settle(t *testing.T, clk *actors.FakeClock) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(5 * time.Second)
	last, same := -1, 0
	for same < 5 {
		select {
		case <-tick.C:
		case <-limit:
			t.Fatal("the engine's timers did not settle in 5 s")
		}
		if n := clk.Pending(); n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
}

// advanceUntil moves the fake clock 10 ms at a time until both outcomes
// came, at most 10 s of real time.
func advanceUntil(t *testing.T, clk *actors.FakeClock, a, b <-chan kvxfer.Outcome) (ao, bo kvxfer.Outcome) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	limit := time.After(10 * time.Second)
	var gotA, gotB bool
	for !gotA || !gotB {
		select {
		case ao = <-a:
			gotA, a = true, nil
		case bo = <-b:
			gotB, b = true, nil
		case <-tick.C:
			clk.Advance(10 * time.Millisecond)
		case <-limit:
			t.Fatalf("no outcome after 10 s of real time (fake time %v)", clk.Now())
		}
	}
	return ao, bo
}
