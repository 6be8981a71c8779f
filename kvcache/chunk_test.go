package kvcache

import (
	"errors"
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
		{"aligned", 128, 64, 32, []Chunk{{0, 64, 0, false}, {64, 128, 2, true}}, nil, ""},
		{"partial last", 100, 64, 32, []Chunk{{0, 64, 0, false}, {64, 100, 2, true}}, nil, ""},
		{"partial last block only", 70, 32, 32, []Chunk{{0, 32, 0, false}, {32, 64, 1, false}, {64, 70, 2, true}}, nil, ""},
		{"chunk larger than prompt", 50, 4096, 32, []Chunk{{0, 50, 0, true}}, nil, ""},
		{"chunk equals prompt", 64, 64, 32, []Chunk{{0, 64, 0, true}}, nil, ""},
		{"one token", 1, 32, 32, []Chunk{{0, 1, 0, true}}, nil, ""},
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
		{"first", Chunk{0, 64, 0, false}, nil, ""},
		{"middle", Chunk{32, 64, 1, false}, nil, ""},
		{"last partial", Chunk{64, 100, 2, true}, nil, ""},
		{"whole", Chunk{0, 100, 0, true}, nil, ""},
		{"start misaligned", Chunk{16, 64, 0, false}, ErrMisalignedChunk, "Start 16 is not a multiple of TokensPerBlock 32"},
		{"end misaligned", Chunk{0, 50, 0, false}, ErrMisalignedChunk, "End 50 of a chunk that is not the last"},
		{"wrong first block", Chunk{32, 64, 0, false}, ErrBadChunk, "FirstBlock 0, must be Start/TokensPerBlock = 1"},
		{"last not at end", Chunk{0, 64, 0, true}, ErrBadChunk, "Last = true but End 64 and prompt length 100"},
		{"at end not last", Chunk{64, 100, 2, false}, ErrBadChunk, "Last = false but End 100"},
		{"past prompt", Chunk{64, 128, 2, true}, ErrBadChunk, "End 128 is past the prompt length 100"},
		{"empty", Chunk{32, 32, 1, false}, ErrBadChunk, "empty, End 32 must be > Start 32"},
		{"reversed", Chunk{64, 32, 2, false}, ErrBadChunk, "empty"},
		{"negative start", Chunk{-32, 32, -1, false}, ErrBadChunk, "Start -32"},
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
		if err := (Chunk{0, 32, 0, false}).Validate(bad.promptLen, bad.tpb); !errors.Is(err, ErrBadChunk) {
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
		{Chunk{0, 64, 0, false}, 32, 0, 2, "chunk [0, 64) block 0"},
		{Chunk{64, 100, 2, true}, 32, 2, 4, "chunk [64, 100) block 2 last"},
		{Chunk{64, 65, 2, true}, 32, 2, 3, "chunk [64, 65) block 2 last"},
		{Chunk{64, 64, 2, false}, 32, 0, 0, "chunk [64, 64) block 2"},
		{Chunk{0, 64, 0, false}, 0, 0, 0, "chunk [0, 64) block 0"},
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
	runs := Chunk{64, 100, 2, true}.Runs(32, ids)
	want := []BlockRun{{First: 2, IDs: []BlockID{12, 13}}, {}, {First: 2, IDs: []BlockID{22, 23}}}
	if !reflect.DeepEqual(runs, want) {
		t.Errorf("Runs = %+v, want %+v", runs, want)
	}
}
