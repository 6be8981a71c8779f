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

// TestStreamPanicTwiceOnAFlushStillFlushes: over a backend whose
// completions do not prove delivery (faulty's: every stream flushes before
// its SUCCESS Result), the peer stream panics on its Flush twice — as it
// takes it, and as it handles it again — so it drops it. Before, nothing
// ever asked the worker for that flush again: the session waited for a
// TxFlushed that could not come, and the request (both sides) waited for
// its deadline (here ten minutes). Now a dropped Flush is handed to the
// worker anyway (it touches no page; a second one, had the first reached
// the worker, is ignored by the step): the transfer ends READY and DONE.
func TestStreamPanicTwiceOnAFlushStillFlushes(t *testing.T) {
	var n atomic.Int32
	hook := func(e actors.Effect) bool {
		_, ok := e.(actors.Flush)
		return ok && n.Add(1) <= 2
	}
	actors.PanicOnStream.Store(&hook)
	t.Cleanup(func() { actors.PanicOnStream.Store(nil) })
	l := smallLayout()
	ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = 10 * time.Minute })
	rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "f", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "f", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, ce, th, l, 64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	var o kvxfer.Outcome
	select {
	case o = <-th.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("no tx outcome 60 s after its stream dropped its Flush (%d panics): it waits for its deadline", n.Load())
	}
	if got := n.Load(); got < 2 {
		t.Fatalf("%d Flush panics injected, want 2: the test proves nothing", got)
	}
	if !o.OK {
		t.Fatalf("tx %s (%v), want DONE: the dropped Flush is handed to the worker", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free the source blocks after Done: %v", err)
	}
	ro := waitOutcome(t, rh.Done())
	if !ro.OK {
		t.Fatalf("rx %s (%v), want READY", ro.Status, ro.Err)
	}
	if n := verify(t, ge, l, 64, ro.Blocks, 1); n == 0 {
		t.Fatal("no byte verified")
	}
	select {
	case <-rh.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx never released its blocks")
	}
	if err := ge.FreeBlocks(ro.Blocks); err != nil {
		t.Fatal(err)
	}
	if v := ce.Stats().StreamViolations; v != 0 {
		t.Fatalf("%d stream violations", v)
	}
}
