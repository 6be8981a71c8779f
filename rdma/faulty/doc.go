// Package faulty wraps any rdma.Agent and injects faults into its
// endpoints' batches, deterministically under a seed (math/rand/v2 PCG), in
// the manner of pebble's vfs/errorfs.
//
// # Faults
//
// Faults are functional options, each a kind of fault and a Match that picks
// the batches it hits by their sequence number on their endpoint (the n-th
// call to Post, from 0) or at random (Rate). For each Post the rules are
// tried in option order and the first that matches applies:
//
//   - Fail: the batch never reaches the wrapped endpoint; Done gets a
//     *rdma.SegmentError naming segment 0 and wrapping rdma.ErrInjected.
//   - Partial(m, k): only the first k segments are posted; Done then gets a
//     *rdma.SegmentError naming segment k and wrapping rdma.ErrInjected.
//   - Hang: the batch is posted (its writes may land) but its Done is
//     withheld until the endpoint closes, then gets rdma.ErrEndpointClosed
//     (beside the wrapped endpoint's error, if it failed the batch: an
//     rdma.ErrCloseUnproven there stays said): the in-doubt case. A Flush
//     behind it never completes before Close.
//   - Delay(m, d): Done is called d after the batch completed, on the Clock
//     (WithClock; ManualClock lets a test move time).
//   - Slow(m, g): Done waits until the test opens Gate g.
//   - PeerGone: this and every later Post fail with rdma.ErrPeerGone; a
//     Flush then reports rdma.ErrPeerGone.
//   - Cut: the batch is posted, then fails with rdma.ErrPeerGone and
//     rdma.ErrCloseUnproven, as UCX's endpoint error fails a batch on the
//     wire; later posts and flushes fail with rdma.ErrPeerGone, and Close
//     returns rdma.ErrCloseUnproven.
//
// WithUnprovenClose makes a Close that cuts held batches (Hang, Slow)
// return rdma.ErrCloseUnproven, and WithSourcesReleased makes such a
// Close (or a Cut endpoint's) wrap rdma.ErrSourcesReleased beside it.
//
// # Order and goroutines
//
// Every endpoint delivers completions in post order on its own goroutine, so
// a held batch holds back the batches behind it and the Flushes behind them,
// as on a reliable connection. Each endpoint draws from its own PCG stream
// (seed, endpoint number), so a run is reproducible when each endpoint's
// posts are.
//
// # Busy regions
//
// A batch counts as in flight from Post until its Done is delivered, however
// long a fault holds it. Deregister on any faulty agent of the process
// refuses (rdma.ErrRegionBusy) a registration that such a batch reads
// (source) or writes (its key as destination), then defers to the wrapped
// agent. Registrations must be comparable values (pointers), as every
// backend's are.
package faulty
