package proc

import (
	"bytes"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
)

// TestPatternAgreesAcrossTensorParallelism: what a TP2 rank writes for its
// head is, row for row, what a TP1 rank holds at that head; a byte
// changed anywhere fails the check.
func TestPatternAgreesAcrossTensorParallelism(t *testing.T) {
	l := kvcache.Layout{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 4, Groups: kvcache.FullAttention(2)}
	full, err := l.Shape(kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{})
	if err != nil {
		t.Fatal(err)
	}
	whole := make([]byte, full.BlockBytes(l, 0))
	fillBlock(whole, l, full, 3, 0, 5, kvcache.LayerPart{})
	if !checkBlock(whole, l, full, 3, 0, 5) {
		t.Fatal("a filled block fails its own check")
	}
	if checkBlock(whole, l, full, 3, 0, 6) || checkBlock(whole, l, full, 4, 0, 5) {
		t.Fatal("a block passes the check of another block or request")
	}
	tb, tpb := l.TokenBytes(), l.TokensPerBlock
	for r := range 2 {
		s, err := l.Shape(kvcache.Parallel{TP: 2, PP: 1}, kvcache.Rank{TP: r})
		if err != nil {
			t.Fatal(err)
		}
		shard := make([]byte, s.BlockBytes(l, 0))
		fillBlock(shard, l, s, 3, 0, 5, kvcache.LayerPart{})
		for li := range 2 {
			for p := range 2 {
				got := shard[(li*2+p)*tpb*tb:][:tpb*tb]
				want := whole[((li*2+p)*2+r)*tpb*tb:][:tpb*tb]
				if !bytes.Equal(got, want) {
					t.Fatalf("rank %d layer %d part %d: the TP2 rows differ from the TP1 block's head %d", r, li, p, r)
				}
			}
		}
	}
	for _, i := range []int{0, len(whole) / 2, len(whole) - 1} {
		whole[i] ^= 1
		if checkBlock(whole, l, full, 3, 0, 5) {
			t.Fatalf("byte %d flipped: the check passes", i)
		}
		whole[i] ^= 1
	}
}

// TestPatternByLayerParts: a block filled part by part is the block filled
// whole, and each part writes its own layers' rows only.
func TestPatternByLayerParts(t *testing.T) {
	l := kvcache.Layout{Name: "tiny", Layers: 3, KVHeads: 2, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 4, Groups: kvcache.FullAttention(3)}
	s, err := l.Shape(kvcache.Parallel{TP: 2, PP: 1}, kvcache.Rank{TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	whole := make([]byte, s.BlockBytes(l, 0))
	fillBlock(whole, l, s, 3, 0, 5, kvcache.LayerPart{})
	perLayer := len(whole) / l.Layers
	byParts := make([]byte, len(whole))
	for _, part := range kvcache.SplitLayers(l.Layers, 2) {
		before := bytes.Clone(byParts)
		fillBlock(byParts, l, s, 3, 0, 5, part)
		for layer := range l.Layers {
			rows := func(b []byte) []byte { return b[layer*perLayer : (layer+1)*perLayer] }
			switch {
			case part.Contains(layer) && !bytes.Equal(rows(byParts), rows(whole)):
				t.Fatalf("part %v: layer %d's rows are not the whole block's", part, layer)
			case !part.Contains(layer) && !bytes.Equal(rows(byParts), rows(before)):
				t.Fatalf("part %v wrote layer %d", part, layer)
			}
		}
	}
	if !checkBlock(byParts, l, s, 3, 0, 5) {
		t.Fatal("a block filled part by part fails the check")
	}
}
