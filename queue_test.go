package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestQueuedReceiveStartsWhenBlocksFree: a Receive that finds too few
// free destination blocks waits for them (counted by
// Stats.WaitingForBlocks and kvxfer_requests_waiting_for_blocks until it
// leaves the queue) and starts, then completes with every byte, once
// blocks are freed: the pools' free hook wakes the allocation queue
// while something waits in it (and only then). Checked to fail with the
// hook's wake-up never sent: the request then waits for its deadline.
func TestQueuedReceiveStartsWhenBlocksFree(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	gen := c.gen[0]
	held := holdFreeBlocks(t, gen)
	if n := gen.Stats().WaitingForBlocks; n != 0 {
		t.Fatalf("WaitingForBlocks %d before any request", n)
	}
	// A waiting request is counted (stat and gauge) until it leaves the
	// queue, here by its cancel.
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "cancelled", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the request waits for destination blocks", func() bool { return gen.Stats().WaitingForBlocks == 1 })
	if g := scrape(t, gen, "gen/0").get(t, "kvxfer_requests_waiting_for_blocks"); g != 1 {
		t.Fatalf("kvxfer_requests_waiting_for_blocks %v with one request waiting", g)
	}
	rx.Cancel()
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("cancelled while waiting: %s %v", o.Status, o.Err)
	}
	waitUntil(t, "the cancelled request leaves the queue", func() bool { return gen.Stats().WaitingForBlocks == 0 })
	if g := scrape(t, gen, "gen/0").get(t, "kvxfer_requests_waiting_for_blocks"); g != 0 {
		t.Fatalf("kvxfer_requests_waiting_for_blocks %v with none waiting", g)
	}
	// One that waits starts when blocks are freed.
	freed := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for gen.Stats().WaitingForBlocks != 1 {
			if time.Now().After(deadline) {
				freed <- errors.New("no receive waited for destination blocks within 10s")
				return
			}
			time.Sleep(time.Millisecond)
		}
		freed <- gen.Pools().Free(held)
	}()
	transfer(t, c, l, "waits", 1, 64, 32, true)
	if err := <-freed; err != nil {
		t.Fatal(err)
	}
	if n := gen.Stats().WaitingForBlocks; n != 0 {
		t.Fatalf("WaitingForBlocks %d after the request completed", n)
	}
	// With nothing waiting, requests come and go as before.
	for i := range 3 {
		transfer(t, c, l, fmt.Sprint("after-", i), 2+i, 100, 32, i%2 == 0)
	}
	checkNoLeaks(t, c)
}

// TestReceiveRefusesBadPrefixHits: prefix hits that no prompt can have
// (negative, past the prompt's blocks, more groups than the layout has)
// are refused by Receive, naming the group and the value, instead of
// being read as 0 or as the whole prompt (a READY of 0 bytes for blocks
// nothing wrote). A hit of every block is a valid request.
func TestReceiveRefusesBadPrefixHits(t *testing.T) {
	l := smallLayout() // 16 tokens per block: 64 tokens are 4 blocks
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	gen := c.gen[0]
	for _, tc := range []struct {
		hits []int
		want string
	}{
		{[]int{-3, 0}, "layer group 0 = -3 blocks, want 0..4"},
		{[]int{0, 99}, "layer group 1 = 99 blocks, want 0..4"},
		{[]int{0, 0, 0}, "prefix hits for 3 layer groups, the layout has 2"},
	} {
		_, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "bad-hits", PromptLen: 64, Context: "ctx", PrefixHitBlocks: tc.hits})
		if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Receive with prefix hits %v = %v, want ErrBadRequest with %q", tc.hits, err, tc.want)
		}
	}
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "all-hit", PromptLen: 64, Context: "ctx", PrefixHitBlocks: []int{4, 4}})
	if err != nil {
		t.Fatalf("Receive with every block a prefix hit: %v", err)
	}
	rx.Cancel()
	waitOutcome(t, rx.Done())
}

