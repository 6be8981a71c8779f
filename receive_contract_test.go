package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// gatedLink holds the generation engine's Hello lookups of context peers
// while armed: the rx parent asks for its writers' Hello in start(), which
// runs after Receive's reply has been sent.
type gatedLink struct {
	*control.MemLink
	mu      sync.Mutex
	gate    chan struct{} // nil: open
	entered chan struct{}
}

func (l *gatedLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	l.mu.Lock()
	g, e := l.gate, l.entered
	l.mu.Unlock()
	if g != nil && peer.Instance == "ctx" {
		select {
		case e <- struct{}{}:
		default:
		}
		<-g
	}
	return l.MemLink.Hello(peer)
}

func (l *gatedLink) arm() {
	l.mu.Lock()
	l.gate, l.entered = make(chan struct{}), make(chan struct{}, 1)
	l.mu.Unlock()
}

func (l *gatedLink) open() {
	l.mu.Lock()
	close(l.gate)
	l.gate = nil
	l.mu.Unlock()
}

// neededCounts is how many destination blocks of each layer group a
// receive of promptLen tokens without prefix hits takes.
func neededCounts(l kvcache.Layout, promptLen int) []int {
	counts := make([]int, len(l.Groups))
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
		counts[g] = end - first
	}
	return counts
}

// TestReceiveCopiesCallerBlocks: a framework passes its own blocks in
// ReceiveRequest.Blocks from a table it reuses once Receive returns (here
// for its next request, while the rx parent has not started the first:
// its writer's Hello lookup is held). Each receive writes the blocks it
// was given: READY hands those back with the request's bytes, and no two
// live receives share one.
func TestReceiveCopiesCallerBlocks(t *testing.T) {
	l := smallLayout()
	var gl *gatedLink
	c := startClusterOn(t, l, tp1, tp1, 2, clusterOpts{link: func(inst string, ml *control.MemLink) control.Link {
		if inst == "gen" {
			gl = &gatedLink{MemLink: ml}
			return gl
		}
		return ml
	}})
	gen := c.gen[0]
	counts := neededCounts(l, 64)
	a, err := gen.Pools().Alloc(counts) // r1's blocks
	if err != nil {
		t.Fatal(err)
	}
	b, err := gen.Pools().Alloc(counts) // the framework's next request's blocks
	if err != nil {
		t.Fatal(err)
	}
	aCopy := [][]kvcache.BlockID{slices.Clone(a[0]), slices.Clone(a[1])}
	buf := [][]kvcache.BlockID{slices.Clone(a[0]), slices.Clone(a[1])} // the framework's reusable block table

	gl.arm()
	rx1, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r1", PromptLen: 64, Context: "ctx", Blocks: buf})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-gl.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("rx parent never looked up its writer")
	}
	// Receive has returned: the framework reuses its table for r2.
	copy(buf[0], b[0])
	copy(buf[1], b[1])
	gl.open()
	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r2", PromptLen: 64, Context: "ctx", Blocks: buf})
	if err != nil {
		t.Logf("r2 refused: %v", err)
	}
	src1 := sendRequest(t, c, l, "r1", 1, 64)
	o1 := waitOutcome(t, rx1.Done())
	if !o1.OK {
		t.Fatalf("r1 %s %v", o1.Status, o1.Err)
	}
	t.Logf("r1 was given blocks %v; READY says %v", aCopy, o1.Blocks)
	checkReady(t, gen, l, 64, aCopy, 1, "r1 READY, but the blocks it was given are not written")
	if rx2 == nil {
		t.Fatal("r2 refused")
	}
	src2 := sendRequest(t, c, l, "r2", 2, 64)
	o2 := waitOutcome(t, rx2.Done())
	t.Logf("r2 (given %v) %s, READY says %v", b, o2.Status, o2.Blocks)
	for g := range o1.Blocks {
		for _, id := range o1.Blocks[g] {
			if slices.Contains(o2.Blocks[g], id) {
				t.Errorf("two live receives r1 and r2 both READY in group %d block %d", g, id)
				break
			}
		}
	}
	checkReady(t, gen, l, 64, o1.Blocks, 1, "r1's READY blocks")
	_ = c.ctx[0].Pools().Free(src1)
	_ = c.ctx[0].Pools().Free(src2)
}

