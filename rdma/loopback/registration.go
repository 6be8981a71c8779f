package loopback

import (
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// registration is a region registered with one agent.
type registration struct {
	agent  *Agent
	id     uint64
	region *kvcache.Region
	bytes  []byte
	secret [16]byte
	remote rdma.RemoteRegion
	lease  copier.Lease // batches in flight from or into the region
}

var _ rdma.Registration = (*registration)(nil)

func (r *registration) Region() *kvcache.Region { return r.region }

func (r *registration) Remote() rdma.RemoteRegion {
	return rdma.RemoteRegion{Key: append([]byte(nil), r.remote.Key...), Len: r.remote.Len}
}
