//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
)

// streamPanicOnce makes a peer stream panic once, as it handles a message
// whose effect match accepts (nil: a worker's report about its ops;
// actors.PanicOnStream); it returns the count of panics injected.
func streamPanicOnce(t *testing.T, match func(actors.Effect) bool) *atomic.Int32 {
	t.Helper()
	var n atomic.Int32
	hook := func(e actors.Effect) bool { return match(e) && n.CompareAndSwap(0, 1) }
	actors.PanicOnStream.Store(&hook)
	t.Cleanup(func() { actors.PanicOnStream.Store(nil) })
	return &n
}

// transferThroughStreamPanic runs request a (64 tokens in one chunk) and
// requires it to end READY and DONE with nothing left: each Done within
// waitOutcome's deadline, the source blocks free once the tx side is
// done, the generation side's blocks released, no stream violation.
func transferThroughStreamPanic(t *testing.T, hits *atomic.Int32) {
	t.Helper()
	l := smallLayout()
	ce, ge := faultyPairWith(t, l, 1, nil)
	rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, ce, th, l, 64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, th.Done()); !o.OK {
		t.Fatalf("tx a %s (%v), want DONE: the stream handles the lost message again", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free a's source blocks after Done: %v", err)
	}
	ro := waitOutcome(t, rh.Done())
	if !ro.OK {
		t.Fatalf("rx a %s (%v), want READY", ro.Status, ro.Err)
	}
	select {
	case <-rh.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx a never released its blocks")
	}
	if err := ge.FreeBlocks(ro.Blocks); err != nil {
		t.Fatal(err)
	}
	if got := hits.Load(); got != 1 {
		t.Fatalf("%d panics injected, want 1", got)
	}
	if v := ce.Stats().StreamViolations; v != 0 {
		t.Fatalf("%d stream violations", v)
	}
}

// TestStreamPanicOnAnOpPostsIt: the peer stream panics as it takes its
// op (Submit) from the session. Before, the op was lost with the panic:
// never posted to a worker, it stayed SUBMITTING for good — the session
// never drained, Done never came, the generation side waited for its
// deadline. Now the restarted stream handles it once more: the transfer
// ends READY and DONE.
func TestStreamPanicOnAnOpPostsIt(t *testing.T) {
	transferThroughStreamPanic(t, streamPanicOnce(t, func(e actors.Effect) bool {
		s, ok := e.(actors.Submit)
		return ok && s.Op.Request == "a"
	}))
}

// TestStreamPanicOnASettleSendsTheFrame: the peer stream panics as it
// takes the worker's report that settled its op. Before, the report was
// lost: the stream counted the op unsettled for good and held its
// terminal frame forever (the generation side waited for its deadline),
// and the stream never stopped, holding its session's release (Done never
// came). Now the restarted stream handles it once more: the frame leaves
// and the transfer ends READY and DONE.
func TestStreamPanicOnASettleSendsTheFrame(t *testing.T) {
	transferThroughStreamPanic(t, streamPanicOnce(t, func(e actors.Effect) bool { return e == nil }))
}
