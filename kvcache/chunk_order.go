package kvcache

import (
	"fmt"
	"slices"
)

// ChunkOrder is the order in which one request's chunks, and the layer
// parts of a chunk, may be handed over: each chunk starts where the one
// before ended, from token 0, and nothing comes after the last. A chunk
// may leave whole or in layer parts (Chunk.Layers): the parts of one chunk
// come in layer order, the first at layer 0, each starting where the one
// before ended, all with the same chunk and the same source blocks; the
// part that reaches the model's last layer completes the chunk, and no
// other chunk comes before it.
//
// Check says whether a chunk may come next without changing anything;
// Took records one that was taken. A caller with checks of its own (the
// engine's handle: the source blocks are allocated) runs them between the
// two, so that a refused chunk leaves the order as it was and the right
// one is then accepted.
//
// The zero value is not usable: make one with NewChunkOrder. A ChunkOrder
// is not safe for concurrent use.
type ChunkOrder struct {
	promptLen, tpb, layers int
	next                   int // the next chunk's Start
	done                   bool
	// part is the chunk whose layer parts are being handed (its first
	// part, never final, so Layers.Of > 0; the zero Chunk when none) with
	// its sources, and nextLayer the layer its next part must start at.
	part      Chunk
	partSrc   []BlockRun
	nextLayer int
}

// NewChunkOrder is the order of a request of promptLen tokens in blocks of
// tokensPerBlock tokens, of a model of layers layers (the Of of every
// layer part), before its first chunk.
func NewChunkOrder(promptLen, tokensPerBlock, layers int) ChunkOrder {
	return ChunkOrder{promptLen: promptLen, tpb: tokensPerBlock, layers: layers}
}

// Check returns nil when c, whose KV sits in src, may be handed next, and
// otherwise an error naming c and what was expected; it changes nothing.
//
// A chunk that is invalid by itself fails as Chunk.Validate does (wrapping
// ErrMisalignedChunk or ErrBadChunk), and layers that are not a part of
// the model's as LayerPart.Check does, prefixed with the chunk. A chunk out
// of order wraps ErrChunkOrder, and its text is the detail alone — "chunk
// starts at token 64, expected 32", "… after the last chunk", "… are not
// handed yet", "… starts at layer 2", "… source blocks differ …" — for the
// caller to wrap in its own sentinel and name the request.
func (o *ChunkOrder) Check(c Chunk, src []BlockRun) error {
	if o.done {
		return orderErrorf("%v after the last chunk", c)
	}
	if err := c.Validate(o.promptLen, o.tpb); err != nil {
		return err
	}
	if err := c.Layers.Check(o.layers); err != nil {
		return fmt.Errorf("chunk [%d, %d): %w", c.Start, c.End, err) // err names the layers
	}
	if o.InPart() {
		want := o.part
		want.Layers = c.Layers
		switch {
		case c != want:
			return orderErrorf("%v while layers [%d, %d) of %v are not handed yet", c, o.nextLayer, o.part.Layers.Of, o.part)
		case c.Layers.Lo != o.nextLayer:
			return orderErrorf("%v: the next part of the chunk starts at layer %d", c, o.nextLayer)
		case !sameRuns(src, o.partSrc):
			return orderErrorf("%v: source blocks differ from the chunk's first part", c)
		}
		return nil
	}
	if c.Start != o.next {
		return orderErrorf("chunk starts at token %d, expected %d", c.Start, o.next)
	}
	if c.Layers.Lo != 0 {
		return orderErrorf("%v: the first part of a chunk starts at layer 0", c)
	}
	return nil
}

// Took records that c, with its source blocks src, was handed: Check
// accepted it (recording a chunk it refuses leaves the order meaningless).
// src is copied when c is the first of several parts.
func (o *ChunkOrder) Took(c Chunk, src []BlockRun) {
	if c.Layers.Final() {
		o.next, o.done = c.End, c.Last
		o.part, o.partSrc = Chunk{}, nil
	} else if !o.InPart() {
		o.part, o.partSrc = c, CloneRuns(src)
	}
	o.nextLayer = c.Layers.Hi
}

// InPart reports whether a chunk's first layer parts were taken and the
// rest are due: the next chunk Check accepts is that chunk's next part,
// with the sources of its first.
func (o *ChunkOrder) InPart() bool { return o.part.Layers.Of > 0 }

// Done reports whether the last chunk was taken whole or to its last
// layer: Check refuses anything more.
func (o *ChunkOrder) Done() bool { return o.done }

// orderError is an ErrChunkOrder whose text is the detail alone.
type orderError struct{ msg string }

func orderErrorf(format string, args ...any) error {
	return &orderError{fmt.Sprintf(format, args...)}
}

func (e *orderError) Error() string { return e.msg }
func (e *orderError) Unwrap() error { return ErrChunkOrder }

// CloneBlockTable copies a block table (ids per layer group) in two
// allocations; nil stays nil, and an empty table or group stays empty,
// not nil.
func CloneBlockTable(t [][]BlockID) [][]BlockID {
	if t == nil {
		return nil
	}
	n := 0
	for _, ids := range t {
		n += len(ids)
	}
	out, all := make([][]BlockID, len(t)), make([]BlockID, 0, n)
	for g, ids := range t {
		if ids == nil {
			continue
		}
		lo := len(all)
		all = append(all, ids...)
		out[g] = all[lo:len(all):len(all)]
	}
	return out
}

// CloneRuns copies runs and their ids: a chunk's block table of one or two
// layer groups and up to 8 blocks in one allocation (a chunk of a token
// per block, as a decode-sized transfer), a larger one in two.
func CloneRuns(runs []BlockRun) []BlockRun {
	n := 0
	for _, r := range runs {
		n += len(r.IDs)
	}
	var out []BlockRun
	var ids []BlockID
	if len(runs) <= 2 && n <= 8 {
		s := new(struct {
			runs [2]BlockRun
			ids  [8]BlockID
		})
		out, ids = s.runs[:len(runs)], s.ids[:0]
	} else {
		out, ids = make([]BlockRun, len(runs)), make([]BlockID, 0, n)
	}
	for g, r := range runs {
		ids = append(ids, r.IDs...)
		out[g] = BlockRun{First: r.First, IDs: ids[len(ids)-len(r.IDs) : len(ids) : len(ids)]}
	}
	return out
}

func sameRuns(a, b []BlockRun) bool {
	return slices.EqualFunc(a, b, func(x, y BlockRun) bool { return x.First == y.First && slices.Equal(x.IDs, y.IDs) })
}