// TestQueuedReceiveKeepsItsPrefixHits: a Receive waiting for blocks (the
// pool full) starts with the prefix hits it was given, though the caller
// reused their slice meanwhile: READY holds the blocks past the hits, with
// their bytes.
func TestQueuedReceiveKeepsItsPrefixHits(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	gen := c.gen[0]
	held := holdFreeBlocks(t, gen)
	hits := []int{2, 2}
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx", PrefixHitBlocks: hits})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the request waits for blocks", func() bool { return gen.Stats().WaitingForBlocks == 1 })
	// Receive has returned: the framework reuses its hit buffer.
	hits[0], hits[1] = 0, 0
	if err := gen.FreeBlocks(held); err != nil {
		t.Fatal(err)
	}
	src := sendRequest(t, c, l, "r", 7, 64)
	o := waitOutcome(t, rx.Done())
	if !o.OK {
		t.Fatalf("rx %s %v (a refusal would be acceptable; wrong bytes are not)", o.Status, o.Err)
	}
	t.Logf("READY blocks %v", o.Blocks)
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(64, grp.Window, l.TokensPerBlock, 2)
		if len(o.Blocks[g]) != end-first {
			t.Errorf("group %d: READY hands %d blocks, the request (hits 2) needs %d", g, len(o.Blocks[g]), end-first)
		}
		if bad := checkFrom(gen, l, g, o.Blocks[g], first, 7); bad != "" {
			t.Errorf("READY with wrong bytes: %s", bad)
		}
	}
	_ = gen.FreeBlocks(o.Blocks)
	_ = c.ctx[0].Pools().Free(src)
}

// TestFreeLentBlocksNotAllocatedToAnotherReceive: a framework passes ids
// free in kvxfer's pool (it allocates elsewhere), the very ids kvxfer's
// allocator would hand out next; a concurrent Receive that lets kvxfer
// allocate gets other blocks, and both end READY with their own bytes.
func TestFreeLentBlocksNotAllocatedToAnotherReceive(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	gen := c.gen[0]
	counts := neededCounts(l, 64)
	probe, err := gen.Pools().Alloc(counts) // learn the next ids the allocator hands out
	if err != nil {
		t.Fatal(err)
	}
	if err := gen.FreeBlocks(probe); err != nil {
		t.Fatal(err)
	}
	ids := [][]kvcache.BlockID{slices.Clone(probe[0]), slices.Clone(probe[1])} // free in the pool
	rx1, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "own", PromptLen: 64, Context: "ctx", Blocks: ids})
	if err != nil {
		t.Fatal(err)
	}
	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "alloc", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src1 := sendRequest(t, c, l, "own", 1, 64)
	src2 := sendRequest(t, c, l, "alloc", 2, 64)
	o1, o2 := waitOutcome(t, rx1.Done()), waitOutcome(t, rx2.Done())
	if !o1.OK || !o2.OK {
		t.Fatalf("own %s %v, alloc %s %v", o1.Status, o1.Err, o2.Status, o2.Err)
	}
	t.Logf("own's blocks %v, alloc's blocks %v", o1.Blocks, o2.Blocks)
	for g := range o1.Blocks {
		for _, id := range o1.Blocks[g] {
			if slices.Contains(o2.Blocks[g], id) {
				t.Errorf("two live receives both READY share group %d block %d", g, id)
			}
		}
	}
	checkReady(t, gen, l, 64, o1.Blocks, 1, "own READY")
	_ = gen.FreeBlocks(o2.Blocks)
	_ = c.ctx[0].Pools().Free(src1)
	_ = c.ctx[0].Pools().Free(src2)
}

