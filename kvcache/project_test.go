package kvcache

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// idRange returns the ids lo, lo+1, …, hi-1.
func idRange(lo, hi int) []BlockID {
	out := make([]BlockID, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, BlockID(i))
	}
	return out
}

func TestProject(t *testing.T) {
	const tpb = 4
	src := BlockRun{First: 0, IDs: idRange(10, 20)}   // global blocks [0,10)
	dst := BlockRun{First: 2, IDs: idRange(100, 108)} // global blocks [2,10)
	for _, tc := range []struct {
		name     string
		c        Chunk
		src, dst BlockRun
		wantSrc  []BlockID
		wantDst  []BlockID
	}{
		{"inside", Chunk{Start: 8, End: 16, FirstBlock: 2}, src, dst, []BlockID{12, 13}, []BlockID{100, 101}},
		{"partial: prefix hit covers the chunk's first block", Chunk{Start: 4, End: 16, FirstBlock: 1}, src, dst,
			[]BlockID{12, 13}, []BlockID{100, 101}},
		{"outside: before the window", Chunk{Start: 0, End: 8, FirstBlock: 0}, src, dst, nil, nil},
		{"outside: empty needed range", Chunk{Start: 8, End: 16, FirstBlock: 2}, src, BlockRun{First: 10}, nil, nil},
		{"outside: after the needed range", Chunk{Start: 40, End: 44, FirstBlock: 10, Last: true}, src, dst, nil, nil},
		{"outside: source missing too is no error", Chunk{Start: 0, End: 8, FirstBlock: 0},
			BlockRun{First: 5, IDs: idRange(0, 5)}, dst, nil, nil},
		{"last chunk ends mid-block", Chunk{Start: 32, End: 38, FirstBlock: 8, Last: true}, src, dst,
			[]BlockID{18, 19}, []BlockID{106, 107}},
		{"last chunk of one token", Chunk{Start: 36, End: 37, FirstBlock: 9, Last: true}, src, dst,
			[]BlockID{19}, []BlockID{107}},
		{"whole request", Chunk{Start: 0, End: 40, FirstBlock: 0, Last: true}, src, dst, idRange(12, 20), idRange(100, 108)},
		{"empty chunk", Chunk{Start: 8, End: 8, FirstBlock: 2}, src, dst, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, d, err := Project(tc.c, tpb, tc.src, tc.dst)
			if err != nil {
				t.Fatal(err)
			}
			if len(s) != len(d) {
				t.Fatalf("%d source ids, %d destination ids", len(s), len(d))
			}
			if len(tc.wantSrc) == 0 {
				if len(s) != 0 {
					t.Fatalf("got %v/%v, want empty", s, d)
				}
				return
			}
			if !reflect.DeepEqual(s, tc.wantSrc) || !reflect.DeepEqual(d, tc.wantDst) {
				t.Fatalf("got %v/%v, want %v/%v", s, d, tc.wantSrc, tc.wantDst)
			}
		})
	}
}

func TestProjectErrors(t *testing.T) {
	const tpb = 4
	src := BlockRun{First: 0, IDs: idRange(10, 20)}
	dst := BlockRun{First: 2, IDs: idRange(100, 108)}
	for _, tc := range []struct {
		name     string
		c        Chunk
		tpb      int
		src, dst BlockRun
		err      error
		names    []string
	}{
		{"source starts after the needed block", Chunk{Start: 8, End: 16, FirstBlock: 2}, tpb,
			BlockRun{First: 3, IDs: idRange(0, 7)}, dst, ErrMissingSource, []string{"global block 2"}},
		{"source ends before the needed block", Chunk{Start: 8, End: 24, FirstBlock: 2}, tpb,
			BlockRun{First: 0, IDs: idRange(0, 4)}, dst, ErrMissingSource, []string{"global block 4"}},
		{"misaligned start", Chunk{Start: 6, End: 16, FirstBlock: 1}, tpb, src, dst, ErrMisalignedChunk, []string{"6"}},
		{"misaligned end, not last", Chunk{Start: 8, End: 14, FirstBlock: 2}, tpb, src, dst, ErrMisalignedChunk, []string{"14"}},
		{"wrong first block", Chunk{Start: 8, End: 16, FirstBlock: 3}, tpb, src, dst, ErrBadChunk, []string{"first block 3"}},
		{"end before start", Chunk{Start: 8, End: 4, FirstBlock: 2}, tpb, src, dst, ErrBadChunk, nil},
		{"negative start", Chunk{Start: -4, End: 4, FirstBlock: -1}, tpb, src, dst, ErrBadChunk, nil},
		{"tokens per block 0", Chunk{Start: 0, End: 4}, 0, src, dst, ErrBadLayout, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, d, err := Project(tc.c, tc.tpb, tc.src, tc.dst)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if s != nil || d != nil {
				t.Fatalf("ids on error: %v %v", s, d)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %q", err, n)
				}
			}
		})
	}
}

// TestProjectAliases checks that Project returns sub-slices of the runs
// (no allocation, no copy).
func TestProjectAliases(t *testing.T) {
	src := BlockRun{First: 0, IDs: idRange(0, 64)}
	dst := BlockRun{First: 0, IDs: idRange(64, 128)}
	c := Chunk{Start: 32, End: 64, FirstBlock: 8}
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := Project(c, 4, src, dst); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Project allocates %v times", allocs)
	}
	s, d, _ := Project(c, 4, src, dst)
	if &s[0] != &src.IDs[8] || &d[0] != &dst.IDs[8] {
		t.Fatal("Project copied the ids")
	}
}
