package kvcache

import (
	"testing"

	"pgregory.net/rapid"
)

// TestPropertyChunkOrderAcceptsOnlyAnOrderedCover proposes random chunks
// and layer parts to a ChunkOrder (most of them the right next one, the
// rest a plausible mistake: another start, another layer range, a part of
// another chunk, other sources, anything after the last) and takes each it
// accepts. Whatever it accepts must hand every (token, layer) of the
// prompt exactly once, in token order and within a chunk in layer order,
// every part of a chunk with its first part's sources; Done must hold
// exactly when the last token's last layer was handed; and a refusal
// changes nothing (the right chunk proposed next is still accepted).
func TestPropertyChunkOrderAcceptsOnlyAnOrderedCover(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tpb := rapid.IntRange(1, 8).Draw(t, "tpb")
		prompt := rapid.IntRange(1, 60).Draw(t, "prompt")
		layers := rapid.IntRange(1, 6).Draw(t, "layers")
		chunkTokens := tpb * rapid.IntRange(1, 4).Draw(t, "chunkBlocks")
		chunks, err := Chunks(prompt, chunkTokens, tpb)
		if err != nil {
			t.Fatal(err)
		}
		o := NewChunkOrder(prompt, tpb, layers)
		src := func(c Chunk, salt int) []BlockRun {
			b0, b1 := c.Blocks(tpb)
			ids := make([]BlockID, b1-b0)
			for i := range ids {
				ids[i] = BlockID(100*salt + b0 + i)
			}
			return []BlockRun{{First: b0, IDs: ids}}
		}
		handed := make([][]int, prompt) // per token, the layers handed, in order
		var partSrc []BlockRun
		ci, layer := 0, 0 // the model's next chunk and its next layer
		for step := 0; step < 200 && !o.Done(); step++ {
			var c Chunk
			var s []BlockRun
			right := rapid.IntRange(0, 3).Draw(t, "right") > 0
			if right {
				c = chunks[ci]
				hi := layers
				if rapid.Bool().Draw(t, "split") {
					hi = rapid.IntRange(layer+1, layers).Draw(t, "hi")
				}
				if layer > 0 || hi < layers {
					c.Layers = LayerPart{Lo: layer, Hi: hi, Of: layers}
				}
				s = src(c, 1)
				if partSrc != nil {
					s = partSrc
				}
			} else {
				c = chunks[rapid.IntRange(0, len(chunks)-1).Draw(t, "anyChunk")]
				if rapid.Bool().Draw(t, "anyPart") {
					lo := rapid.IntRange(0, layers-1).Draw(t, "anyLo")
					c.Layers = LayerPart{Lo: lo, Hi: rapid.IntRange(lo+1, layers).Draw(t, "anyHi"), Of: layers}
					if c.Layers.Whole() {
						c.Layers = LayerPart{}
					}
				}
				s = src(c, rapid.IntRange(1, 2).Draw(t, "salt"))
				if partSrc != nil && rapid.Bool().Draw(t, "sameSrc") {
					s = partSrc
				}
			}
			err := o.Check(c, s)
			if err != nil {
				if right {
					t.Fatalf("step %d: the right next %v refused: %v", step, c, err)
				}
				continue
			}
			o.Took(c, s)
			lo, hi := 0, layers
			if c.Layers != (LayerPart{}) {
				lo, hi = c.Layers.Lo, c.Layers.Hi
			}
			// What was accepted must be the model's next.
			if c.Start != chunks[ci].Start || c.End != chunks[ci].End || lo != layer {
				t.Fatalf("step %d: accepted %v (layers [%d,%d)), the next is %v from layer %d", step, c, lo, hi, chunks[ci], layer)
			}
			if layer > 0 && !sameRuns(s, partSrc) {
				t.Fatalf("step %d: accepted %v with sources %v, its first part's were %v", step, c, s, partSrc)
			}
			for tok := c.Start; tok < c.End; tok++ {
				for L := lo; L < hi; L++ {
					handed[tok] = append(handed[tok], L)
				}
			}
			if hi == layers {
				ci, layer, partSrc = ci+1, 0, nil
			} else {
				if layer == 0 {
					partSrc = CloneRuns(s)
				}
				layer = hi
			}
			if o.Done() != (ci == len(chunks)) {
				t.Fatalf("step %d: Done = %t after chunk %d of %d", step, o.Done(), ci, len(chunks))
			}
		}
		if !o.Done() {
			return // ran out of steps: what was handed is checked by the order above
		}
		for tok, ls := range handed {
			if len(ls) != layers {
				t.Fatalf("token %d: layers %v handed, want each of %d once", tok, ls, layers)
			}
			for i, L := range ls {
				if L != i {
					t.Fatalf("token %d: layers handed in order %v", tok, ls)
				}
			}
		}
		for _, c := range chunks {
			if o.Check(c, src(c, 1)) == nil {
				t.Fatalf("%v accepted after the last chunk", c)
			}
		}
	})
}
