// Package loopback is the in-process rdma backend: agents of one Network
// (by default, one per process) find each other by address, and a batch's
// writes are memory copies from the source region into the peer agent's
// registered region.
//
// # Contract
//
//   - Address is "loopback:<id>:<nonce>": id is the agent's number in its
//     Network, nonce a random value that tells apart agents of different
//     networks holding the same id.
//   - RemoteRegion.Key embeds the owning agent's id, the registration's id
//     and a random 128-bit secret; a post with a key that is malformed, of
//     another agent than the endpoint's peer, of a deregistered registration
//     or with a wrong secret is refused with rdma.ErrBadKey.
//   - Each endpoint copies on its own goroutine (rdma/internal/copier): Post
//     only checks the batch and queues it; Done runs on that goroutine, in
//     post order. Close waits for the goroutine to stop.
//   - Only host memory registers (device memory has no Bytes to copy).
//   - Closing an agent closes its endpoints and revokes its registrations;
//     a peer's later posts into them fail with rdma.ErrPeerGone. Batches
//     that a peer's endpoint accepted into them before still complete:
//     its goroutine copies on into the closing agent's memory, which
//     nothing of this agent can stop. So while one of them has not
//     completed, Close returns an error wrapping rdma.ErrCloseUnproven
//     naming the registrations, and the memory must stay mapped; Close
//     called again once they have completed returns nil.
//
// The package rules of rdma (ownership, exactly-once Done, Flush, Close,
// in-doubt retirement) hold as written in rdma's package documentation.
package loopback
