// Package rdmabench measures the rdma backends' raw Post throughput beside
// Go's copy of the same bytes, for testing.B benchmarks and for the CLI's
// `kvxfer bench raw`, which share its Rig.
//
// A Rig connects a sender and a receiver agent of one backend in this
// process (for shm, the destination is a shared-memory file, so the copy
// path is the one a separate receiver process sees; for ucx it is memory
// from the receiver's Alloc, UCX's own allocation, and UCX_* apply as
// usual), with a source and a destination region sized for one operation
// of a Shape, or for Shape.Slots of them, which the operations rotate over
// so that their bytes need not stay in a CPU cache. NewPeerRig puts the
// receiver in another process instead (shm and ucx; see PeerEnv and
// ServePeer), as a generation server is, and as ucx_perftest runs its
// server: the sending process then holds only the sender's threads. Run
// posts operations back to back with a bounded window in flight, as a
// sender worker does, and waits until all completed; Copy does the same
// operations with Go's copy between plain buffers. Measure alternates the
// two several times and reports medians, because these machines are
// noisy.
package rdmabench
