// Package copier is the memory-copy engine shared by the backends whose
// remote memory is addressable from this process (rdma/loopback, rdma/shm):
// a per-endpoint queue drained by one goroutine that copies each batch's
// segments, completes it exactly once and honours Close, plus the Lease word
// that counts a registration's batches in flight and CheckSegments.
//
// A Copier hands a batch over once (one lock, one wake-up signal); it does
// not allocate per segment. Large segments are copied in chunks of
// ChunkBytes so that Close stops a copy within one chunk.
//
// # Memory faults
//
// Memory that a peer owns can vanish under a mapping of it (the peer
// truncates its region file): a copy into it then faults, and by default
// the Go runtime kills the whole process. A job whose destination lies in a
// PeerMemory is run under a fault guard instead: the copier's goroutine
// runs with runtime/debug.SetPanicOnFault(true), and the job's copies and
// lease releases recover a memory fault (only that: every other panic is
// re-raised). The job then fails with an error naming the side and the
// address: wrapping rdma.ErrPeerGone for a fault inside the PeerMemory,
// which is marked gone so that later jobs into it fail without copying,
// and kvcache.ErrBadRegion for a fault elsewhere (the source). The process
// and the copier go on. Jobs without a PeerMemory (both regions this
// process's own) are not guarded: a fault there is a bug of ours and still
// ends the process. CatchFault guards one call on another goroutine (a
// backend's Post reading the peer's header page).
package copier
