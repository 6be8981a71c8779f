//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/faulty"
)

// Panics of the engine's top-level actors (the tx and rx parents, the
// senders), injected by Engine.CrashParent. Each holds what no restart
// could rebuild (request tables and tombstones, sessions and handles, the
// allocation queue, the workers): the actor is resumed with its state and
// the engine fails — new requests are refused naming the panic, live ones
// go on and end as usual.

// TestParentPanicKeepsLiveRequests: a request whose first chunk is held by
// its fence when a top-level actor of either side panics ends READY with
// every byte once the fence fires and its last chunk comes; that engine
// refuses a new request naming the panic, and both close cleanly.
func TestParentPanicKeepsLiveRequests(t *testing.T) {
	for _, tc := range []struct{ side, which string }{
		{"ctx", "tx"}, {"ctx", "senders"}, {"gen", "rx"}, {"gen", "senders"},
	} {
		t.Run(tc.side+"-"+tc.which, func(t *testing.T) {
			ce, ge, c, rx, tx, src, f := heldChunk(t, "p")
			crashed := ce
			if tc.side == "gen" {
				crashed = ge
			}
			crashed.CrashParent(tc.which)
			waitUntil(t, "the panic to be handled", func() bool { return crashed.Stats().ParentPanics == 1 })
			o := finishHeld(t, ce, ge, rx, tx, src, f, 5, "after the "+tc.which+" panicked")
			var err error
			if tc.side == "ctx" {
				_, err = ce.Send(context.Background(), kvxfer.SendRequest{ID: "new", PromptLen: 64})
			} else {
				_, err = ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "new", PromptLen: 64, Context: "ctx"})
			}
			if !errors.Is(err, kvxfer.ErrEngineFailed) || !strings.Contains(err.Error(), tc.which) || !strings.Contains(err.Error(), "panicked") {
				t.Fatalf("a new request after the %s panicked: %v, want ErrEngineFailed naming the panic", tc.which, err)
			}
			if err := ge.FreeBlocks(o.Blocks); err != nil {
				t.Fatal(err)
			}
			if err := ce.Pools().Free(src); err != nil {
				t.Fatal(err)
			}
			checkNoLeaks(t, c)
		})
	}
}

// TestTxParentPanicSendsNoFalseCancelAck: the context side's write is
// posted and its completion withheld (a close of its endpoint proves
// nothing); its tx parent panics, then the generation side cancels. A
// parent restarted empty would not know the request and would acknowledge
// the Cancel — the generation side's proof to free blocks the pending
// write still reaches. The destination blocks must stay held or
// quarantined while the write is pending.
func TestTxParentPanicSendsNoFalseCancelAck(t *testing.T) {
	l := smallLayout()
	gate := faulty.NewGate()
	ce, ge := faultyPair(t, l, faulty.Slow(faulty.Always(), gate), faulty.WithUnprovenClose())
	t.Cleanup(gate.Open) // before the pair's close (cleanups run last first): the write completes, its CancelAck comes
	rx, tx := receiveAndSend(t, ce, ge, "fa", 1)
	waitUntil(t, "the write to be posted", func() bool { return gate.Held() > 0 })
	dest := ge.Pools().Used()
	ce.CrashParent("tx")
	rx.Cancel()
	if o := waitOutcome(t, rx.Done()); o.OK {
		t.Fatalf("rx %s after Cancel", o.Status)
	}
	// Either the context side's session heard the Cancel (its request is
	// decided; it cannot acknowledge while its write is pending) and the
	// generation side quarantined its blocks, or the blocks went back to
	// the pool on a false proof.
	freed := func() bool { return ge.Pools().Used() == 0 && ge.Pools().Quarantined() == 0 }
	waitUntil(t, "the Cancel to be heard and the blocks settled", func() bool {
		return freed() || (tx.Err() != nil && ge.Pools().Quarantined() == dest)
	})
	if gate.Held() == 0 {
		t.Fatal("the withheld write completed: the test proves nothing")
	}
	if freed() {
		t.Fatalf("the generation side freed its %d destination blocks while the context side's write to them is pending: a false proof", dest)
	}
}

