package kvcache

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestChunks(t *testing.T) {
	tests := []struct {
		name                  string
		promptLen, chunk, tpb int
		want                  []Chunk
		wantErr               error
		wantMsg               string
	}{
		{"aligned", 128, 64, 32, []Chunk{{Start: 0, End: 64, FirstBlock: 0, Last: false}, {Start: 64, End: 128, FirstBlock: 2, Last: true}}, nil, ""},
		{"partial last", 100, 64, 32, []Chunk{{Start: 0, End: 64, FirstBlock: 0, Last: false}, {Start: 64, End: 100, FirstBlock: 2, Last: true}}, nil, ""},
		{"partial last block only", 70, 32, 32, []Chunk{{Start: 0, End: 32, FirstBlock: 0, Last: false}, {Start: 32, End: 64, FirstBlock: 1, Last: false}, {Start: 64, End: 70, FirstBlock: 2, Last: true}}, nil, ""},
		{"chunk larger than prompt", 50, 4096, 32, []Chunk{{Start: 0, End: 50, FirstBlock: 0, Last: true}}, nil, ""},
		{"chunk equals prompt", 64, 64, 32, []Chunk{{Start: 0, End: 64, FirstBlock: 0, Last: true}}, nil, ""},
		{"one token", 1, 32, 32, []Chunk{{Start: 0, End: 1, FirstBlock: 0, Last: true}}, nil, ""},
		{"empty prompt", 0, 64, 32, []Chunk{}, nil, ""},
		{"misaligned chunk", 128, 48, 32, nil, ErrMisalignedChunk, "chunk size 48 tokens is not a positive multiple of TokensPerBlock 32"},
		{"zero chunk", 128, 0, 32, nil, ErrMisalignedChunk, "chunk size 0"},
		{"negative chunk", 128, -64, 32, nil, ErrMisalignedChunk, "chunk size -64"},
		{"negative prompt", -1, 64, 32, nil, ErrBadChunk, "prompt length -1"},
		{"zero tpb", 128, 64, 0, nil, ErrBadChunk, "TokensPerBlock = 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Chunks(tt.promptLen, tt.chunk, tt.tpb)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) || got != nil {
					t.Fatalf("Chunks = %v, %v; want %v containing %q", got, err, tt.wantErr, tt.wantMsg)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("Chunks = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestChunksProperty: chunks tile [0, promptLen) in order, each validates,
// only the final one is Last, and their blocks tile the prompt's blocks.
func TestChunksProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tpb := rapid.IntRange(1, 64).Draw(t, "tpb")
		chunk := tpb * rapid.IntRange(1, 16).Draw(t, "blocksPerChunk")
		promptLen := rapid.IntRange(0, 5000).Draw(t, "promptLen")
		cs, err := Chunks(promptLen, chunk, tpb)
		if err != nil {
			t.Fatal(err)
		}
		next, nextBlock := 0, 0
		for i, c := range cs {
			if err := c.Validate(promptLen, tpb); err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
			if c.Start != next || c.Tokens() > chunk || c.Last != (i == len(cs)-1) {
				t.Fatalf("chunk %d = %v after token %d", i, c, next)
			}
			first, end := c.Blocks(tpb)
			if first != nextBlock || first != c.FirstBlock {
				t.Fatalf("chunk %d blocks [%d, %d), want first %d", i, first, end, nextBlock)
			}
			next, nextBlock = c.End, end
		}
		if next != promptLen || nextBlock != (promptLen+tpb-1)/tpb {
			t.Fatalf("chunks end at token %d block %d, prompt %d tokens", next, nextBlock, promptLen)
		}
	})
}

func TestChunkValidate(t *testing.T) {
	const promptLen, tpb = 100, 32
	tests := []struct {
		name    string
		c       Chunk
		wantErr error
		wantMsg string
	}{
		{"first", Chunk{Start: 0, End: 64, FirstBlock: 0, Last: false}, nil, ""},
		{"middle", Chunk{Start: 32, End: 64, FirstBlock: 1, Last: false}, nil, ""},
		{"last partial", Chunk{Start: 64, End: 100, FirstBlock: 2, Last: true}, nil, ""},
		{"whole", Chunk{Start: 0, End: 100, FirstBlock: 0, Last: true}, nil, ""},
		{"start misaligned", Chunk{Start: 16, End: 64, FirstBlock: 0, Last: false}, ErrMisalignedChunk, "Start 16 is not a multiple of TokensPerBlock 32"},
		{"end misaligned", Chunk{Start: 0, End: 50, FirstBlock: 0, Last: false}, ErrMisalignedChunk, "End 50 of a chunk that is not the last"},
		{"wrong first block", Chunk{Start: 32, End: 64, FirstBlock: 0, Last: false}, ErrBadChunk, "FirstBlock 0, must be Start/TokensPerBlock = 1"},
		{"last not at end", Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}, ErrBadChunk, "Last = true but End 64 and prompt length 100"},
		{"at end not last", Chunk{Start: 64, End: 100, FirstBlock: 2, Last: false}, ErrBadChunk, "Last = false but End 100"},
		{"past prompt", Chunk{Start: 64, End: 128, FirstBlock: 2, Last: true}, ErrBadChunk, "End 128 is past the prompt length 100"},
		{"empty", Chunk{Start: 32, End: 32, FirstBlock: 1, Last: false}, ErrBadChunk, "empty, End 32 must be > Start 32"},
		{"reversed", Chunk{Start: 64, End: 32, FirstBlock: 2, Last: false}, ErrBadChunk, "empty"},
		{"negative start", Chunk{Start: -32, End: 32, FirstBlock: -1, Last: false}, ErrBadChunk, "Start -32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate(promptLen, tpb)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) ||
				!strings.Contains(err.Error(), tt.c.String()) {
				t.Fatalf("Validate = %v; want %v naming %q and %q", err, tt.wantErr, tt.c, tt.wantMsg)
			}
		})
	}
	for _, bad := range []struct{ promptLen, tpb int }{{100, 0}, {-1, 32}} {
		if err := (Chunk{Start: 0, End: 32, FirstBlock: 0, Last: false}).Validate(bad.promptLen, bad.tpb); !errors.Is(err, ErrBadChunk) {
			t.Errorf("Validate(%d, %d) = %v, want ErrBadChunk", bad.promptLen, bad.tpb, err)
		}
	}
}

