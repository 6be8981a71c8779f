package kvxfer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// A second Receive of a request that waits in the allocation queue is
// refused as one of a started request is: accepted, both started once
// blocks were freed, the second overwrote the first's table entry, and
// the first's blocks stayed quarantined for good (found by a review).
func TestReceiveOfAQueuedRequestRefused(t *testing.T) {
	c := startCluster(t, smallLayout(), kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	gen := c.gen[0]
	held := holdFreeBlocks(t, gen)
	a, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "dup", PromptLen: 64, Context: "ctx", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the first Receive queued", func() bool { return gen.Stats().WaitingForBlocks == 1 })
	b, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "dup", PromptLen: 64, Context: "ctx", Timeout: time.Minute})
	if err == nil {
		b.Cancel()
		t.Fatalf("a second Receive of queued request dup was accepted (waiting for blocks: %d)", gen.Stats().WaitingForBlocks)
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "dup already receiving") {
		t.Fatalf("second Receive: %v, want ErrBadRequest naming dup", err)
	}
	a.Cancel()
	if o := waitOutcome(t, a.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("first Receive: %s (%v), want cancelled", o.Status, o.Err)
	}
	if err := gen.Pools().Free(held); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}

// When the request at the head of the allocation queue leaves it
// (cancelled, or its deadline passed), the requests behind it that fit
// start at once; they waited for an unrelated free or their own deadline
// (found by a review).
func TestQueueHeadLeavingStartsTheNext(t *testing.T) {
	for _, how := range []string{"cancel", "timeout"} {
		t.Run(how, func(t *testing.T) {
			c := startCluster(t, smallLayout(), kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
			gen := c.gen[0]
			held := holdFreeBlocks(t, gen)
			// 8 blocks of each group back: a 64-token request (4 + 3
			// blocks) fits, a 256-token one (16 + 3) does not.
			if err := gen.Pools().Free([][]kvcache.BlockID{held[0][:8], held[1][:8]}); err != nil {
				t.Fatal(err)
			}
			held = [][]kvcache.BlockID{held[0][8:], held[1][8:]}
			headTimeout := time.Minute
			if how == "timeout" {
				headTimeout = 100 * time.Millisecond
			}
			big, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "big", PromptLen: 256, Context: "ctx", Timeout: headTimeout})
			if err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "big queued", func() bool { return gen.Stats().WaitingForBlocks == 1 })
			small, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "small", PromptLen: 64, Context: "ctx", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "small queued behind big", func() bool { return gen.Stats().WaitingForBlocks == 2 })
			if how == "cancel" {
				big.Cancel()
			}
			waitOutcome(t, big.Done())
			// small's deadline is a minute away: only the head leaving can
			// start it within waitUntil's deadline.
			waitUntil(t, "small started once the head left the queue", func() bool { return gen.Stats().WaitingForBlocks == 0 })
			small.Cancel()
			waitOutcome(t, small.Done())
			if err := gen.Pools().Free(held); err != nil {
				t.Fatal(err)
			}
			checkNoLeaks(t, c)
		})
	}
}

// A Receive that needs no destination block (each one a prefix hit)
// starts while the allocation queue's head waits for blocks, and
// completes: held behind the head, it waited for blocks it does not need
// — for as long as the head did, to its own deadline when no block came
// back (found by a review; the pools already let such an allocation pass
// a full quarantine, but only at the head).
func TestQueueStartsANoBlockReceiveBehindAWaitingHead(t *testing.T) {
	l := smallLayout() // 16 tokens per block: 64 tokens are 4 blocks
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	gen, ctxE := c.gen[0], c.ctx[0]
	held := holdFreeBlocks(t, gen)
	big, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "big", PromptLen: 64, Context: "ctx", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "big queued", func() bool { return gen.Stats().WaitingForBlocks == 1 })
	hit, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "all-hit", PromptLen: 64, Context: "ctx",
		PrefixHitBlocks: []int{4, 4}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(64)
	}
	src, err := ctxE.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ctxE.Send(context.Background(), kvxfer.SendRequest{ID: "all-hit", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(64, 64, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chunks {
		f := &kvxfer.ManualFence{}
		if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), f); err != nil {
			t.Fatal(err)
		}
		f.Fire(nil)
	}
	// big waits for a minute: only a start behind it ends all-hit within
	// waitOutcome's bound.
	if o := waitOutcome(t, hit.Done()); !o.OK || o.Bytes != 0 {
		t.Fatalf("all-hit behind a waiting head: %s ok=%v %d bytes (%v), want READY with 0 bytes", o.Status, o.OK, o.Bytes, o.Err)
	}
	if o := waitOutcome(t, tx.Done()); !o.OK {
		t.Fatalf("all-hit's send: %s (%v)", o.Status, o.Err)
	}
	if n := gen.Stats().WaitingForBlocks; n != 1 {
		t.Fatalf("WaitingForBlocks %d, want big still waiting", n)
	}
	if err := ctxE.Pools().Free(src); err != nil {
		t.Fatal(err)
	}
	big.Cancel()
	waitOutcome(t, big.Done())
	if err := gen.Pools().Free(held); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}
