package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
)

// TestCtxDeadlineEndsAsTimeout: a ctx deadline earlier than the request's
// Timeout bounds it, and the request ends as at its own deadline —
// TIMED_OUT on the generation side, FAILED with ErrTimeout on the context
// side — not CANCELLED: the ctx's watcher does not race the session's
// deadline timer with a Cancel. Eight of each, together (each raced about
// one time in three).
func TestCtxDeadlineEndsAsTimeout(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan string, 2*n)
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			rx, err := c.gen[0].Receive(ctx, kvxfer.ReceiveRequest{ID: fmt.Sprintf("rx%d", i), PromptLen: 64, Context: "ctx", Timeout: 20 * time.Second})
			if err != nil {
				errs <- err.Error()
				return
			}
			if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusTimedOut || !errors.Is(o.Err, kvxfer.ErrTimeout) {
				errs <- fmt.Sprintf("generation side: %s: %v", o.Status, o.Err)
			}
			waitReleased(t, rx) // its writer's CancelAck, before the cleanup closes the writer
		}()
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			tx, err := c.ctx[0].Send(ctx, kvxfer.SendRequest{ID: fmt.Sprintf("tx%d", i), PromptLen: 64, Timeout: 20 * time.Second})
			if err != nil {
				errs <- err.Error()
				return
			}
			if o := waitOutcome(t, tx.Done()); !errors.Is(o.Err, kvxfer.ErrTimeout) {
				errs <- fmt.Sprintf("context side: %s: %v", o.Status, o.Err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("a ctx deadline that bounded the request: %s", e)
	}
}

// TestCtxCancelStillCancels: a ctx cancelled (not at its deadline) before
// the request ends still cancels it.
func TestCtxCancelStillCancels(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	rx, err := c.gen[0].Receive(ctx, kvxfer.ReceiveRequest{ID: "c", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("rx %s %v after its ctx was cancelled, want CANCELLED", o.Status, o.Err)
	}
	waitReleased(t, rx)
}

// waitReleased waits (with a deadline) for a failed receive's proof that
// no write comes: its writer's answer must arrive before the test's
// cleanup closes the writer, or the generation engine's Close reports it
// undrained.
func waitReleased(t *testing.T, rx *kvxfer.RxHandle) {
	t.Helper()
	select {
	case <-rx.Released():
	case <-time.After(30 * time.Second):
		t.Error("no proof from the writer within 30 s: the blocks stay quarantined")
	}
}

// TestSendAfterOrphanEndedNamesWhy: a RequestData opened the context
// side's session before Send, and the session ended waiting for it (the
// context rank's TransferTimeout). The late Send is refused naming what
// ended the request (its deadline), not "already sent" — or, while the
// ended session still drains, its handle ends with that deadline. (The
// test assumed the session stopped once the generation side heard its
// FAILED: 2 runs in 30 failed under -race, before this session's changes
// too.)
func TestSendAfterOrphanEndedNamesWhy(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	start := func(inst string, tt time.Duration) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 4 << 20,
			Workers: 1, Link: link, TransferTimeout: tt})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.Close(ctx); err != nil {
				t.Errorf("close %s: %v", inst, err)
			}
		})
		return e
	}
	ce := start("ctx", 200*time.Millisecond)
	ge := start("gen", 20*time.Second)
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "late", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, rx.Done()); o.OK {
		t.Fatalf("rx %s", o.Status)
	}
	// The generation side heard the context side's FAILED. The session
	// may still be draining there (its Result leaves before it stops):
	// then Send adopts it and its handle ends with the timeout; once it
	// stopped, Send itself is refused with it.
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "late", PromptLen: 64})
	if err == nil {
		o := waitOutcome(t, tx.Done())
		err = o.Err
		if o.OK {
			t.Fatalf("Send after the session its RequestData opened timed out: %s", o.Status)
		}
	}
	if !errors.Is(err, kvxfer.ErrTimeout) || strings.Contains(err.Error(), "already sent") {
		t.Fatalf("Send after the session its RequestData opened timed out: %v, want ErrTimeout naming it", err)
	}
}

// TestQueuedReceiveTimeoutTellsTheContextSide: a Receive whose deadline
// passes while it waits for destination blocks tells its writers, as a
// queued Receive cancelled does: the context side's Send ends at once
// (cancelled by its peer), not at its own deadline.
func TestQueuedReceiveTimeoutTellsTheContextSide(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2) // TransferTimeout 20 s
	ce, ge := c.ctx[0], c.gen[0]
	held := holdFreeBlocks(t, ge)
	defer func() { _ = ge.FreeBlocks(held) }()
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "q", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q", PromptLen: 64, Context: "ctx", Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusTimedOut {
		t.Fatalf("rx %s %v", o.Status, o.Err)
	}
	waitUntil(t, "the context side to hear of it", func() bool { return tx.Err() != nil })
	if o := waitOutcome(t, tx.Done()); !errors.Is(o.Err, kvxfer.ErrPeerCancelled) {
		t.Fatalf("tx %s %v, want cancelled by its peer", o.Status, o.Err)
	}
}

// heldClock is a fake clock whose fired timers' callbacks can be held back:
// what a callback the scheduler has not run yet looks like (its timer's
// Stop already too late, its message not yet in any mailbox).
type heldClock struct {
	*actors.FakeClock
	mu   sync.Mutex
	hold bool
	held []func()
}

func (c *heldClock) AfterFunc(d time.Duration, f func()) actors.Timer {
	return c.FakeClock.AfterFunc(d, func() {
		c.mu.Lock()
		if c.hold {
			c.held = append(c.held, f)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		f()
	})
}

// TestStaleQueueTimerLeavesReusedID: a queued Receive cancelled as its
// queue deadline fired (the timer's callback on its way) is followed by a
// Receive reusing its id; the old callback's message must not time the
// new request out.
func TestStaleQueueTimerLeavesReusedID(t *testing.T) {
	clk := &heldClock{FakeClock: actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))}
	l := smallLayout()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 1 << 20,
		Workers: 1, Link: control.NewMemLink(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	held := holdFreeBlocks(t, e)
	defer func() { _ = e.FreeBlocks(held) }()
	rx1, err := e.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "ctx", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "r queued", func() bool { return e.Stats().WaitingForBlocks == 1 })
	clk.mu.Lock()
	clk.hold = true
	clk.mu.Unlock()
	clk.Advance(5 * time.Second)
	waitUntil(t, "r's queue deadline to fire", func() bool {
		// The rx parent counts r as queued just before it arms r's queue
		// timer: armed after the Advance, the timer is due and fires at
		// the next Advance.
		clk.Advance(0)
		clk.mu.Lock()
		defer clk.mu.Unlock()
		return len(clk.held) > 0
	})
	rx1.Cancel()
	waitOutcome(t, rx1.Done())
	rx2, err := e.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "ctx", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the second r queued", func() bool { return e.Stats().WaitingForBlocks == 1 })
	clk.mu.Lock()
	stale := clk.held
	clk.held, clk.hold = nil, false
	clk.mu.Unlock()
	for _, f := range stale {
		f() // the first r's queue timer's message reaches the rx parent now
	}
	// Answered by the rx parent after it handled that message: a Receive
	// of the same id is refused while the second r is live.
	if _, err := e.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "ctx"}); err == nil {
		t.Fatal("a third r was taken")
	}
	select {
	case o := <-rx2.Done():
		t.Fatalf("the second r (its deadline a minute away, no time passed) ended %s: %v: the first r's queue timer ended it", o.Status, o.Err)
	default:
	}
	rx2.Cancel()
	waitOutcome(t, rx2.Done())
}
