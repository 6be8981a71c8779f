// Package rdma is kvxfer's data-plane seam: an Agent registers memory, says
// how peers reach it and connects to them; an Endpoint posts batches of
// one-sided writes (local source region → remote destination region) and
// reports each batch's outcome exactly once.
//
// Backends live in sub-packages: rdma/loopback (in-process), rdma/shm
// (across processes on one host, shared memory, pure Go), rdma/faulty (wraps
// any backend and injects faults). rdma/rdmatest is the conformance suite
// every backend passes; rdma/rdmabench measures them against Go's copy.
//
// # Ownership and goroutines
//
//   - An Agent is safe for concurrent use.
//   - An Endpoint has one owner goroutine (a sender worker): Post, Flush and
//     Close are called by one goroutine at a time. Agent.Close may close an
//     endpoint from another goroutine; Endpoint.Close is safe against that.
//   - Completions (Batch.Done, the Flush callback) run on backend goroutines,
//     never inside Post. They must not block, and must not call Close on the
//     endpoint that runs them or on its agent (Close waits for that very
//     goroutine). They may Post, Flush and Deregister: a batch's regions are
//     no longer busy by the time its Done runs, except a batch failed with
//     ErrCloseUnproven (its writes may still land: its regions stay busy
//     until its endpoint's close has completed, or for good).
//   - Done callbacks of one endpoint run one at a time, in post order, with a
//     Flush callback in its place among them (the in-order completion of a
//     reliable connection). A backend whose transport completes out of order
//     reorders before calling Done.
//   - A batch's Segments slice is read by the backend until its Done has been
//     called: the caller leaves it unchanged until then. Source and
//     destination memory are accessed in that window only.
//
// # Outcome: exactly once
//
// Post either refuses a batch synchronously — out of range (a *SegmentError
// naming the segment, wrapping ErrOutOfRange), bad or stale key (ErrBadKey),
// unregistered source (ErrUnregistered), endpoint closed (ErrEndpointClosed),
// peer gone (ErrPeerGone) — and then Done is never called and no byte is
// written; or it accepts the batch, and then Done is called exactly once:
// nil when every segment landed, else an error that is a *SegmentError naming
// the first segment that did not land, or wraps one of the sentinels. A
// failed batch may have written any subset of its segments.
//
// # Flush
//
// Flush(done) calls done once every batch posted earlier on the endpoint has
// completed (its Done has been called). done gets nil, or the error that made
// the endpoint unusable (ErrEndpointClosed, ErrPeerGone). Flush on a closed
// endpoint may call done(ErrEndpointClosed) before it returns.
//
// # Close
//
// Endpoint.Close stops the endpoint: when it returns, no write posted on it
// can land anywhere any more, and every batch that had not completed has
// completed — with ErrEndpointClosed (a *SegmentError naming the segment that
// was interrupted, for a batch caught part-way). Pending Flush callbacks get
// ErrEndpointClosed. Close is idempotent; every call returns only once the
// endpoint has stopped. Agent.Close closes every endpoint of the agent, then
// revokes every registration: peers' later posts into them fail (ErrPeerGone
// or ErrBadKey).
//
// # Registrations
//
// Register makes a host region writable by peers that hold its RemoteRegion;
// RemoteRegion.Key is opaque and embeds a random secret that the backend
// checks, so a peer without the key (or with the key of an earlier
// registration) is refused with ErrBadKey. Deregister refuses with
// ErrRegionBusy, changing nothing, while any accepted batch whose Done has not
// been called reads or writes the region. RegisterSource (an optional
// SourceRegisterer, called through the package's RegisterSource) registers a
// region only the agent's own batches read: its RemoteRegion has no key,
// and the agent owes no proof about peers' writes for it.
//
// # In-doubt operations
//
// An op whose batch was accepted but whose outcome is unknown to its owner
// (the owner died, a deadline passed, a Done never came) is IN_DOUBT. It is
// retired — its pages may be reused — only when the backend proves
// quiescence: a Flush callback on its endpoint, or the return of its
// endpoint's Close. Both prove that the batch's Done has been called and that
// it will write nothing more. Nothing else retires an in-doubt op. A Close
// that cannot prove that returns ErrCloseUnproven: the op stays in doubt;
// when it wraps ErrSourcesReleased too, the backend reads none of the op's
// source any more, so its source pages may go while the op stays in doubt
// towards its peer.
package rdma
