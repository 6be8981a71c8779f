package kvcache

import (
	"testing"

	"pgregory.net/rapid"
)

func TestResidentAndNeededRange(t *testing.T) {
	tests := []struct {
		name                     string
		promptLen, window, tpb   int
		hit                      int
		resFirst, resEnd, needFi int
	}{
		{"full, exact blocks", 128, 0, 32, 0, 0, 4, 0},
		{"full, partial last block", 100, 0, 32, 0, 0, 4, 0},
		{"full, prefix hit", 100, 0, 32, 2, 0, 4, 2},
		{"full, prefix hit covers all", 100, 0, 32, 4, 0, 4, 4},
		{"full, prefix hit beyond end", 100, 0, 32, 9, 0, 4, 4},
		{"full, negative hit", 100, 0, 32, -1, 0, 4, 0},
		{"window larger than prompt", 100, 4096, 32, 0, 0, 4, 0},
		{"window equals prompt", 128, 128, 32, 0, 0, 4, 0},
		{"window aligned", 8192, 1024, 32, 0, 224, 256, 224},
		{"window mid-block", 1000, 128, 32, 0, 27, 32, 27}, // tokens [872,1000): block 27 starts at 864
		{"window, hit inside window", 1000, 128, 32, 30, 27, 32, 30},
		{"window, hit before window", 1000, 128, 32, 10, 27, 32, 27},
		{"window, hit covers window", 1000, 128, 32, 32, 27, 32, 32},
		{"window 1 token", 97, 1, 32, 0, 3, 4, 3},
		{"tpb 1", 10, 3, 1, 0, 7, 10, 7},
		{"empty prompt", 0, 0, 32, 0, 0, 0, 0},
		{"negative prompt", -5, 0, 32, 0, 0, 0, 0},
		{"zero tpb", 100, 0, 0, 0, 0, 0, 0},
		{"negative window = full", 100, -1, 32, 0, 0, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, e := ResidentRange(tt.promptLen, tt.window, tt.tpb)
			if f != tt.resFirst || e != tt.resEnd {
				t.Errorf("ResidentRange = [%d, %d), want [%d, %d)", f, e, tt.resFirst, tt.resEnd)
			}
			nf, ne := NeededRange(tt.promptLen, tt.window, tt.tpb, tt.hit)
			if nf != tt.needFi || ne != tt.resEnd {
				t.Errorf("NeededRange(hit %d) = [%d, %d), want [%d, %d)", tt.hit, nf, ne, tt.needFi, tt.resEnd)
			}
		})
	}
}

// TestResidentRangeCoversWindow: the resident blocks hold every token of the
// window and no block that lies wholly before it.
func TestResidentRangeCoversWindow(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tpb := rapid.IntRange(1, 64).Draw(t, "tpb")
		promptLen := rapid.IntRange(1, 10000).Draw(t, "promptLen")
		window := rapid.IntRange(0, 5000).Draw(t, "window")
		first, end := ResidentRange(promptLen, window, tpb)
		lo := 0
		if window > 0 {
			lo = max(0, promptLen-window)
		}
		if first*tpb > lo || end*tpb < promptLen {
			t.Fatalf("[%d, %d) blocks = tokens [%d, %d) misses window tokens [%d, %d)",
				first, end, first*tpb, end*tpb, lo, promptLen)
		}
		if (first+1)*tpb <= lo || (end-1)*tpb >= promptLen {
			t.Fatalf("[%d, %d) holds a block outside tokens [%d, %d)", first, end, lo, promptLen)
		}
		hit := rapid.IntRange(0, end+2).Draw(t, "hit")
		nf, ne := NeededRange(promptLen, window, tpb, hit)
		if ne != end || nf < first || nf > ne || nf < min(hit, end) {
			t.Fatalf("NeededRange(hit %d) = [%d, %d), resident [%d, %d)", hit, nf, ne, first, end)
		}
	})
}