// TestStaleHandleCancelLeavesReusedID: a handle's Cancel after its
// request ended (a deferred Cancel) does not cancel a later request that
// reuses the id (allowed once the first is released): the second ends
// READY with its bytes. The first x waits for a context instance that is
// not up, and is cancelled: the context side never heard of it.
func TestStaleHandleCancelLeavesReusedID(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	gen := c.gen[0]
	rx1, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "x", PromptLen: 64, Context: "ctx-b"})
	if err != nil {
		t.Fatal(err)
	}
	rx1.Cancel()
	if o1 := waitOutcome(t, rx1.Done()); o1.OK {
		t.Fatalf("first x %s %v", o1.Status, o1.Err)
	}
	<-rx1.Released()
	var rx2 *kvxfer.RxHandle
	waitUntil(t, "the id x is free again", func() bool {
		rx2, err = gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "x", PromptLen: 64, Context: "ctx"})
		return err == nil
	})
	rx1.Cancel() // the first request's handle, e.g. a deferred Cancel
	// A Receive of the same id is answered by the rx parent after it
	// handled that Cancel: had it cancelled the second x, the session's
	// RxCancel would now be ahead of any frame of the send below.
	if _, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "x", PromptLen: 64, Context: "ctx"}); err == nil {
		t.Fatal("a third x was taken while the second is live")
	}
	src2 := sendRequest(t, c, l, "x", 2, 64)
	o2 := waitOutcome(t, rx2.Done())
	if !o2.OK {
		t.Fatalf("the second x ended %s (%v) after the first request's handle was cancelled", o2.Status, o2.Err)
	}
	checkReady(t, gen, l, 64, o2.Blocks, 2, "second x READY")
	_ = gen.FreeBlocks(o2.Blocks)
	_ = c.ctx[0].Pools().Free(src2)
}

// TestReceiveBlocksReusedAtOnce: an ordinary caller that overwrites its
// block table as soon as Receive returns (under -race, a race with the rx
// parent's start had Receive kept it) gets READY on the blocks it gave.
func TestReceiveBlocksReusedAtOnce(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	gen := c.gen[0]
	counts := neededCounts(l, 64)
	a, err := gen.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	buf := [][]kvcache.BlockID{slices.Clone(a[0]), slices.Clone(a[1])}
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx", Blocks: buf})
	if err != nil {
		t.Fatal(err)
	}
	for g := range buf { // reuse the table once Receive returned
		for i := range buf[g] {
			buf[g][i] = -1
		}
	}
	src := sendRequest(t, c, l, "r", 1, 64)
	o := waitOutcome(t, rx.Done())
	if !o.OK {
		t.Fatalf("rx %s %v", o.Status, o.Err)
	}
	for g, grp := range l.Groups {
		first, _ := kvcache.NeededRange(64, grp.Window, l.TokensPerBlock, 0)
		if !slices.Equal(o.Blocks[g], a[g]) {
			t.Errorf("group %d: READY hands %v, the request was given %v", g, o.Blocks[g], a[g])
		}
		if bad := checkFrom(gen, l, g, a[g], first, 1); bad != "" {
			t.Errorf("READY: %s", bad)
		}
	}
	_ = c.ctx[0].Pools().Free(src)
	_ = gen.FreeBlocks(a)
}

// TestFreeLentBlocksFreeAgainAfterRelease: the framework's blocks that
// were free in kvxfer's pool are reserved while its receive may be
// written (TestFreeLentBlocksNotAllocatedToAnotherReceive), and free again
// once that receive is released after a failure: a receive waiting in the
// allocation queue for them starts then, and ends READY.
func TestFreeLentBlocksFreeAgainAfterRelease(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	gen := c.gen[0]
	counts := neededCounts(l, 64)
	held := holdFreeBlocks(t, gen)
	own, rest := make([][]kvcache.BlockID, len(held)), make([][]kvcache.BlockID, len(held))
	for g := range held {
		own[g], rest[g] = held[g][:counts[g]], held[g][counts[g]:]
	}
	if err := gen.FreeBlocks(own); err != nil { // the framework's: free in kvxfer's pool
		t.Fatal(err)
	}
	rxOwn, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "own", PromptLen: 64, Context: "ctx-b", Blocks: own})
	if err != nil {
		t.Fatal(err)
	}
	rxQ, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q", PromptLen: 64, Context: "ctx", Timeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "q waits for blocks", func() bool { return gen.Stats().WaitingForBlocks == 1 })
	rxOwn.Cancel()
	if o := waitOutcome(t, rxOwn.Done()); o.OK {
		t.Fatalf("own %s %v", o.Status, o.Err)
	}
	<-rxOwn.Released()
	src := sendRequest(t, c, l, "q", 3, 64)
	o := waitOutcome(t, rxQ.Done())
	if !o.OK {
		t.Fatalf("q %s %v: the blocks of the released receive never went back to the pool", o.Status, o.Err)
	}
	checkReady(t, gen, l, 64, o.Blocks, 3, "q READY")
	if err := gen.FreeBlocks(o.Blocks); err != nil {
		t.Fatal(err)
	}
	if err := gen.FreeBlocks(rest); err != nil {
		t.Fatal(err)
	}
	_ = c.ctx[0].Pools().Free(src)
}

