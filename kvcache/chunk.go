package kvcache

import "fmt"

// Chunks slices a prompt of promptLen tokens into prefill chunks of
// chunkTokens tokens each: every chunk starts and, except the last, ends on
// a block boundary; the last one may be shorter and end mid-block. A chunk
// size at or above promptLen gives a single chunk with Last set.
//
// Errors: chunkTokens that is not a positive multiple of tokensPerBlock
// wraps ErrMisalignedChunk (chunks are never rounded); promptLen < 0 or
// tokensPerBlock < 1 wraps ErrBadChunk. An empty prompt (promptLen == 0)
// has no chunks: Chunks returns an empty slice and no error.
func Chunks(promptLen, chunkTokens, tokensPerBlock int) ([]Chunk, error) {
	if tokensPerBlock < 1 {
		return nil, fmt.Errorf("%w: TokensPerBlock = %d, must be ≥ 1", ErrBadChunk, tokensPerBlock)
	}
	if promptLen < 0 {
		return nil, fmt.Errorf("%w: prompt length %d, must be ≥ 0", ErrBadChunk, promptLen)
	}
	if chunkTokens < 1 || chunkTokens%tokensPerBlock != 0 {
		return nil, fmt.Errorf("%w: chunk size %d tokens is not a positive multiple of TokensPerBlock %d",
			ErrMisalignedChunk, chunkTokens, tokensPerBlock)
	}
	out := make([]Chunk, 0, ceilDiv(promptLen, chunkTokens))
	for start := 0; start < promptLen; start += chunkTokens {
		end := start + min(chunkTokens, promptLen-start)
		out = append(out, Chunk{Start: start, End: end, FirstBlock: start / tokensPerBlock, Last: end == promptLen})
	}
	return out, nil
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0, without the overflow of
// (a+b-1)/b: a chunk size near the largest int is valid (one chunk).
func ceilDiv(a, b int) int {
	n := a / b
	if a%b != 0 {
		n++
	}
	return n
}

// Validate checks a chunk supplied from outside (a serving framework or a
// peer) against a prompt of promptLen tokens and blocks of tokensPerBlock
// tokens. It returns an error naming the chunk and the offending value:
// wrapping ErrMisalignedChunk when Start, or End of a chunk other than the
// last, is not a multiple of tokensPerBlock; wrapping ErrBadChunk when the
// chunk is empty or out of [0, promptLen], when FirstBlock ≠ Start /
// tokensPerBlock, when Last disagrees with End == promptLen, or when
// promptLen < 0 or tokensPerBlock < 1.
func (c Chunk) Validate(promptLen, tokensPerBlock int) error {
	switch {
	case tokensPerBlock < 1:
		return fmt.Errorf("%w: %v: TokensPerBlock = %d, must be ≥ 1", ErrBadChunk, c, tokensPerBlock)
	case promptLen < 0:
		return fmt.Errorf("%w: %v: prompt length %d, must be ≥ 0", ErrBadChunk, c, promptLen)
	case c.Start < 0:
		return fmt.Errorf("%w: %v: Start %d, must be ≥ 0", ErrBadChunk, c, c.Start)
	case c.End <= c.Start:
		return fmt.Errorf("%w: %v: empty, End %d must be > Start %d", ErrBadChunk, c, c.End, c.Start)
	case c.End > promptLen:
		return fmt.Errorf("%w: %v: End %d is past the prompt length %d", ErrBadChunk, c, c.End, promptLen)
	case c.Start%tokensPerBlock != 0:
		return fmt.Errorf("%w: %v: Start %d is not a multiple of TokensPerBlock %d",
			ErrMisalignedChunk, c, c.Start, tokensPerBlock)
	case c.FirstBlock != c.Start/tokensPerBlock:
		return fmt.Errorf("%w: %v: FirstBlock %d, must be Start/TokensPerBlock = %d",
			ErrBadChunk, c, c.FirstBlock, c.Start/tokensPerBlock)
	case c.Last != (c.End == promptLen):
		return fmt.Errorf("%w: %v: Last = %t but End %d and prompt length %d",
			ErrBadChunk, c, c.Last, c.End, promptLen)
	case !c.Last && c.End%tokensPerBlock != 0:
		return fmt.Errorf("%w: %v: End %d of a chunk that is not the last is not a multiple of TokensPerBlock %d",
			ErrMisalignedChunk, c, c.End, tokensPerBlock)
	}
	return nil
}

// Blocks returns the global block indices [first, end) the chunk writes:
// first = Start/tokensPerBlock (equal to FirstBlock for a valid chunk) and
// end = ⌈End/tokensPerBlock⌉, so a last chunk ending mid-block covers that
// block. tokensPerBlock < 1 or an empty chunk yields an empty range.
func (c Chunk) Blocks(tokensPerBlock int) (first, end int) {
	if tokensPerBlock < 1 || c.End <= c.Start || c.Start < 0 {
		return 0, 0
	}
	return c.Start / tokensPerBlock, (c.End + tokensPerBlock - 1) / tokensPerBlock
}

// Runs is the chunk's blocks as one run per group over a request's block
// ids: ids[g] lists group g's blocks from block 0. A group with no blocks
// (ids[g] empty) gets an empty run. A group whose ids end before the
// chunk's blocks do gets the run its ids reach (short, or empty), which a
// TxHandle.Chunk refuses naming the group and the blocks missing
// (ErrMissingSource): a framework's block table shorter than its prompt
// is the caller's mistake to name, not a panic.
func (c Chunk) Runs(tokensPerBlock int, ids [][]BlockID) []BlockRun {
	b0, b1 := c.Blocks(tokensPerBlock)
	runs := make([]BlockRun, len(ids))
	for g, gi := range ids {
		if len(gi) > 0 {
			runs[g] = BlockRun{First: b0, IDs: gi[min(b0, len(gi)):min(b1, len(gi))]}
		}
	}
	return runs
}

// Clip is the part of run that chunk c reads: the run's blocks among the
// chunk's global blocks [first, end) (Blocks), as a run of its own whose
// IDs are a sub-slice of run.IDs. A caller may name more blocks than the
// chunk's — a request's whole block table, a run that starts before block
// 0 — and only the clipped part is the chunk's to check and pin: a block
// outside it may be another chunk's, or another request's. A run that
// misses the chunk's blocks clips to an empty run at the chunk's first
// block.
func (c Chunk) Clip(tokensPerBlock int, run BlockRun) BlockRun {
	b0, b1 := c.Blocks(tokensPerBlock)
	lo, hi := max(b0, run.First), min(b1, run.End())
	if lo >= hi {
		return BlockRun{First: b0}
	}
	return BlockRun{First: lo, IDs: run.IDs[lo-run.First : hi-run.First : hi-run.First]}
}

// String formats the chunk as "chunk [Start, End) block FirstBlock", with
// " last" appended for the last chunk and " layers [Lo, Hi) of Of" for a
// part of one.
func (c Chunk) String() string {
	s := fmt.Sprintf("chunk [%d, %d) block %d", c.Start, c.End, c.FirstBlock)
	if c.Last {
		s += " last"
	}
	if !c.Layers.Whole() {
		s += fmt.Sprintf(" layers [%d, %d) of %d", c.Layers.Lo, c.Layers.Hi, c.Layers.Of)
	}
	return s
}
