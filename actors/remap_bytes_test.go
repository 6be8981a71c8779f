package actors

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

func TestRemapBytewise(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var remap []messages.Extent
		var at uint64
		for range rapid.IntRange(0, 5).Draw(t, "n") {
			at += uint64(rapid.IntRange(0, 6).Draw(t, "gap"))
			n := uint64(rapid.IntRange(1, 6).Draw(t, "len"))
			remap = append(remap, messages.Extent{View: at, File: uint64(rapid.IntRange(100, 200).Draw(t, "file")), Len: n})
			at += n
		}
		var segs []kvcache.Segment
		for range rapid.IntRange(1, 4).Draw(t, "segs") {
			segs = append(segs, kvcache.Segment{Src: uint64(rapid.IntRange(0, 50).Draw(t, "src")),
				Dst: uint64(rapid.IntRange(0, 40).Draw(t, "dst")), Len: uint64(rapid.IntRange(1, 20).Draw(t, "l"))})
		}
		mapByte := func(d uint64) uint64 {
			for _, x := range remap {
				if d >= x.View && d < x.View+x.Len {
					return x.File + d - x.View
				}
			}
			return d
		}
		var want, got [][2]uint64
		for _, s := range segs {
			for i := uint64(0); i < s.Len; i++ {
				want = append(want, [2]uint64{s.Src + i, mapByte(s.Dst + i)})
			}
		}
		for _, s := range remapSegments(segs, remap) {
			for i := uint64(0); i < s.Len; i++ {
				got = append(got, [2]uint64{s.Src + i, s.Dst + i})
			}
		}
		if len(got) != len(want) {
			t.Fatalf("got %d bytes, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("byte %d: got %v want %v", i, got[i], want[i])
			}
		}
	})
}