// checkReady checks that blocks (per group, a prompt of promptLen tokens
// without prefix hits) hold request req's bytes; what names them.
func checkReady(t *testing.T, e *kvxfer.Engine, l kvcache.Layout, promptLen int, blocks [][]kvcache.BlockID, req int, what string) {
	t.Helper()
	for g, grp := range l.Groups {
		first, _ := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
		if bad := checkFrom(e, l, g, blocks[g], first, req); bad != "" {
			t.Errorf("%s: %s", what, bad)
		}
	}
}

// TestSendCopiesItsPayload: a caller that reuses its payload buffer once
// Send returned (for its next request) does not change what this
// request's READY carries.
func TestSendCopiesItsPayload(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ce, ge := c.ctx[0], c.gen[0]
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "pl", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	buf := []byte("tok-A")
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "pl", PromptLen: 64, Payload: buf})
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "tok-B") // the caller's buffer, reused for its next request
	c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := tx.Chunk(c0, c0.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	waitOutcome(t, tx.Done())
	if !o.OK {
		t.Fatalf("rx %s %v", o.Status, o.Err)
	}
	_ = ge.FreeBlocks(o.Blocks)
	_ = ce.Pools().Free(src)
	if string(o.Payload) != "tok-A" {
		t.Fatalf("READY payload %q, want %q (what Send was given)", o.Payload, "tok-A")
	}
}

