package kvcache

// Extent is a run of a receiver's region whose memory a writer must reach
// at another offset than its own: View is the offset the receiver's
// blocks and plans use, File the one writers address (a revoked block of
// a shared-memory region now shows spare memory, docs/membership.md §4).
type Extent struct {
	View, File, Len uint64
}

// Revoker is destination memory whose receiver can take it back from
// writers without their help (rdma/shm's RevocableRegion). A generation
// engine given one revokes the destination blocks of a request that failed
// without proof that its writers are quiescent, instead of quarantining
// them: the blocks are reusable at once, and only the memory a stale
// writer can still reach stays quarantined until the proof.
type Revoker interface {
	// Revoke takes the region range [off, off+n) back from every writer;
	// release returns its old memory once proof arrives. An error changes
	// nothing (the caller quarantines instead).
	Revoke(off, n uint64) (release func() error, err error)
	// Remap appends to dst the runs of [off, off+n) that writers must
	// address elsewhere (none while nothing there was revoked).
	Remap(dst []Extent, off, n uint64) []Extent
}
