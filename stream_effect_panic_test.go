//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestSessionPanicRunningAStreamEffectStillEnds: a TxSession panics
// running an effect for one of its peer streams — a Submit (the op the
// step marked SUBMITTING), or the stream's terminal SendFrame (its SUCCESS
// Result) — or a chunk's WatchFence. The stream never took it, so nothing
// would ever report it: dropped, the op stayed SUBMITTING (the session
// never drained, its pins held), the generation side, with no deadline,
// waited for the Result for good, or the chunk's fence was never watched. Both sides must end: the context side's Done with every pin
// dropped, the generation side's outcome and Released, and Close clean;
// and they must agree: the SUCCESS Result's SendFrame runs again, the
// Result leaves, and the context side ends DONE (before, FAILED by the
// restart's crash while the generation side ended READY).
func TestSessionPanicRunningAStreamEffectStillEnds(t *testing.T) {
	for _, name := range []string{"core.Submit", "core.SendFrame", "core.WatchFence"} {
		t.Run(name, func(t *testing.T) { testPanicRunning(t, name) })
	}
}

func testPanicRunning(t *testing.T, name string) {
	l := smallLayout()
	ce, ge := faultyPair(t, l)
	var hit atomic.Bool
	hook := func(side string, e actors.Effect) bool {
		return side == "tx" && fmt.Sprintf("%T", e) == name && hit.CompareAndSwap(false, true)
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	rx, tx := receiveAndSend(t, ce, ge, "sub", 3)
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after a panic running a %s (hook hit %v): the session never drains", name, hit.Load())
	}
	if !hit.Load() {
		t.Fatalf("no %s ran: the test proves nothing", name)
	}
	// A panic before the SUCCESS Result was handed over fails the
	// request; the Result's own SendFrame runs again, the Result leaves,
	// and the context side must agree with the generation side's READY.
	success := name == "core.SendFrame"
	if o.OK != success {
		t.Fatalf("tx %s (%v): want OK %v", o.Status, o.Err, success)
	}
	for g, st := range ce.Pools().Stats() {
		if st.Pinned != 0 {
			t.Fatalf("group %d: %d blocks pinned after Done", g, st.Pinned)
		}
	}
	// The generation side ends too: FAILED, or READY with every byte
	// when the Result the step decided had left (a SendFrame run again).
	ro := waitOutcome(t, rx.Done())
	if ro.OK != o.OK {
		t.Fatalf("tx %s (%v), rx %s (%v): the sides disagree", o.Status, o.Err, ro.Status, ro.Err)
	}
	if ro.OK {
		if n := verify(t, ge, l, 64, ro.Blocks, 3); n == 0 {
			t.Fatal("no byte verified")
		}
		_ = ge.FreeBlocks(ro.Blocks)
	}
	select {
	case <-rx.Released():
	case <-time.After(20 * time.Second):
		t.Fatal("rx never released")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range []interface{ Close(context.Context) error }{ce, ge} {
		if err := e.Close(ctx); err != nil {
			t.Fatalf("close: %v", err)
		}
	}
}

// watchedFence is a ManualFence that counts its OnReady calls.
type watchedFence struct {
	kvxfer.ManualFence
	watched atomic.Int32
}

func (f *watchedFence) OnReady(cb func(error)) {
	f.watched.Add(1)
	f.ManualFence.OnReady(cb)
}

// TestSessionPanicRunningWatchFenceWatchesTheChunksFence: the WatchFence a
// panic interrupted runs again with the chunk's own fence (not one that
// has fired): the session watches it, and ends only once it fires. One
// that panics again, as it runs again, is dropped — and watched anyway:
// it touches no page and no peer. Before, nothing watched that fence: the
// chunk stayed pinned and unfired for good, the session never drained,
// Done never came, and Close reported it draining.
func TestSessionPanicRunningWatchFenceWatchesTheChunksFence(t *testing.T) {
	for _, panics := range []int32{1, 2} {
		t.Run(fmt.Sprint(panics), func(t *testing.T) { testPanicRunningWatchFence(t, panics) })
	}
}

func testPanicRunningWatchFence(t *testing.T, panics int32) {
	l := smallLayout()
	ce, ge := faultyPair(t, l)
	var n atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		_, ok := e.(actors.WatchFence)
		return side == "tx" && ok && n.Add(1) <= panics
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "wf", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "wf", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	f := &watchedFence{}
	c := kvcache.Chunk{Start: 0, End: 64, Last: true}
	if err := tx.Chunk(c, c.Runs(l.TokensPerBlock, src), f); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the chunk's own fence watched after the panics", func() bool { return f.watched.Load() == 1 })
	if got := n.Load(); got < panics {
		t.Fatalf("%d WatchFence runs, want %d panics: the test proves nothing", got, panics)
	}
	select {
	case o := <-tx.Done():
		t.Fatalf("tx %s %v before the chunk's fence fired", o.Status, o.Err)
	default:
	}
	f.Fire(nil)
	if o := waitOutcome(t, tx.Done()); o.OK {
		t.Fatalf("tx %s: want the request failed by the panic", o.Status)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("source blocks after Done: %v", err)
	}
	waitOutcome(t, rx.Done())
	select {
	case <-rx.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("the generation side never released")
	}
}
