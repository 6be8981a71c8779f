package shm

import (
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
	// be unmapped: a stale registration never touches lease again.
	dead atomic.Bool
}

var _ rdma.Registration = (*registration)(nil)

func (r *registration) Region() *kvcache.Region { return r.region }

func (r *registration) Remote() rdma.RemoteRegion {
	return rdma.RemoteRegion{Key: append([]byte(nil), r.remote.Key...), Len: r.remote.Len}
}
