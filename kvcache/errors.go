package kvcache

import "errors"

// Sentinel errors. Each is wrapped with the offending field and value.
var (
	ErrBadLayout       = errors.New("kvcache: bad layout")
	ErrBadRegion       = errors.New("kvcache: bad region")
	ErrMisalignedChunk = errors.New("kvcache: misaligned chunk")
	ErrBadChunk        = errors.New("kvcache: bad chunk")
	// ErrChunkOrder is a chunk or layer part handed out of its request's
	// order (ChunkOrder.Check). Its errors read as the detail alone,
	// without this text: the caller wraps them in its own sentinel.
	ErrChunkOrder  = errors.New("kvcache: chunk out of order")
	ErrOutOfBlocks = errors.New("kvcache: out of blocks")
	// ErrPoolTooSmall is a request for more blocks than a pool holds in
	// all: unlike ErrOutOfBlocks (too few free now), no Free can ever
	// satisfy it, so a caller that waits for blocks must fail at once.
	ErrPoolTooSmall     = errors.New("kvcache: pool too small")
	ErrDoubleFree       = errors.New("kvcache: double free")
	ErrBlockPinned      = errors.New("kvcache: block pinned")
	ErrBlockQuarantined = errors.New("kvcache: block quarantined")
	ErrUnknownBlock     = errors.New("kvcache: unknown block")
	ErrNotPinned        = errors.New("kvcache: block not pinned")
	ErrBadParallelism   = errors.New("kvcache: bad parallelism")
	ErrMissingSource    = errors.New("kvcache: missing source block")
	ErrBadPlan          = errors.New("kvcache: bad plan input")
	// ErrBadMemory is a KVMemory descriptor that is inconsistent: strides
	// that make elements overlap, a tensor past its region, two tensors
	// sharing bytes, or a descriptor that does not match its peer's.
	ErrBadMemory = errors.New("kvcache: bad memory descriptor")
)