func TestChunkBlocksAndString(t *testing.T) {
	tests := []struct {
		c          Chunk
		tpb        int
		first, end int
		str        string
	}{
		{Chunk{Start: 0, End: 64, FirstBlock: 0, Last: false}, 32, 0, 2, "chunk [0, 64) block 0"},
		{Chunk{Start: 64, End: 100, FirstBlock: 2, Last: true}, 32, 2, 4, "chunk [64, 100) block 2 last"},
		{Chunk{Start: 64, End: 65, FirstBlock: 2, Last: true}, 32, 2, 3, "chunk [64, 65) block 2 last"},
		{Chunk{Start: 64, End: 64, FirstBlock: 2, Last: false}, 32, 0, 0, "chunk [64, 64) block 2"},
		{Chunk{Start: 0, End: 64, FirstBlock: 0, Last: false}, 0, 0, 0, "chunk [0, 64) block 0"},
	}
	for _, tt := range tests {
		if f, e := tt.c.Blocks(tt.tpb); f != tt.first || e != tt.end {
			t.Errorf("%v.Blocks(%d) = [%d, %d), want [%d, %d)", tt.c, tt.tpb, f, e, tt.first, tt.end)
		}
		if s := tt.c.String(); s != tt.str {
			t.Errorf("String() = %q, want %q", s, tt.str)
		}
	}
}

func TestChunkRuns(t *testing.T) {
	ids := [][]BlockID{{10, 11, 12, 13}, nil, {20, 21, 22, 23}}
	runs := Chunk{Start: 64, End: 100, FirstBlock: 2, Last: true}.Runs(32, ids)
	want := []BlockRun{{First: 2, IDs: []BlockID{12, 13}}, {}, {First: 2, IDs: []BlockID{22, 23}}}
	if !reflect.DeepEqual(runs, want) {
		t.Errorf("Runs = %+v, want %+v", runs, want)
	}
}

