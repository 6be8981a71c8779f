package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Regression tests for "READY means the bytes asked for". Each was checked
// against the code before the fix (git stash of the fix, test run, seen to
// fail as its comment says).

var tp1 = kvcache.Parallel{TP: 1, PP: 1}

// waitDecided polls the context handle until its outcome is decided.
func waitDecided(t *testing.T, h *kvxfer.TxHandle) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("context side not decided within 10s")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	return h.Err()
}

// sendAll hands the whole prompt over in chunkTokens chunks from freshly
// allocated source blocks and returns them (the caller frees them after
// Done).
func sendAll(t *testing.T, e *kvxfer.Engine, h *kvxfer.TxHandle, l kvcache.Layout, promptLen, chunkTokens int) ([][]kvcache.BlockID, error) {
	t.Helper()
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(promptLen)
	}
	src, err := e.Pools().Alloc(counts)
	if err != nil {
		t.Fatalf("alloc: %v", err)
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks {
		if err := h.Chunk(c, c.Runs(l.TokensPerBlock, src), nil); err != nil {
			return src, err
		}
	}
	return src, nil
}

// Item 1: a generation side that planned 1024 tokens and a context side
// that sends 512 must not end READY (before: READY and DONE, half the
// blocks never written). Both sides fail naming both lengths, nothing
// leaks.
func TestPromptLengthMismatchFailsBothSides(t *testing.T) {
	l := smallLayout()
	for _, rxFirst := range []bool{true, false} {
		c := startCluster(t, l, tp1, tp1, 2)
		var rx *kvxfer.RxHandle
		receive := func() {
			var err error
			rx, err = c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "mm", PromptLen: 256, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
		}
		if rxFirst {
			receive()
		}
		tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "mm", PromptLen: 128})
		if err != nil {
			t.Fatal(err)
		}
		if !rxFirst {
			receive()
		}
		src, _ := sendAll(t, c.ctx[0], tx, l, 128, 64) // a chunk may be refused once decided
		to, ro := waitOutcome(t, tx.Done()), waitOutcome(t, rx.Done())
		for side, o := range map[string]kvxfer.Outcome{"ctx": to, "gen": ro} {
			if o.OK || !errors.Is(o.Err, kvxfer.ErrMismatch) && side == "ctx" {
				t.Fatalf("rxFirst=%v %s: %s %v, want a failure wrapping ErrMismatch", rxFirst, side, o.Status, o.Err)
			}
			if o.OK {
				t.Fatalf("rxFirst=%v %s READY/DONE on a mismatched prompt", rxFirst, side)
			}
		}
		if !strings.Contains(to.Err.Error(), "256") || !strings.Contains(to.Err.Error(), "128") {
			t.Fatalf("ctx error does not name both prompt lengths: %v", to.Err)
		}
		if err := c.ctx[0].Pools().Free(src); err != nil {
			t.Fatal(err)
		}
		checkNoLeaks(t, c)
	}
}

// Item 1, the receiver's own check: a writer's SUCCESS must carry the
// bytes this rank planned. Exercised at the step level (a lying writer);
// here the honest path still ends READY with every byte verified, so the
// check does not refuse what is right.
func TestExactBytesStillReady(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 2)
	transfer(t, c, l, "exact", 3, 200, 64, true)
	checkNoLeaks(t, c)
}

