//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// TestLiveSilencedSessionAnswersRestartedReceiver: as
// TestSilencedRequestAnswersRestartedReceiver — a write cut without proof
// to a generation rank that then restarts and asks for the same id again
// — but the context side's session is still live when the new
// incarnation's RequestData comes: its last chunk's fence has not fired,
// so it holds that chunk's pins and cannot stop. The new incarnation
// never got a write of the request: it must be answered FAILED at once,
// as the parent answers it once the session has stopped. Before, the live
// session silenced the rank whatever its incarnation: the RequestData
// (not sent again) went unanswered, and the new incarnation's request
// waited for its deadline.
func TestLiveSilencedSessionAnswersRestartedReceiver(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	var cut atomic.Bool
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.WithSourcesReleased(),
		faulty.Cut(func(uint64, *rand.Rand) bool { return cut.CompareAndSwap(false, true) }))
	defer func() { _ = ag.Close() }()
	ce, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: ag, TransferTimeout: 10 * time.Minute, DrainGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Bounded: an engine with quarantined pages never drains.
	closeSoon := func(e *kvxfer.Engine) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	}
	defer closeSoon(ce)
	startGen := func() (*kvxfer.Engine, func()) {
		gag := loopback.New(loopback.WithNetwork(net))
		ge, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20,
			Link: link, Agent: gag, TransferTimeout: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return ge, func() { _ = gag.Close() }
	}
	ge, closeGag := startGen()
	defer closeGag()
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "lost", PromptLen: 64, Context: "ctx", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "lost", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(64, 32, l.TokensPerBlock)
	if err != nil || len(chunks) != 2 {
		t.Fatalf("chunks %v: %v", chunks, err)
	}
	// The first chunk's write is cut; the last chunk's fence is held. Both
	// are handed before the first fence fires: a write cut at once fails
	// the request, and a Chunk handed after that is refused.
	first, held := &kvxfer.ManualFence{}, &kvxfer.ManualFence{}
	if err := tx.Chunk(chunks[0], chunks[0].Runs(l.TokensPerBlock, src), first); err != nil {
		t.Fatal(err)
	}
	if err := tx.Chunk(chunks[1], chunks[1].Runs(l.TokensPerBlock, src), held); err != nil {
		t.Fatal(err)
	}
	first.Fire(nil)
	waitUntil(t, "the first write cut", func() bool { return cut.Load() })
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx outcome %s, want a failure", ro.Status)
	}
	select {
	case o := <-tx.Done():
		t.Fatalf("tx %s %v before its last chunk's fence fired: the test proves nothing", o.Status, o.Err)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := ge.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Fatalf("old generation engine Close: %v, want ErrUndrained (its pages are quarantined)", err)
	}

	ge2, closeGag2 := startGen()
	defer closeGag2()
	defer closeSoon(ge2)
	rx2, err := ge2.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "lost", PromptLen: 64, Context: "ctx", Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var o kvxfer.Outcome
	select {
	case o = <-rx2.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("the new incarnation's request unanswered 60 s on: the live session silenced it")
	}
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerFailed) {
		t.Fatalf("the new incarnation's request: %s %v, want FAILED by the context side", o.Status, o.Err)
	}
	waitUntil(t, "the new incarnation's blocks released", func() bool { return ge2.Stats().QuarantinedBytes == 0 })
	select {
	case o := <-tx.Done():
		t.Fatalf("tx %s %v before its last chunk's fence fired", o.Status, o.Err)
	default:
	}
	held.Fire(nil)
	if o := waitOutcome(t, tx.Done()); o.OK {
		t.Fatalf("tx outcome %s, want a failure", o.Status)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free the source blocks after Done: %v", err)
	}
}
