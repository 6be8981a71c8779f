package kvcache

import "fmt"

// Project maps chunk c of a request onto the blocks that move for it in one
// layer group, with tpb tokens per block.
//
// The chunk covers the global blocks [c.Start/tpb, ceil(c.End/tpb)). dst is
// what the receiver needs of the group (its resident blocks that were not a
// prefix hit); only the part of the chunk inside dst moves. A chunk wholly
// outside dst — a sliding-window group whose window the chunk precedes, or a
// prefix hit — projects to nothing: empty results and a nil error. Every
// block of the intersection must be in src (the sender's resident blocks),
// else the error wraps ErrMissingSource and names the first missing global
// block.
//
// srcIDs[i] and dstIDs[i] are the physical ids of the same global block on
// the two sides, in ascending global order. They are sub-slices of src.IDs
// and dst.IDs (no allocation); the caller must not modify them.
//
// The chunk must be well formed: 0 ≤ Start ≤ End, FirstBlock = Start/tpb,
// Start block-aligned and End block-aligned unless Last (errors wrap
// ErrBadChunk or ErrMisalignedChunk).
func Project(c Chunk, tpb int, src, dst BlockRun) (srcIDs, dstIDs []BlockID, err error) {
	if tpb < 1 {
		return nil, nil, fmt.Errorf("%w: tokens per block %d < 1", ErrBadLayout, tpb)
	}
	if c.Start < 0 || c.End < c.Start {
		return nil, nil, fmt.Errorf("%w: tokens [%d,%d)", ErrBadChunk, c.Start, c.End)
	}
	if c.Start%tpb != 0 {
		return nil, nil, fmt.Errorf("%w: start token %d not a multiple of %d tokens per block",
			ErrMisalignedChunk, c.Start, tpb)
	}
	if !c.Last && c.End%tpb != 0 {
		return nil, nil, fmt.Errorf("%w: non-final chunk [%d,%d) ends mid-block (%d tokens per block)",
			ErrMisalignedChunk, c.Start, c.End, tpb)
	}
	if c.FirstBlock != c.Start/tpb {
		return nil, nil, fmt.Errorf("%w: first block %d, want start %d / %d = %d",
			ErrBadChunk, c.FirstBlock, c.Start, tpb, c.Start/tpb)
	}
	lo := max(c.FirstBlock, dst.First)
	hi := min(c.FirstBlock+ceilDiv(c.End-c.Start, tpb), dst.End())
	if lo >= hi {
		return nil, nil, nil
	}
	if lo < src.First {
		return nil, nil, fmt.Errorf("%w: global block %d (source holds [%d,%d))",
			ErrMissingSource, lo, src.First, src.End())
	}
	if hi > src.End() {
		return nil, nil, fmt.Errorf("%w: global block %d (source holds [%d,%d))",
			ErrMissingSource, max(lo, src.End()), src.First, src.End())
	}
	return src.IDs[lo-src.First : hi-src.First], dst.IDs[lo-dst.First : hi-dst.First], nil
}