// Item 2: a chunk naming source blocks that were never allocated, fewer
// source blocks than it covers, or one block for two global blocks, is
// refused by Chunk at once, naming them; nothing is pinned and the request
// goes on (before: the refused pin was only counted and the request ended
// DONE + READY; a block named twice was taken, and READY's destination
// block 1 held global block 0's bytes).
func TestChunkRefusesBadSources(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "pin", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "pin", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	ch := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	never := []kvcache.BlockRun{{First: 0, IDs: []kvcache.BlockID{7, 8, 9, 10}}, {First: 0, IDs: []kvcache.BlockID{7, 8, 9, 10}}}
	err = tx.Chunk(ch, never, nil)
	if !errors.Is(err, kvxfer.ErrPin) || !errors.Is(err, kvcache.ErrBlockFree) || !strings.Contains(err.Error(), "[7 8 9 10]") {
		t.Fatalf("chunk of never-allocated blocks: %v, want ErrPin naming [7 8 9 10]", err)
	}
	src, err := c.ctx[0].Pools().Alloc([]int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	short := []kvcache.BlockRun{{First: 0, IDs: src[0][:2]}, {First: 0, IDs: src[1]}}
	if err := tx.Chunk(ch, short, nil); !errors.Is(err, kvxfer.ErrMissingSource) || !strings.Contains(err.Error(), "group 0") {
		t.Fatalf("chunk with 2 of 4 source blocks: %v, want ErrMissingSource naming group 0", err)
	}
	twice := []kvcache.BlockRun{{First: 0, IDs: src[0]}, {First: 0, IDs: []kvcache.BlockID{src[1][0], src[1][1], src[1][2], src[1][1]}}}
	want := fmt.Sprintf("group 1 names source block %d for global blocks 1 and 3", src[1][1])
	if err := tx.Chunk(ch, twice, nil); !errors.Is(err, kvxfer.ErrBadChunk) || !strings.Contains(err.Error(), want) {
		t.Fatalf("chunk naming one source block twice: %v, want ErrBadChunk: %q", err, want)
	}
	// A run of more than 64 blocks too.
	long, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "long", PromptLen: 80 * l.TokensPerBlock})
	if err != nil {
		t.Fatal(err)
	}
	longSrc, err := c.ctx[0].Pools().Alloc([]int{80, 80})
	if err != nil {
		t.Fatal(err)
	}
	whole := kvcache.Chunk{Start: 0, End: 80 * l.TokensPerBlock, Last: true}
	runs := whole.Runs(l.TokensPerBlock, longSrc)
	runs[0].IDs = slices.Clone(runs[0].IDs)
	runs[0].IDs[79] = runs[0].IDs[3]
	want = fmt.Sprintf("group 0 names source block %d for global blocks 3 and 79", runs[0].IDs[3])
	if err := long.Chunk(whole, runs, nil); !errors.Is(err, kvxfer.ErrBadChunk) || !strings.Contains(err.Error(), want) {
		t.Fatalf("chunk of 80 blocks naming one source block twice: %v, want ErrBadChunk: %q", err, want)
	}
	long.Cancel()
	waitOutcome(t, long.Done())
	if err := c.ctx[0].Pools().Free(longSrc); err != nil {
		t.Fatal(err)
	}
	if st := c.ctx[0].Pools().Stats(); st[0].Pinned != 0 || st[1].Pinned != 0 {
		t.Fatalf("refused chunks pinned blocks: %+v", st)
	}
	// The request goes on with a correct chunk.
	if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatalf("correct chunk after refusals: %v", err)
	}
	if o := waitOutcome(t, tx.Done()); !o.OK {
		t.Fatalf("tx %s %v", o.Status, o.Err)
	}
	o := waitOutcome(t, rx.Done())
	if !o.OK {
		t.Fatalf("rx %s %v", o.Status, o.Err)
	}
	if err := c.gen[0].FreeBlocks(o.Blocks); err != nil {
		t.Fatal(err)
	}
	if err := c.ctx[0].Pools().Free(src); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}

// Item 3: a Receive naming a context instance that does not exist times
// out and its blocks are freed: its RequestData never left, so no writer
// can be writing (before: the blocks stayed allocated and Close failed with
// "sessions did not drain").
func TestNeverConnectedWriterFreesBlocks(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "typo", PromptLen: 64,
		// The deadline must come after the control plane's refusal of the
		// first RequestData, which a loaded 2-core machine can delay by a
		// few hundred milliseconds (the test then sees a plain TIMED_OUT).
		Context: "ctx-typo", Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrTimeout) || !strings.Contains(o.Err.Error(), "never reached writer ctx-typo/0") {
		t.Fatalf("%s %v, want TIMED_OUT naming the unreached writer", o.Status, o.Err)
	}
	checkNoLeaks(t, c)
}