// TestRxParentPanicKeepsTheQueue: a Receive waiting for destination
// blocks when the rx parent panics still starts once blocks are freed,
// and ends READY.
func TestRxParentPanicKeepsTheQueue(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ge := c.gen[0]
	held := holdFreeBlocks(t, ge)
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the request waits for blocks", func() bool { return ge.Stats().WaitingForBlocks == 1 })
	ge.CrashParent("rx")
	waitUntil(t, "the panic to be handled", func() bool { return ge.Stats().ParentPanics == 1 })
	if err := ge.FreeBlocks(held); err != nil {
		t.Fatal(err)
	}
	src := sendRequest(t, c, l, "q", 4, 64)
	o := waitOutcome(t, rx.Done())
	if !o.OK {
		t.Fatalf("queued rx %s %v after the rx parent panicked", o.Status, o.Err)
	}
	if n := verify(t, ge, l, 64, o.Blocks, 4); n == 0 {
		t.Fatal("no byte verified")
	}
	_ = ge.FreeBlocks(o.Blocks)
	_ = c.ctx[0].Pools().Free(src)
	checkNoLeaks(t, c)
}

// TestParentPanicsPastAnyBudget: eleven panics of the tx parent (past
// protoactor's default of ten restarts in ten seconds, after which it
// would stop the actor and Send would wait for its answer for good): Send
// is refused at once, naming the panic, and Close returns nil.
func TestParentPanicsPastAnyBudget(t *testing.T) {
	l := smallLayout()
	ce, _ := faultyPair(t, l)
	for range 11 {
		ce.CrashParent("tx")
	}
	waitUntil(t, "the panics to be handled", func() bool { return ce.Stats().ParentPanics == 11 })
	done := make(chan error, 1)
	go func() {
		_, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "after", PromptLen: 64})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, kvxfer.ErrEngineFailed) {
			t.Fatalf("Send after the panics: %v, want ErrEngineFailed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Send blocked after the tx parent's panics")
	}
}

