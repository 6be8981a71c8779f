package shm

import (
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// registration is a region registered with one agent: a shared file made by
// NewRegion (writable by peers), or private host memory (a source only).
type registration struct {
	agent  *Agent
	id     uint64
	region *kvcache.Region
	bytes  []byte
	file   *sharedFile   // nil for private memory
	lease  *copier.Lease // the file header's lease, or own
	own    copier.Lease
	remote rdma.RemoteRegion
	// dead is set once the registration is revoked, before its file may
	// be unmapped: a stale registration never touches lease again. It is
	// set with mu held for writing (revoke), and a Post checks it and
	// acquires lease with mu held for reading (acquire), so that no
	// revocation, and no unmapping after it, comes between the two.
	dead atomic.Bool
	mu   sync.RWMutex
}

var _ rdma.Registration = (*registration)(nil)

func (r *registration) Region() *kvcache.Region { return r.region }

func (r *registration) Remote() rdma.RemoteRegion {
	return rdma.RemoteRegion{Key: append([]byte(nil), r.remote.Key...), Len: r.remote.Len}
}

// acquire takes the lease for a batch that reads r, unless r was revoked
// (ok false): the check and the acquire are one step for revoke, which
// may be followed at once by the unmapping of the lease's file.
func (r *registration) acquire() (st copier.LeaseState, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.dead.Load() {
		return 0, false
	}
	return r.lease.Acquire(), true
}

// revoke marks r dead: once it returns, no Post touches r's lease again.
func (r *registration) revoke() {
	r.mu.Lock()
	r.dead.Store(true)
	r.mu.Unlock()
}
