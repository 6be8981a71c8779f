// Package copier is the memory-copy engine shared by the backends whose
// remote memory is addressable from this process (rdma/loopback, rdma/shm):
// a per-endpoint queue drained by one goroutine that copies each batch's
// segments, completes it exactly once and honours Close, plus the Lease word
// that counts a registration's batches in flight and CheckSegments.
//
// A Copier hands a batch over once (one lock, one wake-up signal); it does
// not allocate per segment. Large segments are copied in chunks of
// ChunkBytes so that Close stops a copy within one chunk.
package copier