// TestLayerPart: the zero part is every layer; a part is checked against
// the model's layer count, and names its values when refused.
func TestLayerPart(t *testing.T) {
	for _, c := range []struct {
		p            LayerPart
		whole, final bool
		in, out      int // a layer inside, one outside (-1: none)
		err          string
	}{
		{LayerPart{}, true, true, 31, -1, ""},
		{LayerPart{Lo: 0, Hi: 32, Of: 32}, true, true, 0, -1, ""},
		{LayerPart{Lo: 0, Hi: 8, Of: 32}, false, false, 7, 8, ""},
		{LayerPart{Lo: 24, Hi: 32, Of: 32}, false, true, 24, 23, ""},
		{LayerPart{Lo: 8, Hi: 8, Of: 32}, false, false, -1, 8, "layers [8, 8) of 32"},
		{LayerPart{Lo: 0, Hi: 33, Of: 32}, false, false, 0, -1, "layers [0, 33) of 32"},
		{LayerPart{Lo: 0, Hi: 16, Of: 16}, true, true, 0, -1, "Of = 32 (the model's layers)"},
		{LayerPart{Lo: -1, Hi: 4, Of: 32}, false, false, 0, 4, "layers [-1, 4) of 32"},
	} {
		if c.p.Whole() != c.whole || c.p.Final() != c.final {
			t.Errorf("%+v: Whole %t Final %t, want %t %t", c.p, c.p.Whole(), c.p.Final(), c.whole, c.final)
		}
		if c.in >= 0 && !c.p.Contains(c.in) {
			t.Errorf("%+v does not contain layer %d", c.p, c.in)
		}
		if c.out >= 0 && c.p.Contains(c.out) {
			t.Errorf("%+v contains layer %d", c.p, c.out)
		}
		err := c.p.Check(32)
		if c.err == "" && err != nil {
			t.Errorf("%+v: Check: %v", c.p, err)
		}
		if c.err != "" && (!errors.Is(err, ErrBadChunk) || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%+v: Check: %v, want ErrBadChunk naming %q", c.p, err, c.err)
		}
	}
	c := Chunk{Start: 0, End: 64, FirstBlock: 0, Layers: LayerPart{Lo: 8, Hi: 16, Of: 32}}
	if got, want := c.String(), "chunk [0, 64) block 0 layers [8, 16) of 32"; got != want {
		t.Errorf("String %q, want %q", got, want)
	}
}

// TestSplitLayers: the layer ranges cover the model's layers in order.
func TestSplitLayers(t *testing.T) {
	for _, n := range []int{1, 0} {
		if got := SplitLayers(1, n); len(got) != 1 || got[0] != (LayerPart{}) {
			t.Fatalf("SplitLayers(1, %d) = %v, want one whole part", n, got)
		}
	}
	if got := SplitLayers(32, 1); len(got) != 1 || got[0] != (LayerPart{}) {
		t.Fatalf("one part: %v, want one whole", got)
	}
	if got := SplitLayers(32, 0); len(got) != 32 || got[31] != (LayerPart{Lo: 31, Hi: 32, Of: 32}) {
		t.Fatalf("default parts %v, want one per layer", got)
	}
	got := SplitLayers(32, 5)
	next := 0
	for _, p := range got {
		if p.Lo != next || p.Hi <= p.Lo || p.Of != 32 || p.Check(32) != nil {
			t.Fatalf("parts %v: %v does not follow layer %d", got, p, next)
		}
		next = p.Hi
	}
	if len(got) != 5 || next != 32 {
		t.Fatalf("parts %v: want 5 covering 32 layers", got)
	}
}

