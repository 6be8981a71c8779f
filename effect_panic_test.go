//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
)

// TestSessionPanicRunningItsEndStillEnds: a session panics running one of
// the effects that end it — a TxSession's or an RxSession's Finish (the
// handle's outcome, the parent told), an RxSession's Stop (the parent
// told, the actor stopped). Those touch no page and no peer: the next
// incarnation runs such an effect again (once) with the rest. Before, it
// was dropped as any effect a panic interrupts: the handle's Done never
// came, or the session never stopped and Close reported it still
// draining though it held nothing (checked to fail without the fix: no
// outcome within 30 s, or Close's ErrUndrained). With panics=2 it panics
// again as it runs again (the restart's Started): dropped then, it left
// the same hang; now it still runs, once more, as a timer a second panic
// drops is armed anyway — and both restarts are counted, the first one
// too, whose Started panicked (before, SessionPanics said 1). Both sides
// still end with the request's outcome, every byte verified, and close
// cleanly.
func TestSessionPanicRunningItsEndStillEnds(t *testing.T) {
	for _, c := range []struct {
		side, effect string
		panics       int32
	}{
		{"tx", "core.Finish", 1}, {"rx", "core.Finish", 1}, {"rx", "core.Stop", 1},
		{"tx", "core.Finish", 2}, {"rx", "core.Finish", 2}, {"rx", "core.Stop", 2},
	} {
		t.Run(fmt.Sprint(c.side, " ", c.effect, " x", c.panics), func(t *testing.T) {
			l := smallLayout()
			ce, ge := faultyPair(t, l)
			var hit atomic.Int32
			hook := func(side string, e actors.Effect) bool {
				return side == c.side && fmt.Sprintf("%T", e) == c.effect && hit.Add(1) <= c.panics
			}
			actors.PanicOnEffect.Store(&hook)
			t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
			rx, tx := receiveAndSend(t, ce, ge, "end", 5)
			ro := waitOutcome(t, rx.Done())
			if !ro.OK {
				t.Fatalf("rx %s %v", ro.Status, ro.Err)
			}
			if n := verify(t, ge, l, 64, ro.Blocks, 5); n == 0 {
				t.Fatal("no byte verified")
			}
			if o := waitOutcome(t, tx.Done()); !o.OK {
				t.Fatalf("tx %s %v", o.Status, o.Err)
			}
			if hit.Load() < c.panics {
				t.Fatalf("%d runs of %s on the %s side, want %d or more: the test proves nothing", hit.Load(), c.effect, c.side, c.panics)
			}
			waitUntil(t, fmt.Sprint(c.panics, " restarts to be counted"), func() bool {
				return ce.Stats().SessionPanics+ge.Stats().SessionPanics == int64(c.panics)
			})
			_ = ge.FreeBlocks(ro.Blocks)
			// The pair's cleanup requires both Closes to return nil: a
			// session that never stopped would be reported undrained.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, e := range []interface{ Close(context.Context) error }{ce, ge} {
				if err := e.Close(ctx); err != nil {
					t.Fatalf("close: %v", err)
				}
			}
		})
	}
}

// TestSessionPanicTwiceRunningItsDecideStillDecides: a TxSession panics
// running its Decide (a Cancel's), and again as the restart runs it
// again. Before, the second panic dropped it for good: the handle never
// learnt the outcome until Done, which waits for the chunk's fence — the
// request was CANCELLED but Err said nil, and a prefill that checks Err
// to stop early went on (checked to fail without the fix: no error
// within 10 s). Now it still runs, as a timer a second panic drops is
// armed anyway: Err names the outcome while the session waits, pinned,
// for its fence.
func TestSessionPanicTwiceRunningItsDecideStillDecides(t *testing.T) {
	l := smallLayout()
	ce, _ := faultyPair(t, l)
	th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "d", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, fences := chunksUnfired(t, ce, th, l, 64, 64)
	if len(fences) != 1 {
		t.Fatalf("%d chunks, want 1", len(fences))
	}
	var hit atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		_, ok := e.(actors.Decide)
		return side == "tx" && ok && hit.Add(1) <= 2
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	th.Cancel()
	waitUntil(t, "the handle to learn the outcome before Done", func() bool { return th.Err() != nil })
	if err := th.Err(); !errors.Is(err, kvxfer.ErrRequestFailed) {
		t.Fatalf("Err %v, want it to wrap ErrRequestFailed", err)
	}
	if got := hit.Load(); got != 2 {
		t.Fatalf("%d runs of Decide, want 2: the test proves nothing", got)
	}
	fences[0].Fire(nil)
	if o := waitOutcome(t, th.Done()); o.OK {
		t.Fatalf("tx %s, want the request cancelled", o.Status)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free the source blocks after Done: %v", err)
	}
	if got := ce.Stats().SessionPanics; got != 2 {
		t.Fatalf("%d restarts counted, want 2", got)
	}
}
