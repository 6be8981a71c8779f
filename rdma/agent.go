package rdma

import "github.com/kvxfer/kvxfer/kvcache"

// Agent is one process's endpoint on a data-plane backend. It registers local
// memory, says how peers reach it, and connects to peers. An Agent is safe for
// concurrent use; each Endpoint is used by one owner (a sender worker).
type Agent interface {
	// Backend is the backend's name ("loopback", "shm", "ucx", …).
	Backend() string
	// Register makes a region writable by peers holding its RemoteRegion.
	Register(r *kvcache.Region) (Registration, error)
	// Deregister revokes a registration. With posted, unfinished writes
	// into or out of the region it fails with ErrRegionBusy and changes
	// nothing.
	Deregister(reg Registration) error
	// Address is what a peer passes to Connect (sent in the control
	// plane's Hello).
	Address() []byte
	// Connect opens an endpoint to the agent at a peer address.
	Connect(peer []byte) (Endpoint, error)
	// Close closes every endpoint and registration. Idempotent.
	Close() error
}

// Registration is a registered local region.
type Registration interface {
	// Region is the registered memory.
	Region() *kvcache.Region
	// Remote is what a peer needs to write into this region.
	Remote() RemoteRegion
}

// RemoteRegion names a peer's registered region: an opaque key (which may
// embed a secret the backend checks) and the region's length.
type RemoteRegion struct {
	Key []byte
	Len uint64
}

// Batch is one op's writes: every segment copies from Src (local) to Dst
// (remote). Segment offsets are relative to each region's base.
type Batch struct {
	Src      Registration
	Dst      RemoteRegion
	Segments []kvcache.Segment
	// Done receives the batch's outcome exactly once, on a backend
	// goroutine, unless Post returned an error (then it is never called).
	// nil means success; a failure is a *SegmentError or wraps a sentinel.
	// Whatever the outcome, when Done runs no byte of the batch can land
	// any more (it landed, or never will): the engine takes it as the op's
	// proof of quiescence (DESIGN.md §3). The one exception is a failure
	// wrapping ErrCloseUnproven, which says the opposite. A backend whose
	// local completion comes before that (an RDMA put's source freed)
	// calls Done only after a flush or a close proves it. Done must not
	// block.
	Done func(err error)
}

// IdentifiedEndpoint is an Endpoint that knows whom the agent it reaches
// serves: the identity that agent was given (a node gives its agent its
// own rank, "instance/rank"), told over a channel the backend
// authenticates. PeerIdentity is "" when that agent was given none. A
// writer checks it against the peer whose Hello named the agent's address
// (a peer may name another's), and refuses a mismatch before it posts.
type IdentifiedEndpoint interface {
	Endpoint
	PeerIdentity() string
}

// Endpoint is a connection to one peer agent. Its methods are called by one
// goroutine at a time (its owner); completions arrive on backend goroutines.
type Endpoint interface {
	// Post submits a batch and returns at once. A batch refused before it
	// reaches the wire (out of range, bad key, endpoint closed, peer gone)
	// returns the error and Done is not called; otherwise Done is called
	// exactly once.
	Post(b Batch) error
	// Flush calls done once every batch posted earlier on this endpoint has
	// landed or failed. done gets nil, or the error that made the endpoint
	// unusable.
	Flush(done func(err error))
	// Close tears the endpoint down; every batch not yet completed
	// completes with ErrEndpointClosed. When it returns nil, no write
	// posted on this endpoint can land anywhere any more. When it could
	// not prove that (writes cut on the wire, which a peer may still
	// apply), it returns an error wrapping ErrCloseUnproven, and those
	// writes stay in doubt. When, besides, the backend reads none of
	// their sources any more once Close returns, the error also wraps
	// ErrSourcesReleased: the writes stay in doubt towards the peer, but
	// their source pages may go. Idempotent.
	Close() error
}

// Delivering is an optional Agent capability: its completions prove
// delivery. A batch's Done(nil) runs only once every byte of it is in the
// destination memory, where the peer reads it (a copy into memory both
// processes map, or into this process's own memory), so a sender needs no
// Flush behind a stream's last completion before telling the peer that the
// bytes are there. A backend whose completion proves only that nothing
// more lands, not where or how visibly it landed (a UCX put, completed by
// its endpoint's flush), must not claim it, nor a wrapper that can fail a
// Flush on its own (rdma/faulty).
type Delivering interface {
	CompletionsDeliver() bool
}

// CompletionsDeliver reports whether a's completions prove delivery
// (Delivering); an agent that does not say so does not.
func CompletionsDeliver(a Agent) bool {
	d, ok := a.(Delivering)
	return ok && d.CompletionsDeliver()
}

// SourceRegisterer is an optional Agent capability: it registers a
// region that only this agent's own batches read (the memory of a rank
// that only sends). The registration's Remote has no Key: no peer is ever
// told how to write into the region, so no peer's writes into it need
// proof of being over, and the agent's Close owes none for it (a peer
// whose link failed unproven, or that never acknowledged a bye, keeps no
// source registration mapped). A Batch may not name such a Remote as its
// destination. An agent that cannot tell the difference does not implement
// it; its Register serves both.
type SourceRegisterer interface {
	RegisterSource(r *kvcache.Region) (Registration, error)
}

// RegisterSource registers r for a's own batches to read: with
// RegisterSource where a implements SourceRegisterer, else with Register
// (whose Remote then still names a key).
func RegisterSource(a Agent, r *kvcache.Region) (Registration, error) {
	if s, ok := a.(SourceRegisterer); ok {
		return s.RegisterSource(r)
	}
	return a.Register(r)
}

// ExitProofTaker is an optional Agent capability: it takes a proof,
// found outside the backend, that the process of a peer agent has
// exited (a node's pidfd on a process of this host that it saw mapping
// the memory the agent allocated). An agent that keeps memory mapped
// while a peer's writes into it are unproven (its link to the peer failed
// on a timeout or an endpoint error) implements it to release what that
// proof covers. The caller vouches that the peer's writes into the
// agent's own memory were copies made by the peer's own threads (a
// shared-memory transport), which end with its process; what else the
// proof covers is the backend's to say.
type ExitProofTaker interface {
	// PeerExited says that the process of the peer agent at addr (its
	// Address, as a peer passes it to Connect), which serves identity
	// (what IdentifiedEndpoint.PeerIdentity says of it), has exited; how
	// names the proof for errors and logs. It returns an error, and
	// releases nothing, when addr is malformed or the agent's link to it
	// serves another identity.
	PeerExited(addr []byte, identity, how string) error
}