// TestSetPayloadAtTheLastChunk: a payload known only when prefill ends
// (the first token) is set before the last chunk and replaces Send's: the
// READY carries it, a copy of the caller's buffer. After the last chunk
// SetPayload is refused (its Result may be leaving), as is a payload over
// messages.MaxPayload. (Checked to fail with the last chunk not carrying
// it: READY has Send's payload.)
func TestSetPayloadAtTheLastChunk(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ce, ge := c.ctx[0], c.gen[0]
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "late", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "late", PromptLen: 64, Payload: []byte("at open")})
	if err != nil {
		t.Fatal(err)
	}
	first := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0}
	if err := tx.Chunk(first, first.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.SetPayload(make([]byte, messages.MaxPayload+1)); !errors.Is(err, actors.ErrBadRequest) {
		t.Fatalf("SetPayload of %d bytes: %v, want ErrBadRequest", messages.MaxPayload+1, err)
	}
	buf := []byte("first token")
	if err := tx.SetPayload(buf); err != nil {
		t.Fatal(err)
	}
	copy(buf, "overwritten")
	last := kvcache.Chunk{Start: 32, End: 64, FirstBlock: 32 / l.TokensPerBlock, Last: true}
	if err := tx.Chunk(last, last.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.SetPayload([]byte("too late")); !errors.Is(err, actors.ErrBadRequest) {
		t.Fatalf("SetPayload after the last chunk: %v, want ErrBadRequest", err)
	}
	o := waitOutcome(t, rx.Done())
	waitOutcome(t, tx.Done())
	if !o.OK {
		t.Fatalf("rx %s %v", o.Status, o.Err)
	}
	_ = ge.FreeBlocks(o.Blocks)
	_ = ce.Pools().Free(src)
	if string(o.Payload) != "first token" {
		t.Fatalf("READY payload %q, want %q (SetPayload's, before the last chunk)", o.Payload, "first token")
	}
}

// TestPayloadAnOlderGenerationSideRefusesFailsBothSides: a generation
// rank whose Hello lacks messages.FeatureLargePayload (an older version)
// refuses Result payloads over messages.LegacyMaxPayload. A request with
// a longer payload (set late, as a first token is) fails on the context
// side, naming that rank and the upgrade, and the generation side gets
// FAILED saying why — not a DONE here beside a refused Result there. A
// payload within the old bound still moves to it. (Checked to fail with
// the Hello's feature ignored.)
func TestPayloadAnOlderGenerationSideRefusesFailsBothSides(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(string, *kvxfer.Config) {})
	link.older.Store(true)
	ce, ge := c.ctx[0], c.gen[0]
	for _, n := range []int{messages.LegacyMaxPayload + 1, messages.LegacyMaxPayload} {
		id := fmt.Sprintf("payload-%d", n)
		rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.SetPayload(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		all := kvcache.Chunk{Start: 0, End: 64, Last: true}
		if err := tx.Chunk(all, all.Runs(l.TokensPerBlock, src), nil); err != nil {
			t.Fatal(err)
		}
		to, ro := waitOutcome(t, tx.Done()), waitOutcome(t, rx.Done())
		if n <= messages.LegacyMaxPayload {
			if !to.OK || !ro.OK || len(ro.Payload) != n {
				t.Fatalf("%d bytes: tx %s %v, rx %s %v (payload %d bytes)", n, to.Status, to.Err, ro.Status, ro.Err, len(ro.Payload))
			}
			_ = ge.FreeBlocks(ro.Blocks)
		} else {
			if to.OK || !errors.Is(to.Err, kvxfer.ErrMismatch) || !strings.Contains(to.Err.Error(), "gen/0") || !strings.Contains(to.Err.Error(), "upgrade") {
				t.Fatalf("%d bytes: tx %s %v, want FAILED naming gen/0 and the upgrade", n, to.Status, to.Err)
			}
			if ro.OK || ro.Err == nil || !strings.Contains(ro.Err.Error(), "upgrade") {
				t.Fatalf("%d bytes: rx %s %v, want FAILED saying why", n, ro.Status, ro.Err)
			}
			<-rx.Released()
		}
		_ = ce.Pools().Free(src)
	}
}

// TestChunkPinsBeforeItReturns: the source blocks of a chunk are pinned
// by the time Chunk returns, so a caller that frees them before Done (too
// early) is refused by the pool at once — before, the session pinned them
// when it got to the chunk, and a Free in between succeeded: another
// request could reuse the blocks, and their new bytes went out as this
// request's KV, READY (a review; seen in its first run). Fifty requests,
// each freeing right after Chunk. (Checked to fail with the pin left to
// the session: the Free succeeded in the first rounds.)
func TestChunkPinsBeforeItReturns(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ce, ge := c.ctx[0], c.gen[0]
	for i := range 50 {
		id := fmt.Sprintf("early-free-%d", i)
		rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64})
		if err != nil {
			t.Fatal(err)
		}
		all := kvcache.Chunk{Start: 0, End: 64, Last: true}
		// The fence holds the transfer back, so that nothing of the
		// request can end (and rightly unpin) before the Free below.
		fence := &kvxfer.ManualFence{}
		if err := tx.Chunk(all, all.Runs(l.TokensPerBlock, src), fence); err != nil {
			t.Fatal(err)
		}
		if err := ce.Pools().Free(src); !errors.Is(err, kvcache.ErrBlockPinned) {
			t.Fatalf("%s: Free right after Chunk: %v, want ErrBlockPinned (the blocks are the request's until Done)", id, err)
		}
		fence.Fire(nil)
		if o := waitOutcome(t, rx.Done()); !o.OK {
			t.Fatalf("%s: rx %s %v", id, o.Status, o.Err)
		} else {
			_ = ge.FreeBlocks(o.Blocks)
		}
		waitOutcome(t, tx.Done())
		if err := ce.Pools().Free(src); err != nil {
			t.Fatalf("%s: Free after Done: %v", id, err)
		}
	}
}

// TestReceiveWithoutContextRefused: a Receive that names no context
// instance has no writer to ask; it is refused at once with ErrBadRequest
// naming the request and the field, and holds no block. Before, it was
// taken and waited out its whole timeout. (Checked to fail: without the
// check Receive returned a handle.)
func TestReceiveWithoutContextRefused(t *testing.T) {
	e := startPool(t, 1<<20)
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	rx, err := e.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "nobody", PromptLen: 40, Timeout: time.Minute})
	if rx != nil {
		rx.Cancel()
		<-rx.Done()
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "request nobody") || !strings.Contains(err.Error(), "Context is empty") {
		t.Fatalf("Receive without Context: %v, want ErrBadRequest naming request nobody and Context", err)
	}
	if used := e.Pools().Used(); used != 0 {
		t.Fatalf("%d blocks held by a refused Receive", used)
	}
}