// Item 4: once the request is decided, Chunk returns an error wrapping
// ErrRequestFailed and the cause, so prefill can stop (before: nil, and the
// only signal was Done after the drain).
func TestChunkAfterOutcomeReturnsError(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "stop", PromptLen: 128, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "stop", PromptLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	src, err := c.ctx[0].Pools().Alloc([]int{8, 8})
	if err != nil {
		t.Fatal(err)
	}
	chunks, _ := kvcache.Chunks(128, 64, l.TokensPerBlock)
	if err := tx.Chunk(chunks[0], chunks[0].Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	rx.Cancel()
	if err := waitDecided(t, tx); !errors.Is(err, kvxfer.ErrRequestFailed) || !errors.Is(err, kvxfer.ErrPeerCancelled) {
		t.Fatalf("Err after the peer cancelled: %v", err)
	}
	err = tx.Chunk(chunks[1], chunks[1].Runs(l.TokensPerBlock, src), nil)
	if !errors.Is(err, kvxfer.ErrRequestFailed) || !errors.Is(err, kvxfer.ErrPeerCancelled) {
		t.Fatalf("Chunk after the outcome: %v, want ErrRequestFailed wrapping ErrPeerCancelled", err)
	}
	if o := waitOutcome(t, tx.Done()); o.OK {
		t.Fatalf("tx %s after cancel", o.Status)
	}
	waitOutcome(t, rx.Done())
	if err := c.ctx[0].Pools().Free(src); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}

// Item 7: an outcome's error keeps its chain: a writer declared dead
// matches the one ErrPeerGone (before: formatted with %v, and three
// different sentinels, so errors.Is was false).
func TestPeerGoneMatchesOneSentinel(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "gone", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	// The generation side learns its writer is gone (the request's session
	// exists once Receive returned).
	c.gen[0].PeerDown(c.ctx[0].Hello().From)
	o := waitOutcome(t, rx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
		t.Fatalf("rx %s %v, want a failure matching kvxfer.ErrPeerGone", o.Status, o.Err)
	}
	checkNoLeaks(t, c)
}

// Send(ctx) and Receive(ctx): cancelling the context cancels the request,
// and each side ends CANCELLED (its cause matching ErrCancelled or the
// peer's cancel), with nothing leaked.
func TestContextCancelCancelsRequest(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	rctx, rcancel := context.WithCancel(context.Background())
	rx, err := c.gen[0].Receive(rctx, kvxfer.ReceiveRequest{ID: "ctx-rx", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	rcancel()
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled || !errors.Is(o.Err, kvxfer.ErrCancelled) {
		t.Fatalf("rx after its context was cancelled: %s %v", o.Status, o.Err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	tx, err := c.ctx[0].Send(sctx, kvxfer.SendRequest{ID: "ctx-tx", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	scancel()
	if o := waitOutcome(t, tx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("tx after its context was cancelled: %s %v", o.Status, o.Err)
	}
	if _, err := c.ctx[0].Send(sctx, kvxfer.SendRequest{ID: "late", PromptLen: 64}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Send with a cancelled context: %v", err)
	}
	checkNoLeaks(t, c)
}

// TestChunkCopiesItsRuns: a caller that builds each chunk's block ids in
// one reused buffer gets every chunk written from the blocks it named at
// the time: Chunk copies its runs. Before, the session kept the caller's
// slices and read them later (pin, plan at a late RequestData, unpin):
// chunk 0 was planned from chunk 1's blocks, and the request went READY
// with global block 0 holding global block 2's bytes.
func TestChunkCopiesItsRuns(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ce, ge := c.ctx[0], c.gen[0]
	const prompt = 64 // 4 blocks of 16 tokens
	src := filledSource(t, ce, l)
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "reuse", PromptLen: prompt})
	if err != nil {
		t.Fatal(err)
	}
	// Both chunks before the Receive: the session plans them only when
	// the RequestData comes, after the buffer holds chunk 1's ids.
	buf := [][]kvcache.BlockID{make([]kvcache.BlockID, 2), make([]kvcache.BlockID, 2)}
	chunks, err := kvcache.Chunks(prompt, 32, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chunks {
		b0, b1 := ch.Blocks(l.TokensPerBlock)
		runs := make([]kvcache.BlockRun, 2)
		for g := range runs {
			copy(buf[g], src[g][b0:b1])
			runs[g] = kvcache.BlockRun{First: b0, IDs: buf[g][:b1-b0]}
		}
		if err := tx.Chunk(ch, runs, nil); err != nil {
			t.Fatal(err)
		}
	}
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "reuse", PromptLen: prompt, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	waitOutcome(t, tx.Done())
	if !o.OK {
		t.Fatalf("receive: %s %v", o.Status, o.Err)
	}
	verify(t, ge, l, prompt, o.Blocks, 1) // fails naming the block whose bytes are another's
	if err := ge.FreeBlocks(o.Blocks); err != nil {
		t.Fatal(err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatal(err)
	}
}

// TestChunkRefusesASourceBlockAnEarlierChunkNamed: a chunk naming, for
// one of its global blocks, the source block an earlier chunk named for
// another is refused (ErrBadChunk, naming both), and the corrected chunk
// is taken. Before, only a repeat within one chunk was refused; this one
// went READY with global block 2 holding global block 0's bytes.
func TestChunkRefusesASourceBlockAnEarlierChunkNamed(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ce, ge := c.ctx[0], c.gen[0]
	const prompt = 64
	src := filledSource(t, ce, l)
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "dup", PromptLen: prompt, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "dup", PromptLen: prompt})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0}
	c1 := kvcache.Chunk{Start: 32, End: 64, FirstBlock: 2, Last: true}
	if err := tx.Chunk(c0, c0.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	runs := c1.Runs(l.TokensPerBlock, src)
	runs[0] = kvcache.BlockRun{First: 2, IDs: []kvcache.BlockID{src[0][0], src[0][3]}}
	want := fmt.Sprintf("group 0 names source block %d for global block 2; an earlier chunk named it for another", src[0][0])
	if err := tx.Chunk(c1, runs, nil); !errors.Is(err, kvxfer.ErrBadChunk) || !strings.Contains(err.Error(), want) {
		t.Fatalf("chunk naming chunk 0's source block for another global block: %v, want ErrBadChunk: %q", err, want)
	}
	// The whole table again (blocks 0-1 as chunk 0 named them) is fine.
	if err := tx.Chunk(c1, []kvcache.BlockRun{{First: 0, IDs: src[0]}, {First: 0, IDs: src[1]}}, nil); err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	waitOutcome(t, tx.Done())
	if !o.OK {
		t.Fatalf("receive: %s %v", o.Status, o.Err)
	}
	verify(t, ge, l, prompt, o.Blocks, 1)
	_ = ge.FreeBlocks(o.Blocks)
	_ = ce.Pools().Free(src)
}

// panicFence is a caller's Fence whose OnReady panics.
type panicFence struct{}

func (panicFence) OnReady(func(error)) { panic("broken fence") }

// TestChunkWithABrokenFenceEnds: a nil *ManualFence (one never set) is
// refused by Chunk, naming it, with nothing pinned; a Fence whose OnReady
// panics fails its chunk's fence, naming the panic, and the request ends
// (Done comes, every pin released). Before, the WatchFence effect panicked
// after the chunk was pinned; the restarted session never watched that
// fence again, and the request never drained: no Done, not at its
// deadline, not at Close.
func TestChunkWithABrokenFenceEnds(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	ce, ge := c.ctx[0], c.gen[0]
	ch := kvcache.Chunk{Start: 0, End: 64, Last: true}
	src, err := ce.Pools().Alloc([]int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	var unset *kvxfer.ManualFence
	for _, fc := range []struct {
		name  string
		fence kvxfer.Fence
	}{{"nil *ManualFence", unset}, {"panicking fence", panicFence{}}} {
		id := strings.ReplaceAll(fc.name, " ", "-")
		rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx", Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		err = tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), fc.fence)
		if fc.fence == unset {
			if !errors.Is(err, kvxfer.ErrBadChunk) || !strings.Contains(err.Error(), "fence is a nil *actors.ManualFence") {
				t.Fatalf("%s: Chunk: %v, want ErrBadChunk naming the nil fence", fc.name, err)
			}
			tx.Cancel()
		} else if err != nil {
			t.Fatalf("%s: Chunk: %v", fc.name, err)
		}
		o := waitOutcome(t, tx.Done())
		if o.OK || (fc.fence != unset && !strings.Contains(fmt.Sprint(o.Err), "panicked in OnReady: broken fence")) {
			t.Fatalf("%s: send ended %s %v, want it failed naming the fence's panic", fc.name, o.Status, o.Err)
		}
		if r := waitOutcome(t, rx.Done()); r.OK {
			t.Fatalf("%s: receive READY", fc.name)
		}
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("source blocks still pinned after both requests ended: %v", err)
	}
}

// filledSource allocates 4 source blocks of each group of ce's pool and
// fills them with request 1's pattern for global blocks 0-3.
func filledSource(t *testing.T, ce *kvxfer.Engine, l kvcache.Layout) [][]kvcache.BlockID {
	t.Helper()
	src, err := ce.Pools().Alloc([]int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	fillSource(ce, l, src, 1)
	return src
}
