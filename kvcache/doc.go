// Package kvcache is kvxfer's pure data layer: model layouts and layer
// groups, the block pool with pins and quarantine, prefix reuse, chunk
// slices, the order in which a request hands them and their layer parts
// (ChunkOrder), their projection onto resident blocks,
// tensor/pipeline-parallel peer maps, and transfer plans (coalesced
// segments).
//
// # Contract
//
//   - No I/O, no goroutines, no clocks, no randomness. Every function is
//     deterministic in its arguments. Nothing here imports another package of
//     the project.
//   - Types are not safe for concurrent use unless stated: a Pool belongs to one
//     actor (the engine's session owner), which serialises access through its
//     mailbox.
//   - Errors are package sentinels (ErrBadLayout, ErrMisalignedChunk, …)
//     wrapped with the offending field and value; match them with errors.Is.
//
// # Byte order inside a block
//
// A block of layer group g on one rank holds TokensPerBlock tokens of every
// layer of g that the rank owns. Its bytes are ordered, outermost first:
//
//	layer (the rank's layers of g, ascending) ,
//	part  (K then V; MLA layouts have a single latent part),
//	head  (the rank's KV heads, ascending),
//	token (0..TokensPerBlock-1),
//	dim   (0..HeadDim-1, DTypeBytes each).
//
// So a head range is contiguous within each (layer, part), a whole block is
// contiguous, and a run of consecutive block ids is contiguous in the pool.
// A plan therefore emits one segment per maximal run of blocks that are
// consecutive on both sides when a peer takes whole blocks, and one segment
// per (block, layer, part) when it takes a head sub-range.
//
// That is the byte order of kvcache's pools (MemGroupPool), one layout among
// several.
//
// # Memory as the framework lays it out
//
// A serving framework keeps its KV cache in its own tensors; a KVMemory
// describes one rank's memory of one layer group without assuming a byte
// order: the region offset of each (layer, part) tensor's block 0 and the
// byte strides of block, token, head and element. Constructors give the
// common kinds — vLLM's per-layer [2, blocks, block_size, heads, head_dim]
// (NHDMemory) and its HND variant (HNDMemory), K and V in separate tensors
// (SplitKVMemory), MLA latent caches (MLAMemory) and the pools above
// (PoolMemory) — and any other layout is its strides (MemStrided).
// KVMemory.Validate refuses strides that make elements overlap, a tensor
// past its region and two tensors sharing a byte (ErrBadMemory);
// KVMemory.TensorBlock locates one block of one (layer, part) tensor.
//
// NewMemoryPlan plans a link between two memories, which may differ in kind
// and in the heads each holds (the PeerMap's tensor-parallel slicing): it
// copies every head vector the link carries and merges what is contiguous
// on both sides, so that NHD→NHD and HND→HND copy whole runs of blocks per
// tensor, a TP gather copies what both sides keep together (per token in
// NHD, per head range in HND), and NHD→HND copies one head vector per
// segment. Over two PoolMemory descriptors it emits exactly NewPlan's
// segments.
package kvcache
