package kvcache

// Segment is one contiguous write: Len bytes from offset Src of the source
// region to offset Dst of the destination region.
type Segment struct {
	Src uint64
	Dst uint64
	Len uint64
}

// End returns the offsets one past the segment on each side.
func (s Segment) End() (src, dst uint64) { return s.Src + s.Len, s.Dst + s.Len }

// BlockID names one block of a pool.
type BlockID int32

// NoBlock is the zero-value sentinel for "no block".
const NoBlock BlockID = -1

// BlockRun maps consecutive global block indices of one request in one layer
// group to physical block ids: global block First+i lives in IDs[i].
type BlockRun struct {
	First int
	IDs   []BlockID
}

// End is the global block index one past the run.
func (r BlockRun) End() int { return r.First + len(r.IDs) }

// Chunk is one prefill chunk of a request: tokens [Start, End), beginning at
// global block index FirstBlock (= Start / TokensPerBlock), Last for the
// request's final chunk. Every chunk but the last is block-aligned at both
// ends; the last may end mid-block.
type Chunk struct {
	Start      int
	End        int
	FirstBlock int
	Last       bool
}

// Tokens is End - Start.
func (c Chunk) Tokens() int { return c.End - c.Start }
