// Package cudaipc is the rdma backend for GPU-to-GPU writes between
// processes of one node: the receiver registers device memory (a
// kvcache.Region of kind DeviceMem, e.g. from cuda.Device.NewRegion) and
// hands out its CUDA IPC handle in the region key; the sender maps the
// allocation into its own process once (cuIpcOpenMemHandle) and copies
// into it with cuMemcpyDtoDAsync on its endpoint's stream — over NVLink or
// PCIe, by the GPUs' copy engines, with no CPU copy and no help from the
// receiver. Host memory is refused: use rdma/shm for it.
//
// New returns an error wrapping cuda.ErrNoDevice on a machine without a
// GPU or CUDA driver; nothing else of the package is usable there.
//
// # Keys and addresses
//
// An agent's Address is "cudaipc:<pid>:<nonce>". A registration's
// RemoteRegion.Key carries the owner's nonce and pid, the id of its control
// file, a 128-bit secret, the IPC handle of the cuMemAlloc allocation that
// holds the region, the region's offset in it and its length. The control
// file (Dir()/kvxfer-cudaipc-<pid>-<id>, one page, mode 0600) holds the
// same descriptor, the owner, the current secret and a copier.Lease (batches
// in flight, retired, owner gone) that every process updates atomically.
// Post refuses, with rdma.ErrBadKey, a key whose owner is not the
// endpoint's peer, whose control file is missing or describes another
// region, or whose secret is not the registration's (revoked); with
// rdma.ErrPeerGone one whose owner agent closed. A process cannot open its
// own IPC handles, so an endpoint to an agent of the same process uses the
// allocation's address directly.
//
// # Data path and completion
//
// Each endpoint owns a non-blocking CUDA stream on the agent's GPU
// (WithDevice) and an ordered cuda.Queue on the process's poller. Post
// checks the batch, takes the source's and the destination's leases,
// enqueues one copy per segment (one cgo call for the whole batch) and
// records an event (from a per-endpoint pool) behind them; the poller
// (cuda.Poller: one goroutine per process, cuEventQuery every 50 µs while
// anything is outstanding) completes the batch once its event has:
// releases both leases, then calls Done. Done callbacks of one endpoint
// therefore run one at a time, in post order, on the poller goroutine.
// Flush adds a marker to the same queue: it completes after every earlier
// batch (events of one stream complete in order). A driver error while
// enqueueing refuses the batch when nothing was enqueued, else completes it
// with a *rdma.SegmentError naming the first segment not enqueued; an
// error reported by the event fails the batch.
//
// # Close
//
// Endpoint.Close refuses new batches, synchronises the stream — CUDA
// cannot cancel a queued copy, so Close waits for what was posted (its
// bytes land) — then completes every batch and flush not yet reported with
// rdma.ErrEndpointClosed, closes its mappings of peers' allocations (the
// last endpoint of the process to use one calls cuIpcCloseMemHandle) and
// destroys its events and stream. Agent.Close closes every endpoint, then
// revokes every registration (lease retired, owner gone, secret cleared,
// control file removed) and releases the device. The rules of package rdma
// hold as written there; Deregister refuses with rdma.ErrRegionBusy while a
// batch of any process reads or writes the region.
//
// A receiver process that dies leaves its control files behind (as
// rdma/shm leaves region files); senders' later Connects and Posts to it
// fail with rdma.ErrPeerGone (Post checks that the peer process exists).
package cudaipc