// TestSessionPanicRunningEffectsRunsTheRest: a TxSession panics running
// the first of its release effects (an Unpin). Its step had moved on (the
// session released), so a restart that only stepped the panic would lose
// the rest — the other unpins, the outcome, the stop — and Done would
// never come. The next incarnation runs them: Done comes with the
// request's outcome, and only the dropped Unpin's blocks stay pinned (what
// the panicking effect did is not known: never unpinned early).
func TestSessionPanicRunningEffectsRunsTheRest(t *testing.T) {
	l := smallLayout()
	ce, ge := faultyPair(t, l)
	var dropped atomic.Pointer[actors.Unpin]
	hook := func(side string, e actors.Effect) bool {
		u, ok := e.(actors.Unpin)
		return side == "tx" && ok && dropped.CompareAndSwap(nil, &u)
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	rx, tx := receiveAndSend(t, ce, ge, "pe", 6)
	ro := waitOutcome(t, rx.Done())
	if !ro.OK {
		t.Fatalf("rx %s %v", ro.Status, ro.Err)
	}
	if n := verify(t, ge, l, 64, ro.Blocks, 6); n == 0 {
		t.Fatal("no byte verified")
	}
	o := waitOutcome(t, tx.Done())
	u := dropped.Load()
	if u == nil {
		t.Fatal("no Unpin ran: the test proves nothing")
	}
	if !o.OK {
		t.Fatalf("tx %s %v, want the request's outcome, DONE", o.Status, o.Err)
	}
	// Counted once the restarted incarnation's effects ran: after Done.
	waitUntil(t, "the session's panic to be counted", func() bool { return ce.Stats().SessionPanics == 1 })
	for g, st := range ce.Pools().Stats() {
		want := 0
		if g == u.Group {
			want = len(u.IDs)
		}
		if st.Pinned != want {
			t.Fatalf("group %d: %d blocks pinned after Done, want %d (the dropped Unpin's)", g, st.Pinned, want)
		}
	}
	_ = ge.FreeBlocks(ro.Blocks)
}

// TestListenerPanicFailsTheEngineNotTheProcess: the listener panics
// routing a peer's RequestData (a bug; frames are validated first). The
// serving process goes on: the frame is dropped, the engine fails — a new
// request is refused naming the panic — and a request already live on it
// still ends READY with every byte.
func TestListenerPanicFailsTheEngineNotTheProcess(t *testing.T) {
	ce, ge, _, rx, tx, src, f := heldChunk(t, "live")
	hook := func(f messages.Frame) bool {
		rd, ok := f.(*messages.RequestData)
		return ok && rd.RequestID == "boom"
	}
	actors.PanicOnRoute.Store(&hook)
	t.Cleanup(func() { actors.PanicOnRoute.Store(nil) })
	boom, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "boom", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the listener's panic to be handled", func() bool { return ce.Stats().ParentPanics == 1 })
	_, err = ce.Send(context.Background(), kvxfer.SendRequest{ID: "new", PromptLen: 64})
	if !errors.Is(err, kvxfer.ErrEngineFailed) || !strings.Contains(err.Error(), "listener panicked") {
		t.Fatalf("a new request after the listener panicked: %v, want ErrEngineFailed naming the panic", err)
	}
	o := finishHeld(t, ce, ge, rx, tx, src, f, 8, "after the listener panicked")
	boom.Cancel()
	waitOutcome(t, boom.Done())
	// Its RequestData reached the context side (whose listener dropped
	// it): only that side's CancelAck proves no write comes. It answers,
	// failed engine or not; the cleanup would close it first.
	select {
	case <-boom.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled request's writer never acknowledged: its blocks stay quarantined")
	}
	_ = ge.FreeBlocks(o.Blocks)
	_ = ce.Pools().Free(src)
}

// TestSessionPanicPastBudgetRunsTheRest: a session past its restart
// budget that panics running an effect is resumed, not restarted (no
// Started comes, and a released session waits for no further message):
// the effects left after the one that panicked (the other unpins, the
// outcome, the stop) still run. Done comes; only the dropped Unpin's
// blocks stay pinned.
func TestSessionPanicPastBudgetRunsTheRest(t *testing.T) {
	ce, _, _, _, tx, _, f := heldChunk(t, "pb")
	for i := int64(1); i <= 3; i++ {
		tx.Crash()
		waitUntil(t, "the restart", func() bool { return ce.Stats().SessionPanics == i })
	}
	var dropped atomic.Pointer[actors.Unpin]
	hook := func(side string, e actors.Effect) bool {
		u, ok := e.(actors.Unpin)
		return side == "tx" && ok && dropped.CompareAndSwap(nil, &u)
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	f.Fire(nil)
	o := waitOutcome(t, tx.Done())
	u := dropped.Load()
	if u == nil {
		t.Fatalf("tx %s %v with no Unpin run: the test proves nothing", o.Status, o.Err)
	}
	if got := ce.Stats().SessionPanicsPastBudget; got != 1 {
		t.Fatalf("session panics past the budget %d, want 1", got)
	}
	for g, st := range ce.Pools().Stats() {
		want := 0
		if g == u.Group {
			want = len(u.IDs)
		}
		if st.Pinned != want {
			t.Fatalf("group %d: %d blocks pinned after Done, want %d (the dropped Unpin's)", g, st.Pinned, want)
		}
	}
}

// finishHeld completes heldChunk's request: it writes request req's bytes
// into the sources, fires the held chunk's fence, hands the last chunk,
// and requires DONE and READY with every byte (why says when, for the
// failures). It returns the READY outcome.
func finishHeld(t *testing.T, ce, ge *kvxfer.Engine, rx *kvxfer.RxHandle, tx *kvxfer.TxHandle, src [][]kvcache.BlockID,
	f *kvxfer.ManualFence, req int, why string) kvxfer.Outcome {
	t.Helper()
	l := smallLayout()
	fillSource(ce, l, src, req)
	f.Fire(nil)
	c1 := kvcache.Chunk{Start: 32, End: 64, FirstBlock: 2, Last: true}
	if err := tx.Chunk(c1, []kvcache.BlockRun{{First: 2, IDs: src[0][2:]}, {First: 2, IDs: src[1][2:]}}, nil); err != nil {
		t.Fatalf("the live request's last chunk refused %s: %v", why, err)
	}
	if o := waitOutcome(t, tx.Done()); !o.OK {
		t.Fatalf("tx %s %v %s", o.Status, o.Err, why)
	}
	o := waitOutcome(t, rx.Done())
	if !o.OK {
		t.Fatalf("rx %s %v %s", o.Status, o.Err, why)
	}
	if n := verify(t, ge, l, 64, o.Blocks, req); n == 0 {
		t.Fatal("no byte verified")
	}
	return o
}

// receiveAndSend opens request id on both engines of a pair (64 tokens
// of smallLayout) and hands the whole prompt over as one chunk, filled
// with request req's bytes (sendFilled).
func receiveAndSend(t *testing.T, ce, ge *kvxfer.Engine, id string, req int) (*kvxfer.RxHandle, *kvxfer.TxHandle) {
	t.Helper()
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sendFilled(t, ce, tx, smallLayout(), 64, 64, req); err != nil {
		t.Fatal(err)
	}
	return rx, tx
}
