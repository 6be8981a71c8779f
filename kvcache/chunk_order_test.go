package kvcache

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestChunkOrder hands scripts of chunks and layer parts to a ChunkOrder of
// a 100-token prompt (blocks of 16 tokens, chunks of 32: c0, c1 and the
// last, c2, ending mid-block) of a 4-layer model. Each step is checked; an
// accepted one is then taken. A refused step must name what was wrong and
// leave the order exactly as it was, so that the right chunk after it is
// accepted.
func TestChunkOrder(t *testing.T) {
	const prompt, tpb, layers = 100, 16, 4
	ids := [][]BlockID{{10, 11, 12, 13, 14, 15, 16}, {}, {20, 21, 22, 23, 24, 25, 26}}
	c0 := Chunk{Start: 0, End: 32, FirstBlock: 0}
	c1 := Chunk{Start: 32, End: 64, FirstBlock: 2}
	c2 := Chunk{Start: 64, End: 100, FirstBlock: 4, Last: true}
	p := func(c Chunk, lo, hi int) Chunk {
		c.Layers = LayerPart{Lo: lo, Hi: hi, Of: layers}
		return c
	}
	// other is the chunk's sources with one block of group 2 replaced.
	other := func(c Chunk) []BlockRun {
		runs := CloneRuns(c.Runs(tpb, ids))
		runs[2].IDs[0] = 99
		return runs
	}
	type step struct {
		c       Chunk
		src     []BlockRun // nil: c.Runs(tpb, ids)
		wantErr error      // nil: accepted, then taken
		wantMsg string
	}
	ok := func(c Chunk) step { return step{c: c} }
	order := func(c Chunk, msg string) step { return step{c: c, wantErr: ErrChunkOrder, wantMsg: msg} }
	tests := []struct {
		name  string
		steps []step
		done  bool // Done after the last step
	}{
		{"whole chunks", []step{ok(c0), ok(c1), ok(c2)}, true},
		{"nothing after the last chunk", []step{ok(c0), ok(c1), ok(c2),
			order(c0, "chunk [0, 32) block 0 after the last chunk"),
			order(c2, "chunk [64, 100) block 4 last after the last chunk"),
			order(p(c2, 0, 4), "after the last chunk")}, true},
		{"chunks in token order", []step{
			order(c1, "chunk starts at token 32, expected 0"),
			ok(c0),
			order(c0, "chunk starts at token 0, expected 32"),
			order(c2, "chunk starts at token 64, expected 32"),
			ok(c1), ok(c2)}, true},
		{"invalid chunks", []step{
			{c: Chunk{Start: 8, End: 32, FirstBlock: 0}, wantErr: ErrMisalignedChunk, wantMsg: "Start 8 is not a multiple of TokensPerBlock 16"},
			{c: Chunk{Start: 0, End: 32, FirstBlock: 1}, wantErr: ErrBadChunk, wantMsg: "FirstBlock 1, must be Start/TokensPerBlock = 0"},
			{c: Chunk{Start: 64, End: 100, FirstBlock: 4}, wantErr: ErrBadChunk, wantMsg: "Last = false but End 100 and prompt length 100"},
			{c: Chunk{Start: 64, End: 128, FirstBlock: 4, Last: true}, src: c2.Runs(tpb, ids), wantErr: ErrBadChunk, wantMsg: "End 128 is past the prompt length 100"},
			ok(c0)}, false},
		{"layers that are not the model's", []step{
			{c: Chunk{Start: 0, End: 32, Layers: LayerPart{Lo: 0, Hi: 2, Of: 8}}, wantErr: ErrBadChunk,
				wantMsg: "chunk [0, 32): kvcache: bad chunk: layers [0, 2) of 8: want 0 ≤ Lo < Hi ≤ Of = 4"},
			{c: p(c0, 2, 2), wantErr: ErrBadChunk, wantMsg: "layers [2, 2) of 4: want"},
			{c: p(c0, 0, 5), wantErr: ErrBadChunk, wantMsg: "layers [0, 5) of 4: want"},
			{c: p(c0, -1, 2), wantErr: ErrBadChunk, wantMsg: "layers [-1, 2) of 4: want"},
			ok(p(c0, 0, 2))}, false},
		{"the first part starts at layer 0", []step{
			order(p(c0, 1, 2), "chunk [0, 32) block 0 layers [1, 2) of 4: the first part of a chunk starts at layer 0"),
			ok(p(c0, 0, 1)), ok(p(c0, 1, 4)),
			order(p(c1, 2, 4), "the first part of a chunk starts at layer 0"),
			ok(p(c1, 0, 4))}, false},
		{"parts of one chunk", []step{
			ok(p(c0, 0, 2)),
			order(p(c0, 3, 4), "chunk [0, 32) block 0 layers [3, 4) of 4: the next part of the chunk starts at layer 2"),
			order(p(c0, 0, 4), "the next part of the chunk starts at layer 2"),
			order(c0, "chunk [0, 32) block 0: the next part of the chunk starts at layer 2"),
			order(p(c1, 0, 1), "chunk [32, 64) block 2 layers [0, 1) of 4 while layers [2, 4) of chunk [0, 32) block 0 layers [0, 2) of 4 are not handed yet"),
			order(c1, "are not handed yet"),
			order(c2, "are not handed yet"),
			{c: p(c0, 2, 3), src: other(c0), wantErr: ErrChunkOrder, wantMsg: "chunk [0, 32) block 0 layers [2, 3) of 4: source blocks differ from the chunk's first part"},
			{c: p(c0, 2, 3), src: c0.Runs(tpb, ids)[:2], wantErr: ErrChunkOrder, wantMsg: "source blocks differ"},
			ok(p(c0, 2, 3)), ok(p(c0, 3, 4)),
			ok(c1)}, false},
		{"whole chunks and parts interleaved", []step{
			ok(c0), ok(p(c1, 0, 1)), ok(p(c1, 1, 2)),
			order(c2, "layers [2, 4) of chunk [32, 64) block 2 layers [0, 1) of 4 are not handed yet"),
			ok(p(c1, 2, 4)), ok(c2)}, true},
		{"every layer as a part is the whole chunk", []step{ok(p(c0, 0, 4)), ok(c1), ok(p(c2, 0, 4))}, true},
		{"the final part of the last chunk ends it", []step{
			ok(c0), ok(c1), ok(p(c2, 0, 3)),
			order(p(c2, 0, 3), "the next part of the chunk starts at layer 3"),
			ok(p(c2, 3, 4)),
			order(p(c2, 3, 4), "after the last chunk")}, true},
		{"a part of the last chunk does not end it", []step{ok(c0), ok(c1), ok(p(c2, 0, 1)), ok(p(c2, 1, 3))}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewChunkOrder(prompt, tpb, layers)
			for i, st := range tt.steps {
				src := st.src
				if src == nil {
					src = st.c.Runs(tpb, ids)
				}
				before := o // with its own copy of the sources it holds
				if o.partSrc != nil {
					before.partSrc = CloneRuns(o.partSrc)
				}
				err := o.Check(st.c, src)
				if !reflect.DeepEqual(o, before) {
					t.Fatalf("step %d: Check(%v) changed the order: %+v, was %+v", i, st.c, o, before)
				}
				if st.wantErr == nil {
					if err != nil {
						t.Fatalf("step %d: Check(%v) = %v, want it accepted", i, st.c, err)
					}
					o.Took(st.c, src)
					continue
				}
				if !errors.Is(err, st.wantErr) || !strings.Contains(err.Error(), st.wantMsg) {
					t.Fatalf("step %d: Check(%v) = %v, want %v naming %q", i, st.c, err, st.wantErr, st.wantMsg)
				}
				if st.wantErr != ErrChunkOrder && errors.Is(err, ErrChunkOrder) {
					t.Fatalf("step %d: Check(%v) = %v, an invalid chunk is not out of order", i, st.c, err)
				}
			}
			if o.Done() != tt.done {
				t.Fatalf("Done = %t, want %t", o.Done(), tt.done)
			}
		})
	}
}

