//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// TestSessionDroppedResultFailsPromptly: a TxSession panics twice running
// its stream's SUCCESS Result (SendFrame): the run again panics too, and
// the frame is dropped — it never reached the stream, so it never left.
// Before, nothing said so: the restart's TxPanic failed nothing (every
// Result was handed over), no report that the Result left (TxSent) ever
// came, and the context side decided only at its deadline. Now the
// dropped frame is stepped as a Result that did not leave (TxSent with an
// error): the request fails at once (ErrFrameUnsent), the stream ends
// without a frame, and every source pin is dropped at Done. The generation
// side, which got no Result, ends at its deadline or, here, its Cancel.
func TestSessionDroppedResultFailsPromptly(t *testing.T) {
	l := smallLayout()
	// No deadline ends either side in the test's time: only the fix
	// decides the context side.
	ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = time.Hour })
	var hits atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		f, ok := e.(actors.SendFrame)
		if !ok || side != "tx" || !f.FromStream {
			return false
		}
		r, ok := f.Frame.(*messages.Result)
		return ok && r.Status == messages.StatusSuccess && hits.Add(1) <= 2
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	rx, tx := receiveAndSend(t, ce, ge, "dropped", 3)
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its Result was dropped (%d panics): it waits for its deadline", hits.Load())
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d panics running the Result, want 2: the test proves nothing", n)
	}
	if o.OK || !errors.Is(o.Err, actors.ErrFrameUnsent) {
		t.Fatalf("tx %s (%v): want FAILED, the Result unsent", o.Status, o.Err)
	}
	for g, st := range ce.Pools().Stats() {
		if st.Pinned != 0 {
			t.Fatalf("group %d: %d blocks pinned after Done", g, st.Pinned)
		}
	}
	// The generation side got no Result: its caller gives up on it.
	rx.Cancel()
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx %s: want it failed (no Result came)", ro.Status)
	}
	select {
	case <-rx.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx never released")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}
