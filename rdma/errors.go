package rdma

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/kvcache"
)

// Sentinel errors of the data plane.
var (
	ErrPeerGone       = errors.New("rdma: peer gone")
	ErrRegionBusy     = errors.New("rdma: region busy")
	ErrBadKey         = errors.New("rdma: bad region key")
	ErrOutOfRange     = errors.New("rdma: segment out of range")
	ErrEndpointClosed = errors.New("rdma: endpoint closed")
	ErrAgentClosed    = errors.New("rdma: agent closed")
	ErrBadAddress     = errors.New("rdma: bad peer address")
	ErrUnregistered   = errors.New("rdma: region not registered")
	ErrInjected       = errors.New("rdma: injected fault")
	// ErrCloseUnproven: Endpoint.Close had to cut writes that were on the
	// wire without their completion (a peer alive but not progressing past
	// the backend's close timeout). They may still land in the peer's
	// memory once it progresses, so the close proves nothing about them:
	// their ops stay in doubt (DESIGN.md §3).
	ErrCloseUnproven = errors.New("rdma: endpoint closed by force with writes on the wire: they may still land")
	// ErrSourcesReleased is wrapped beside ErrCloseUnproven by a backend
	// whose Endpoint.Close can say more: the close cut writes whose
	// landing it cannot prove, but it has completed, and the backend reads
	// none of their sources any more (UCX: its forced close completed,
	// which releases every request's buffers). The cut writes may still
	// land at the peer, so their ops stay in doubt towards it (no terminal
	// frame, no proof), but their source pages may be unpinned: the one
	// rule protects pages a write still touches, and it no longer reads
	// them (DESIGN.md §3). A backend whose cut writes may still read their
	// sources (a GPU copy enqueued on a stream) must not wrap it. Only a
	// Close error means it; a batch's Done error never does.
	ErrSourcesReleased = errors.New("rdma: the backend reads none of the cut writes' sources any more")
)

// SegmentError names the segment of a batch that failed.
type SegmentError struct {
	Index   int
	Segment kvcache.Segment
	Err     error
}

func (e *SegmentError) Error() string {
	return fmt.Sprintf("segment %d {src %d, dst %d, len %d}: %v",
		e.Index, e.Segment.Src, e.Segment.Dst, e.Segment.Len, e.Err)
}

func (e *SegmentError) Unwrap() error { return e.Err }