// TestChunkOrderErrorText: an out-of-order error reads as the detail alone
// (the caller names its sentinel and the request), yet matches
// ErrChunkOrder.
func TestChunkOrderErrorText(t *testing.T) {
	o := NewChunkOrder(64, 16, 2)
	err := o.Check(Chunk{Start: 32, End: 64, FirstBlock: 2, Last: true}, nil)
	if want := "chunk starts at token 32, expected 0"; err == nil || err.Error() != want || !errors.Is(err, ErrChunkOrder) {
		t.Fatalf("Check = %v, want %q wrapping ErrChunkOrder", err, want)
	}
}

// TestChunkOrderKeepsSources: the sources of a chunk's first part are
// copied, so that a caller reusing its slices cannot move them.
func TestChunkOrderKeepsSources(t *testing.T) {
	o := NewChunkOrder(64, 16, 2)
	first := Chunk{Start: 0, End: 32, FirstBlock: 0, Layers: LayerPart{Lo: 0, Hi: 1, Of: 2}}
	src := []BlockRun{{First: 0, IDs: []BlockID{4, 5}}}
	if err := o.Check(first, src); err != nil {
		t.Fatal(err)
	}
	o.Took(first, src)
	src[0].IDs[0] = 7
	next := first
	next.Layers.Lo, next.Layers.Hi = 1, 2
	if err := o.Check(next, src); !errors.Is(err, ErrChunkOrder) {
		t.Fatalf("Check with a changed source = %v, want ErrChunkOrder", err)
	}
	if !o.InPart() {
		t.Fatal("InPart = false between the parts of a chunk")
	}
	if err := o.Check(next, []BlockRun{{First: 0, IDs: []BlockID{4, 5}}}); err != nil {
		t.Fatalf("Check with the first part's sources = %v", err)
	}
	o.Took(next, src)
	if o.InPart() || o.Done() {
		t.Fatalf("after the final part: InPart %t, Done %t; want neither", o.InPart(), o.Done())
	}
}
