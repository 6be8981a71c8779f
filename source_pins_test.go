package kvxfer_test

import (
	"context"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestChunkPinsOnlyItsOwnBlocks: a chunk's source runs may name more
// blocks than the chunk's own (a whole block table, a run from before
// block 0), but only the chunk's own blocks are pinned. Before, every
// block the runs named stayed pinned until the request's Done: here
// request A's first chunk named two of request B's blocks, and B's
// FreeBlocks after B's Done was refused (ErrBlockPinned) while A lived.
// A then ends READY with its bytes, its later chunk passing its whole
// block table.
func TestChunkPinsOnlyItsOwnBlocks(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	ctx, gen := c.ctx[0], c.gen[0]
	const promptLen = 64 // 4 blocks of 16 tokens
	srcA, err := ctx.Pools().Alloc([]int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	srcB, err := ctx.Pools().Alloc([]int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	fillSource(ctx, l, srcA, 1)
	fillSource(ctx, l, srcB, 2)

	txA, err := ctx.Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: promptLen})
	if err != nil {
		t.Fatal(err)
	}
	// A's first chunk (global blocks 0 and 1) with runs over global blocks
	// [-1, 5): B's block 0 before A's table, B's block 1 after it.
	first := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0}
	wide := make([]kvcache.BlockRun, len(l.Groups))
	for g := range wide {
		ids := append([]kvcache.BlockID{srcB[g][0]}, srcA[g]...)
		wide[g] = kvcache.BlockRun{First: -1, IDs: append(ids, srcB[g][1])}
	}
	if err := txA.Chunk(first, wide, nil); err != nil {
		t.Fatalf("chunk with runs wider than the chunk: %v", err)
	}
	for g, st := range ctx.Pools().Stats() {
		if st.Pinned != 2 {
			t.Fatalf("group %d: %d blocks pinned, want the chunk's 2: %+v", g, st.Pinned, st)
		}
	}

	// B, start to end, while A lives: its blocks are its own again at Done.
	rxB, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "b", PromptLen: promptLen, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	txB, err := ctx.Send(context.Background(), kvxfer.SendRequest{ID: "b", PromptLen: promptLen})
	if err != nil {
		t.Fatal(err)
	}
	whole := kvcache.Chunk{Start: 0, End: promptLen, Last: true}
	if err := txB.Chunk(whole, whole.Runs(l.TokensPerBlock, srcB), nil); err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, txB.Done()); !o.OK {
		t.Fatalf("tx b: %s %v", o.Status, o.Err)
	}
	oB := waitOutcome(t, rxB.Done())
	if !oB.OK {
		t.Fatalf("rx b: %s %v", oB.Status, oB.Err)
	}
	verify(t, gen, l, promptLen, oB.Blocks, 2)
	if err := gen.FreeBlocks(oB.Blocks); err != nil {
		t.Fatal(err)
	}
	if err := ctx.FreeBlocks(srcB); err != nil {
		t.Fatalf("FreeBlocks of request b's source blocks after its Done, request a live: %v", err)
	}

	// A's last chunk in two layer parts, each with its whole block table
	// (a later part's runs are compared with the first part's as given,
	// not as clipped); A ends READY.
	rxA, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: promptLen, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	table := make([]kvcache.BlockRun, len(l.Groups))
	for g := range table {
		table[g] = kvcache.BlockRun{First: 0, IDs: srcA[g]}
	}
	for _, part := range kvcache.SplitLayers(l.Layers, 2) {
		last := kvcache.Chunk{Start: 32, End: promptLen, FirstBlock: 2, Last: true, Layers: part}
		if err := txA.Chunk(last, table, nil); err != nil {
			t.Fatalf("last chunk's part with the whole block table: %v", err)
		}
	}
	if o := waitOutcome(t, txA.Done()); !o.OK {
		t.Fatalf("tx a: %s %v", o.Status, o.Err)
	}
	oA := waitOutcome(t, rxA.Done())
	if !oA.OK {
		t.Fatalf("rx a: %s %v", oA.Status, oA.Err)
	}
	verify(t, gen, l, promptLen, oA.Blocks, 1)
	if err := gen.FreeBlocks(oA.Blocks); err != nil {
		t.Fatal(err)
	}
	if err := ctx.FreeBlocks(srcA); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}
