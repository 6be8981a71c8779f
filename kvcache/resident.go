package kvcache

// ResidentRange returns the global block indices [first, end) of a request
// of promptLen tokens that a receiver must hold for one layer group:
//
//   - full attention (window == 0): every block, [0, ⌈promptLen/tpb⌉);
//   - sliding window: only the blocks covering the last window tokens,
//     [max(0, promptLen-window), promptLen), rounded out to whole blocks.
//
// end is always ⌈promptLen/tpb⌉. The inputs are assumed validated (Layout
// and Chunk Validate); defensively, promptLen ≤ 0 or tokensPerBlock < 1
// yields the empty range (0, 0), and a negative window is treated as full
// attention, which holds more blocks, never fewer.
func ResidentRange(promptLen, window, tokensPerBlock int) (first, end int) {
	if promptLen <= 0 || tokensPerBlock < 1 {
		return 0, 0
	}
	end = (promptLen + tokensPerBlock - 1) / tokensPerBlock
	if window <= 0 || window >= promptLen {
		return 0, end
	}
	return (promptLen - window) / tokensPerBlock, end
}

// NeededRange is the part of ResidentRange that must still be transferred
// when the receiver already holds the first prefixHitBlocks blocks through
// prefix reuse: first = max(residentFirst, prefixHitBlocks), capped at end.
// The range may be empty (first == end). A negative prefixHitBlocks counts as
// 0.
func NeededRange(promptLen, window, tokensPerBlock, prefixHitBlocks int) (first, end int) {
	first, end = ResidentRange(promptLen, window, tokensPerBlock)
	first = max(first, prefixHitBlocks)
	return min(first, end), end
}
