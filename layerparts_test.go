package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestTransferLayerParts: every chunk leaves in layer parts, each handed
// before its layers are written and fenced once they are, as a forward pass
// writes them; the generation side gets every byte (a part that left before
// its fence, or that carried layers of another part, would copy stale
// bytes). The parts split the layer groups unevenly (the first holds no
// layer of the sliding-window group), and with pipeline parallelism a
// context rank holds none of some parts' layers.
func TestTransferLayerParts(t *testing.T) {
	l := smallLayout()
	parts := []kvcache.LayerPart{{Lo: 0, Hi: 1, Of: 4}, {Lo: 1, Hi: 3, Of: 4}, {Lo: 3, Hi: 4, Of: 4}}
	for _, tc := range []struct {
		name     string
		ctx, gen kvcache.Parallel
	}{
		{"TP1-TP1", kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}},
		{"TP2-TP4", kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 4, PP: 1}},
		{"PP2-PP1", kvcache.Parallel{TP: 1, PP: 2}, kvcache.Parallel{TP: 1, PP: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, l, tc.ctx, tc.gen, 2)
			for i, promptLen := range []int{100, 16, 64} {
				transferParts(t, c, l, fmt.Sprintf("%s-r%d", tc.name, i), i+1, promptLen, 32, true, parts)
			}
			checkNoLeaks(t, c)
		})
	}
}

// TestLayerPartsOutOfOrderRefused: a layer part out of order is refused
// with an error naming it, nothing of it is taken, and the request goes on:
// the right parts, handed next, complete it with every byte.
func TestLayerPartsOutOfOrderRefused(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	ce, ge := c.ctx[0], c.gen[0]
	const prompt = 64
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: prompt, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(prompt), l.BlocksFor(prompt)})
	if err != nil {
		t.Fatal(err)
	}
	other, err := ce.Pools().Alloc([]int{l.BlocksFor(prompt), l.BlocksFor(prompt)})
	if err != nil {
		t.Fatal(err)
	}
	for g := range l.Groups {
		for b, id := range src[g] {
			fill(ce, l, g, id, b, 1)
		}
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "r", PromptLen: prompt})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0}
	c1 := kvcache.Chunk{Start: 32, End: 64, FirstBlock: 2, Last: true}
	part := func(c kvcache.Chunk, lo, hi, of int) kvcache.Chunk {
		c.Layers = kvcache.LayerPart{Lo: lo, Hi: hi, Of: of}
		return c
	}
	refuse := func(c kvcache.Chunk, ids [][]kvcache.BlockID, want string) {
		t.Helper()
		err := tx.Chunk(c, c.Runs(l.TokensPerBlock, ids), nil)
		if !errors.Is(err, kvxfer.ErrBadChunk) {
			t.Fatalf("%v: %v, want kvxfer.ErrBadChunk", c, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%v: %v, want it to name %q", c, err, want)
		}
	}
	refuse(part(c0, 0, 2, 8), src, "layers [0, 2) of 8: want 0 ≤ Lo < Hi ≤ Of = 4")
	refuse(part(c0, 2, 1, 4), src, "chunk [0, 32): kvcache: bad chunk: layers [2, 1) of 4: want 0 ≤ Lo < Hi")
	refuse(part(c0, 1, 2, 4), src, "the first part of a chunk starts at layer 0")
	if err := tx.Chunk(part(c0, 0, 2, 4), c0.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	refuse(part(c0, 3, 4, 4), src, "layers [3, 4) of 4: the next part of the chunk starts at layer 2")
	refuse(part(c1, 0, 4, 4), src, "layers [2, 4) of chunk [0, 32) block 0 layers [0, 2) of 4 are not handed yet")
	refuse(c1, src, "are not handed yet")
	refuse(part(c0, 2, 4, 4), other, "source blocks differ from the chunk's first part")
	for _, c := range []kvcache.Chunk{part(c0, 2, 4, 4), part(c1, 0, 1, 4), part(c1, 1, 4, 4)} {
		if err := tx.Chunk(c, c.Runs(l.TokensPerBlock, src), nil); err != nil {
			t.Fatalf("%v: %v", c, err)
		}
	}
	refuse(part(c1, 0, 4, 4), src, "after the last chunk")
	// The blocks were written before the chunks were handed (nil fences).
	if o := waitOutcome(t, tx.Done()); !o.OK {
		t.Fatalf("tx: %s %v", o.Status, o.Err)
	}
	o := waitOutcome(t, rx.Done())
	if !o.OK {
		t.Fatalf("rx: %s %v", o.Status, o.Err)
	}
	if n := verify(t, ge, l, prompt, o.Blocks, 1); n == 0 {
		t.Fatal("no byte verified")
	}
	if err := errors.Join(ce.Pools().Free(src), ce.Pools().Free(other), ge.FreeBlocks(o.Blocks)); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}
