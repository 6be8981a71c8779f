package kvxfer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestOutcomesWrapTheExportedSentinels: the errors an embedder meets wrap
// sentinels it can name from package kvxfer alone: a fence that fails
// fails the context side with ErrFence and the generation side with
// ErrPeerFailed (the context rank's FAILED Result); a context side that
// cancels ends the generation side CANCELLED with ErrPeerCancelled (before:
// ErrPeerFailed only); Send, Receive and Pools().Alloc after Close are
// refused with ErrClosed. (Checked to fail: with the generation side's
// CANCELLED Result wrapping ErrPeerFailed, the cancel case fails.)
func TestOutcomesWrapTheExportedSentinels(t *testing.T) {
	ctx := context.Background()
	l := kvcache.Layout{Layers: 2, KVHeads: 2, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 16, Groups: kvcache.FullAttention(2)}
	link := control.NewMemLink()
	start := func(inst string) *kvxfer.Engine {
		e, err := kvxfer.Start(ctx, kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 1 << 20, Link: link, TransferTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	prefill, decode := start("prefill"), start("decode")
	run := func(id string, end func(tx *kvxfer.TxHandle, fence *kvxfer.ManualFence)) (tx, rx kvxfer.Outcome) {
		t.Helper()
		rh, err := decode.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: 40, Context: "prefill"})
		if err != nil {
			t.Fatal(err)
		}
		src, err := prefill.Pools().Alloc([]int{l.BlocksFor(40)})
		if err != nil {
			t.Fatal(err)
		}
		th, err := prefill.Send(ctx, kvxfer.SendRequest{ID: id, PromptLen: 40})
		if err != nil {
			t.Fatal(err)
		}
		c := kvcache.Chunk{Start: 0, End: 40, Last: true}
		fence := &kvxfer.ManualFence{}
		if err := th.Chunk(c, c.Runs(l.TokensPerBlock, src), fence); err != nil {
			t.Fatal(err)
		}
		end(th, fence)
		tx, rx = waitOutcome(t, th.Done()), waitOutcome(t, rh.Done())
		if err := prefill.Pools().Free(src); err != nil {
			t.Fatal(err)
		}
		return tx, rx
	}

	tx, rx := run("fence", func(_ *kvxfer.TxHandle, f *kvxfer.ManualFence) { f.Fire(errors.New("the kernel failed")) })
	if !errors.Is(tx.Err, kvxfer.ErrFence) || !errors.Is(rx.Err, kvxfer.ErrPeerFailed) || rx.Status != kvxfer.StatusFailed {
		t.Errorf("fence failed: context %s %v, want ErrFence; generation %s %v, want FAILED with ErrPeerFailed", tx.Status, tx.Err, rx.Status, rx.Err)
	}
	// Cancelled once its stream is open (an op of a first chunk posted),
	// with a second chunk behind its fence: the generation side hears
	// CANCELLED from the stream. (Cancelled before the RequestData came,
	// the answer depends on whether the session was still there.)
	{
		rh, err := decode.Receive(ctx, kvxfer.ReceiveRequest{ID: "cancel", PromptLen: 40, Context: "prefill"})
		if err != nil {
			t.Fatal(err)
		}
		src, err := prefill.Pools().Alloc([]int{l.BlocksFor(40)})
		if err != nil {
			t.Fatal(err)
		}
		th, err := prefill.Send(ctx, kvxfer.SendRequest{ID: "cancel", PromptLen: 40})
		if err != nil {
			t.Fatal(err)
		}
		posted := prefill.Stats().OpsPosted
		first, last := kvcache.Chunk{Start: 0, End: 32}, kvcache.Chunk{Start: 32, End: 40, FirstBlock: 2, Last: true}
		if err := th.Chunk(first, first.Runs(l.TokensPerBlock, src), nil); err != nil {
			t.Fatal(err)
		}
		fence := &kvxfer.ManualFence{}
		if err := th.Chunk(last, last.Runs(l.TokensPerBlock, src), fence); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for prefill.Stats().OpsPosted == posted {
			if time.Now().After(deadline) {
				t.Fatal("the first chunk's op was never posted")
			}
			time.Sleep(time.Millisecond) // poll with a deadline
		}
		th.Cancel()
		rx = waitOutcome(t, rh.Done())
		fence.Fire(nil)
		tx = waitOutcome(t, th.Done())
		if err := prefill.Pools().Free(src); err != nil {
			t.Fatal(err)
		}
	}
	if rx.Status != kvxfer.StatusCancelled || !errors.Is(rx.Err, kvxfer.ErrPeerCancelled) {
		t.Errorf("context side cancelled (its outcome %s %v): generation %s %v, want CANCELLED with ErrPeerCancelled", tx.Status, tx.Err, rx.Status, rx.Err)
	}

	for _, e := range []*kvxfer.Engine{prefill, decode} {
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := prefill.Send(ctx, kvxfer.SendRequest{ID: "late", PromptLen: 40}); !errors.Is(err, kvxfer.ErrClosed) {
		t.Errorf("Send after Close: %v, want ErrClosed", err)
	}
	if _, err := decode.Receive(ctx, kvxfer.ReceiveRequest{ID: "late", PromptLen: 40, Context: "prefill"}); !errors.Is(err, kvxfer.ErrClosed) {
		t.Errorf("Receive after Close: %v, want ErrClosed", err)
	}
	if _, err := prefill.Pools().Alloc([]int{1}); !errors.Is(err, kvxfer.ErrClosed) {
		t.Errorf("Pools().Alloc after Close: %v, want ErrClosed", err)
	}
}
