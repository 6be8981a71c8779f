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
