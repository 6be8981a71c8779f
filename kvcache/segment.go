package kvcache

import "fmt"

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
//
// Layers, when set, makes it a part of the chunk: only the global layers
// [Layers.Lo, Layers.Hi) of its tokens, so that a chunk can leave layer
// range by layer range while the forward pass still computes the later
// layers. The zero value is every layer.
type Chunk struct {
	Start      int
	End        int
	FirstBlock int
	Last       bool
	Layers     LayerPart `json:",omitzero"`
}

// LayerPart is the global layers [Lo, Hi) of a model of Of layers; the zero
// value is every layer.
type LayerPart struct {
	Lo, Hi, Of int
}

// SplitLayers splits a model of layers layers into n layer ranges in
// order, as even as integers allow: how a forward pass hands a chunk over
// part by part. n = 0 is one part per layer; n = 1 (or a model of one
// layer) is the whole chunk, the zero LayerPart. n outside [0, layers] is
// the caller's to refuse (LayerParts options check it).
func SplitLayers(layers, n int) []LayerPart {
	if n == 0 {
		n = layers
	}
	if n <= 1 {
		return []LayerPart{{}}
	}
	out := make([]LayerPart, n)
	for p := range out {
		out[p] = LayerPart{Lo: p * layers / n, Hi: (p + 1) * layers / n, Of: layers}
	}
	return out
}

// Whole reports whether p covers every layer.
func (p LayerPart) Whole() bool { return p.Of == 0 || (p.Lo == 0 && p.Hi == p.Of) }

// Final reports whether p ends at the last layer: the part that completes
// its chunk.
func (p LayerPart) Final() bool { return p.Of == 0 || p.Hi == p.Of }

// Contains reports whether global layer L is in p.
func (p LayerPart) Contains(L int) bool { return p.Of == 0 || (p.Lo <= L && L < p.Hi) }

// Check fails, wrapping ErrBadChunk and naming the values, unless p is the
// zero value or 0 ≤ Lo < Hi ≤ Of = layers.
func (p LayerPart) Check(layers int) error {
	if p == (LayerPart{}) {
		return nil
	}
	if p.Of != layers || p.Lo < 0 || p.Lo >= p.Hi || p.Hi > p.Of {
		return fmt.Errorf("%w: layers [%d, %d) of %d: want 0 ≤ Lo < Hi ≤ Of = %d (the model's layers)",
			ErrBadChunk, p.Lo, p.Hi, p.Of, layers)
	}
	return nil
}

// Tokens is End - Start.
func (c Chunk) Tokens() int { return c.End - c.Start }
