package actors

import (
	"math/rand/v2"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestRemapSegments: for random segments and random sorted, disjoint
// extents, the rewritten segments move every source byte, in order, to
// where the extents say (File + offset into the extent) or, outside them,
// to the same destination.
func TestRemapSegments(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		var remap []messages.Extent
		for v := uint64(rng.IntN(8)); v < 200; v += uint64(1 + rng.IntN(30)) {
			n := uint64(1 + rng.IntN(20))
			remap = append(remap, messages.Extent{View: v, File: 1000 + uint64(rng.IntN(1000)), Len: n})
			v += n
		}
		var segs []kvcache.Segment
		for range 1 + rng.IntN(5) {
			segs = append(segs, kvcache.Segment{Src: uint64(rng.IntN(500)), Dst: uint64(rng.IntN(220)), Len: uint64(rng.IntN(40))})
		}
		where := func(dst uint64) uint64 {
			for _, x := range remap {
				if dst >= x.View && dst < x.View+x.Len {
					return x.File + dst - x.View
				}
			}
			return dst
		}
		type pair struct{ src, dst uint64 }
		var want, got []pair
		for _, s := range segs {
			for i := range s.Len {
				want = append(want, pair{s.Src + i, where(s.Dst + i)})
			}
		}
		for _, s := range remapSegments(segs, remap) {
			if s.Len == 0 {
				t.Fatalf("trial %d: empty segment in the output", trial)
			}
			for i := range s.Len {
				got = append(got, pair{s.Src + i, s.Dst + i})
			}
		}
		if len(got) != len(want) {
			t.Fatalf("trial %d: %d bytes moved, want %d (segs %v remap %v)", trial, len(got), len(want), segs, remap)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("trial %d byte %d: %v, want %v (segs %v remap %v)", trial, i, got[i], want[i], segs, remap)
			}
		}
	}
}
