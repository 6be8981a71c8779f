// Package cudaipc is the rdma backend for GPU-to-GPU writes between
// processes of one node: the receiver registers device memory (a
// kvcache.Region of kind DeviceMem, e.g. from cuda.Device.NewRegion, or
// spanning a framework's tensors in several allocations) and hands out the
// CUDA IPC handles of the allocations that hold it through the region key;
// the sender maps each allocation into its own process once
// (cuIpcOpenMemHandle) and copies into it with cuMemcpyDtoDAsync on its
// endpoint's stream — over NVLink or
// PCIe, by the GPUs' copy engines, with no CPU copy and no help from the
// receiver. Host memory is refused: use rdma/shm for it.
//
// New returns an error wrapping cuda.ErrNoDevice on a machine without a
// GPU or CUDA driver; nothing else of the package is usable there.
//
// # Keys and addresses
//
// An agent's Address is "cudaipc2:<pid>:<nonce>". At New the agent states
// itself in an agent file, Dir()/kvxfer-cudaipc-agent-<pid>-<nonce> (mode
// 0600, created exclusively, removed at Close): "KVXCIPA1", its pid and
// nonce, its process's start time and host (boot id and pid namespace,
// as internal/pidwatch names them), and whom it serves (WithIdentity, at
// most MaxIdentity bytes; a node gives its rank). Connect reads the
// agent file of the address before anything else and refuses, naming the
// file, one that is missing, of another user than this process's, or
// names another pid or nonce (rdma.ErrBadAddress for a file that does not
// describe the address or is not this user's; rdma.ErrPeerGone when the
// agent cannot be found here: no process, no file, another host or pid
// namespace, another start time — the pid was reused). The endpoint then
// reports the identity the file states (rdma.IdentifiedEndpoint), so that
// a writer can refuse an agent address a peer named that reaches another
// peer's agent (actors' worker does, before Post). An endpoint to an agent
// of this process takes the identity from that agent itself. Addresses of
// version 1 ("cudaipc:", agents without a file) are refused by their
// version; a writer of version 1 refuses "cudaipc2:" by its scheme. The
// agent file is the agent's statement, readable and writable by its user
// only: it ties an address to an identity for a writer of that user, it
// is no capability (see docs/threat-model.md).
//
// A region's bytes may lie in several cuMemAlloc allocations, with
// unmapped gaps between them (a framework's per-layer KV tensors, each its
// own allocation): Agent.RegisterSpans takes the region with the spans of
// it that are in use, asks the driver (cuMemGetAddressRange) for the
// allocation of each, and registers one entry per allocation (deduplicated;
// at most MaxAllocations): the allocation's IPC handle, the region bytes it
// holds [off, off+len) — from its first span byte to its last — and where
// they start in the allocation. A span that runs out of its allocation, or
// lies in none, is refused (a *SpanError naming the span and the
// addresses); Agent.Allocations makes the same check without registering.
// Register(r) is RegisterSpans(r, the whole region): one allocation. The
// rdma.Agent interface is unchanged.
//
// A registration's RemoteRegion.Key ("CIK2", 100 bytes) carries the
// owner's nonce and pid, the id of its control file, a 128-bit secret, the
// region's length, the number of allocations and the SHA-256 digest of
// their table. The table itself (88 bytes per allocation: handle, offset in
// the allocation, region offset, length) lives in the control file
// (Dir()/kvxfer-cudaipc-<pid>-<id>, mode 0600), behind a one-page header
// that holds the same descriptor, the owner, the current secret and a
// copier.Lease (batches in flight, retired, owner gone) that every process
// updates atomically: 4096 IPC handles would not fit a Hello. A key of
// version 1 ("CIK1", one allocation) is refused by its version; a sender of
// version 1 refuses a version 2 key by its length.
//
// The key and the control file are both the receiver's to write, so the
// sender trusts neither: it refuses, with rdma.ErrBadKey and before any
// copy, a key that claims no or more than MaxAllocations allocations, a
// control file of another size or descriptor, a table that is not the
// key's (digest), entries that are empty, overlap, come out of order,
// pass the end of the region, or name one allocation twice, a handle that
// does not open, and an entry that passes the end of its allocation as
// the driver sizes it once opened. It reads the table into its own memory
// once, when it first maps the region; each allocation is mapped once per
// process and device (shared by every endpoint and registration that uses
// it) and closed by the last endpoint that used it.
//
// Post refuses, with rdma.ErrBadKey, a key whose owner is not the
// endpoint's peer, whose control file is missing or describes another
// region, or whose secret is not the registration's (revoked); with
// rdma.ErrPeerGone one whose owner agent closed — all checked before any
// allocation of the key's table is mapped, so that a refused key holds
// nothing (no mapping, no slot of MaxPeerRegistrations); and, with a
// *rdma.SegmentError wrapping rdma.ErrOutOfRange before anything is
// enqueued, a segment whose destination (or source) does not lie inside
// one allocation's entry: one that falls into a gap or straddles two
// allocations (they are mapped apart in the writer). A process cannot open
// its own IPC handles, so an endpoint to an agent of the same process uses
// the allocations' addresses directly.
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
// batch (events of one stream complete in order). A Flush right behind a
// batch that ended unproven (below) completes with that batch's
// rdma.ErrCloseUnproven, not nil. A driver error while
// enqueueing refuses the batch when nothing was enqueued, else completes it
// with a *rdma.SegmentError naming the first segment not enqueued. An end
// that proves nothing about the copies already enqueued — the event
// reporting an error instead of completing, or a stream synchronisation
// that fails (a failed record, Close) — completes the batch with
// rdma.ErrCloseUnproven (beside any segment's error) and keeps both
// leases: the regions stay busy for as long as a copy may still run, until
// a Close of the endpoint whose stream synchronisation succeeds proves
// every copy over and releases them.
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
// control file removed) and releases the device. A batch that an endpoint
// of another agent (of this process or another) accepted into one of its
// registrations before still runs on that endpoint's stream, which the
// agent cannot stop: while the registration's lease counts any batch in
// flight, Agent.Close returns rdma.ErrCloseUnproven naming it (the memory
// must stay allocated), and called again, nil once they have completed.
// The rules of package rdma hold as written there; Deregister refuses with
// rdma.ErrRegionBusy while a batch of any process reads or writes the
// region.
//
// A Close whose synchronisation fails returns rdma.ErrCloseUnproven and
// never rdma.ErrSourcesReleased: a copy still enqueued on the stream may
// still read its source as well as write its destination, so the source
// pages of the cut batches stay pinned with their ops in doubt.
//
// A receiver process that dies leaves its control files and its agent file
// behind (as rdma/shm leaves region files); senders' later Connects and
// Posts to it fail with rdma.ErrPeerGone (Connect checks the agent file's
// process start time and opens a pidfd of that process; Post refuses once
// it has exited, even as a zombie or with its pid reused).
package cudaipc
