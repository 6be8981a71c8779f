//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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
// outcome within 30 s, or Close's ErrUndrained). Both sides still end
// with the request's outcome, every byte verified, and close cleanly.
func TestSessionPanicRunningItsEndStillEnds(t *testing.T) {
	for _, c := range []struct{ side, effect string }{
		{"tx", "core.Finish"}, {"rx", "core.Finish"}, {"rx", "core.Stop"},
	} {
		t.Run(c.side+" "+c.effect, func(t *testing.T) {
			l := smallLayout()
			ce, ge := faultyPair(t, l)
			var hit atomic.Bool
			hook := func(side string, e actors.Effect) bool {
				return side == c.side && fmt.Sprintf("%T", e) == c.effect && hit.CompareAndSwap(false, true)
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
			if !hit.Load() {
				t.Fatalf("no %s ran on the %s side: the test proves nothing", c.effect, c.side)
			}
			waitUntil(t, "the panic to be counted", func() bool {
				return ce.Stats().SessionPanics+ge.Stats().SessionPanics == 1
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
