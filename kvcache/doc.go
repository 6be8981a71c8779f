// Package kvcache is kvxfer's pure data layer: model layouts and layer
// groups, the block pool with pins and quarantine, prefix reuse, chunk
// slices and their projection onto resident blocks, tensor/pipeline-parallel
// peer maps, and transfer plans (coalesced segments).
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
package kvcache