// TestChunkRunsOfShortIDs: a group's block ids that end before the
// chunk's blocks give a short (or empty) run starting at the chunk's
// first block, not a panic: the caller's Chunk is then refused naming
// what is missing. (Checked to fail: the slice of ids past their end
// panicked.)
func TestChunkRunsOfShortIDs(t *testing.T) {
	c := Chunk{Start: 32, End: 64} // blocks [2, 4) of 16 tokens
	runs := c.Runs(16, [][]BlockID{{10, 11, 12}, {20}, {30, 31, 32, 33, 34}})
	if r := runs[0]; r.First != 2 || len(r.IDs) != 1 || r.IDs[0] != 12 {
		t.Errorf("group 0 (ids end mid-chunk): %+v, want First 2, IDs [12]", r)
	}
	if r := runs[1]; r.First != 2 || len(r.IDs) != 0 || r.End() >= 4 {
		t.Errorf("group 1 (ids end before the chunk): %+v, want an empty run at 2", r)
	}
	if r := runs[2]; r.First != 2 || len(r.IDs) != 2 || r.IDs[0] != 32 || r.End() != 4 {
		t.Errorf("group 2 (ids cover it): %+v, want First 2, IDs [32 33]", r)
	}
}

// TestChunkClip: Clip keeps the run's blocks among the chunk's own, from
// a run that starts before block 0, ends past the chunk, misses it or
// only partly covers it, and never indexes outside the run (a First so
// large that End overflows clips to nothing).
func TestChunkClip(t *testing.T) {
	c := Chunk{Start: 32, End: 64, FirstBlock: 2} // blocks [2, 4) of 16 tokens
	ids := []BlockID{10, 11, 12, 13, 14, 15, 16}
	tests := []struct {
		name string
		run  BlockRun
		want BlockRun
	}{
		{"exact", BlockRun{First: 2, IDs: ids[:2]}, BlockRun{First: 2, IDs: ids[:2]}},
		{"whole table", BlockRun{First: 0, IDs: ids}, BlockRun{First: 2, IDs: ids[2:4]}},
		{"from before block 0", BlockRun{First: -3, IDs: ids}, BlockRun{First: 2, IDs: ids[5:7]}},
		{"partly: its tail", BlockRun{First: 3, IDs: ids}, BlockRun{First: 3, IDs: ids[:1]}},
		{"partly: its head", BlockRun{First: 1, IDs: ids[:2]}, BlockRun{First: 2, IDs: ids[1:2]}},
		{"before it", BlockRun{First: -5, IDs: ids[:3]}, BlockRun{First: 2}},
		{"after it", BlockRun{First: 4, IDs: ids}, BlockRun{First: 2}},
		{"empty", BlockRun{First: 2}, BlockRun{First: 2}},
		{"End overflows", BlockRun{First: int(^uint(0)>>1) - 2, IDs: ids}, BlockRun{First: 2}},
	}
	for _, tt := range tests {
		got := c.Clip(16, tt.run)
		if got.First != tt.want.First || !slices.Equal(got.IDs, tt.want.IDs) {
			t.Errorf("%s: Clip(%+v) = %+v, want %+v", tt.name, tt.run, got, tt.want)
		}
		if len(got.IDs) > 0 && cap(got.IDs) != len(got.IDs) {
			t.Errorf("%s: clipped ids have room to grow into the caller's (cap %d, len %d)", tt.name, cap(got.IDs), len(got.IDs))
		}
	}
	if got := (Chunk{Start: 48, End: 50, FirstBlock: 3, Last: true}).Clip(16, BlockRun{First: 0, IDs: ids}); got.First != 3 || !slices.Equal(got.IDs, ids[3:4]) {
		t.Errorf("a last chunk ending mid-block: Clip = %+v, want block 3 alone", got)
	}
}

// TestChunksOfAHugeChunkSize: a chunk size at or above the prompt's gives
// one chunk, up to the largest valid one: the slice's capacity was
// (promptLen+chunkTokens-1)/chunkTokens, which overflowed to a negative
// capacity and panicked (found in a review; checked to fail: "makeslice:
// cap out of range" for prompts past 1024 tokens).
func TestChunksOfAHugeChunkSize(t *testing.T) {
	const tpb = 32
	chunkTokens := math.MaxInt &^ 1023 // a positive multiple of 32
	for _, prompt := range []int{1, 1024, 1025, 2049, 4096} {
		cs, err := Chunks(prompt, chunkTokens, tpb)
		if err != nil || len(cs) != 1 || cs[0] != (Chunk{End: prompt, Last: true}) {
			t.Fatalf("Chunks(%d, %d, %d) = %v, %v; want one last chunk", prompt, chunkTokens, tpb, cs, err)
		}
	}
}
