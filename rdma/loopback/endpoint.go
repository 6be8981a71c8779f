package loopback

import (
	"crypto/subtle"
	"fmt"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// endpoint is a connection from one agent to a peer agent of its network.
type endpoint struct {
	agent *Agent
	peer  *Agent
	name  string
	cp    *copier.Copier
}

var _ rdma.Endpoint = (*endpoint)(nil)

// Post checks the batch (source registration, key, ranges), takes a lease on
// both regions and queues the batch for the endpoint's copier.
func (e *endpoint) Post(b rdma.Batch) error {
	if e.cp.Closed() {
		return fmt.Errorf("%s: post: %w", e.name, rdma.ErrEndpointClosed)
	}
	if e.peer.closed.Load() {
		return fmt.Errorf("%s: post: %w: agent %s closed", e.name, rdma.ErrPeerGone, e.peer)
	}
	src, ok := b.Src.(*registration)
	if !ok || src == nil || src.agent != e.agent {
		return fmt.Errorf("%s: post: source %T: %w: not a registration of agent %s", e.name, b.Src, rdma.ErrUnregistered, e.agent)
	}
	dst, err := e.resolve(b.Dst)
	if err != nil {
		return err
	}
	if err := copier.CheckSegments(b.Segments, src.region.Len, dst.region.Len); err != nil {
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	switch st := src.lease.Acquire(); st {
	case copier.Live:
	default:
		return fmt.Errorf("%s: post: source registration %d: %w (%s)", e.name, src.id, rdma.ErrUnregistered, st)
	}
	switch st := dst.lease.Acquire(); st {
	case copier.Live:
	case copier.Gone:
		src.lease.Release()
		return fmt.Errorf("%s: post: destination registration %d: %w", e.name, dst.id, rdma.ErrPeerGone)
	default:
		src.lease.Release()
		return fmt.Errorf("%s: post: destination registration %d: %w: deregistered", e.name, dst.id, rdma.ErrBadKey)
	}
	err = e.cp.Post(copier.Job{
		Src:    src.bytes,
		Dst:    dst.bytes,
		Segs:   b.Segments,
		Done:   b.Done,
		Leases: [2]*copier.Lease{&src.lease, &dst.lease},
	})
	if err != nil {
		src.lease.Release()
		dst.lease.Release()
		return fmt.Errorf("post: %w", err)
	}
	return nil
}

// resolve finds the peer's live registration that rr names and checks its
// secret and length.
func (e *endpoint) resolve(rr rdma.RemoteRegion) (*registration, error) {
	k, err := parseKey(rr.Key)
	if err != nil {
		return nil, fmt.Errorf("%s: post: %w", e.name, err)
	}
	if k.agent != e.peer.id {
		return nil, fmt.Errorf("%s: post: %w: key of agent %d, endpoint's peer is agent %d", e.name, rdma.ErrBadKey, k.agent, e.peer.id)
	}
	dst := e.peer.lookup(k.reg)
	if dst == nil {
		return nil, fmt.Errorf("%s: post: %w: agent %d has no registration %d (deregistered?)", e.name, rdma.ErrBadKey, k.agent, k.reg)
	}
	if subtle.ConstantTimeCompare(dst.secret[:], k.secret[:]) != 1 {
		return nil, fmt.Errorf("%s: post: %w: wrong secret for registration %d", e.name, rdma.ErrBadKey, k.reg)
	}
	if rr.Len != dst.region.Len {
		return nil, fmt.Errorf("%s: post: %w: remote region length %d, registration %d is %d bytes", e.name, rdma.ErrBadKey, rr.Len, k.reg, dst.region.Len)
	}
	return dst, nil
}

// Flush calls done once every batch posted earlier has completed.
func (e *endpoint) Flush(done func(err error)) { e.cp.Flush(done) }

// Close stops the copier (waiting for it) and forgets the endpoint.
func (e *endpoint) Close() error {
	e.cp.Close()
	e.agent.forget(e)
	return nil
}