// TestQueueTimeoutNamesWhy: a Receive that times out in the allocation
// queue says why it waited — here the quarantine bound, hit while blocks
// are free, which no free of the pool changes — and how many still wait.
// Before, the pools' refusal was dropped and the error said only that the
// request "waited for destination blocks".
func TestQueueTimeoutNamesWhy(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	gen := c.gen[0]
	fillQuarantine(t, gen)
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q", PromptLen: 64, Context: "ctx", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	if o.Status != kvxfer.StatusTimedOut || o.Err == nil || !strings.Contains(o.Err.Error(), "quarantine full") ||
		!strings.Contains(o.Err.Error(), "0 other requests still queued") {
		t.Fatalf("a request that waited on a full quarantine ended %s: %v; want TIMED_OUT naming the quarantine bound", o.Status, o.Err)
	}
	if !errors.Is(o.Err, kvxfer.ErrTimeout) || !errors.Is(o.Err, actors.ErrQuarantineFull) || !errors.Is(o.Err, kvcache.ErrOutOfBlocks) {
		t.Fatalf("a request that waited on a full quarantine: %v, want ErrTimeout wrapping ErrQuarantineFull (kvcache.ErrOutOfBlocks)", o.Err)
	}
}

// TestQueueTimeoutWrapsOutOfBlocks: a Receive that waits for blocks of a
// full pool and hits its deadline ends TIMED_OUT with an error wrapping
// ErrTimeout and kvcache.ErrOutOfBlocks, naming the blocks it lacked.
// Before, ErrOutOfBlocks was only in the text. (Checked to fail with the
// queue's timeout wrapping ErrTimeout only.)
func TestQueueTimeoutWrapsOutOfBlocks(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	gen := c.gen[0]
	held := holdFreeBlocks(t, gen)
	t.Cleanup(func() { _ = gen.FreeBlocks(held) })
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q", PromptLen: 64, Context: "ctx", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	if o.Status != kvxfer.StatusTimedOut || !errors.Is(o.Err, kvxfer.ErrTimeout) || !errors.Is(o.Err, kvcache.ErrOutOfBlocks) ||
		!strings.Contains(o.Err.Error(), "0 free") {
		t.Fatalf("a request that waited on a full pool ended %s: %v; want TIMED_OUT wrapping ErrTimeout and kvcache.ErrOutOfBlocks", o.Status, o.Err)
	}
}

// TestRaisedQuarantineLimitWakesTheQueue: a Receive waiting because the
// quarantine bound is hit leaves the queue as soon as the bound is raised
// (Pools.SetQuarantineLimit wakes the queue as a free does); before, it
// waited for some later free, or its deadline.
func TestRaisedQuarantineLimitWakesTheQueue(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	gen := c.gen[0]
	fillQuarantine(t, gen)
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "w", PromptLen: 64, Context: "ctx", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the receive queued behind the quarantine bound", func() bool { return gen.Stats().WaitingForBlocks == 1 })
	gen.Pools().SetQuarantineLimit(0)
	waitFor(t, "the receive out of the queue once the bound is raised", func() bool { return gen.Stats().WaitingForBlocks == 0 })
	rx.Cancel()
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("cancelled receive ended %s: %v", o.Status, o.Err)
	}
}

// fillQuarantine quarantines two blocks of each of gen's groups with the
// quarantine bound at 1 byte: every allocation waits (ErrQuarantineFull)
// while blocks are free. Undone at the test's end.
func fillQuarantine(t *testing.T, gen *kvxfer.Engine) {
	t.Helper()
	counts := make([]int, len(gen.Pools().Stats()))
	for g := range counts {
		counts[g] = 2
	}
	blocks, err := gen.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	gen.Pools().SetQuarantineLimit(1)
	if err := gen.Pools().Quarantine(blocks); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gen.Pools().SetQuarantineLimit(0)
		_ = gen.Pools().ReleaseQuarantine(blocks)
	})
}
