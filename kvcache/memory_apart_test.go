package kvcache

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// apartMemory is a small descriptor: one head, one element per token, K
// and V of each layer at the given bases, blocks of stride stride.
func apartMemory(layers []int, bases [][]uint64, blocks int, stride uint64) *KVMemory {
	return &KVMemory{Layers: layers, Heads: 1, HeadDim: 1, ElemBytes: 1, ElemStride: 1, TokensPerBlock: 2, Parts: 2,
		Base: bases, Blocks: blocks, BlockStride: stride, TokenStride: 1, HeadStride: 1, RegionLen: 1 << 20}
}

// CheckApart refuses exactly the descriptors whose tensors of two
// different groups interleave, against a check of every pair.
func TestCheckApartMatchesPairwise(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		groups := rapid.IntRange(2, 4).Draw(t, "groups")
		var mems []*KVMemory
		for g := range groups {
			if rapid.IntRange(0, 5).Draw(t, "nil") == 0 {
				mems = append(mems, nil)
				continue
			}
			n := rapid.IntRange(1, 3).Draw(t, "layers")
			blocks := rapid.IntRange(1, 4).Draw(t, "blocks")
			stride := uint64(rapid.IntRange(2, 8).Draw(t, "stride"))
			var layers []int
			var bases [][]uint64
			for i := range n {
				layers = append(layers, g*10+i)
				bases = append(bases, []uint64{uint64(rapid.IntRange(0, 300).Draw(t, "k")), uint64(rapid.IntRange(0, 300).Draw(t, "v"))})
			}
			m := apartMemory(layers, bases, blocks, stride)
			if m.Validate() != nil {
				t.Skip("a descriptor overlapping itself")
			}
			mems = append(mems, m)
		}
		type ext struct {
			g      int
			lo, hi uint64
		}
		var all []ext
		for g, m := range mems {
			if m == nil {
				continue
			}
			fp, err := m.blockFootprint()
			if err != nil {
				t.Fatal(err)
			}
			ts, err := m.extents(fp[len(fp)-1].hi)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range ts {
				all = append(all, ext{g, x.lo, x.hi})
			}
		}
		want := false
		for i, a := range all {
			for _, b := range all[i+1:] {
				if a.g != b.g && a.lo < b.hi && b.lo < a.hi {
					want = true
				}
			}
		}
		err := CheckApart(mems)
		if (err != nil) != want {
			t.Fatalf("CheckApart = %v, pairwise interleave %v (%+v)", err, want, all)
		}
		if err != nil && (!errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "interleave")) {
			t.Fatalf("error %v does not wrap ErrBadMemory or name the interleaving", err)
		}
	})
}
