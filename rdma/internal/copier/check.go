package copier

import (
	"fmt"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// CheckSegments verifies that every segment lies inside a source region of
// srcLen bytes and a destination region of dstLen bytes. The first segment
// that does not is returned as a *rdma.SegmentError wrapping
// rdma.ErrOutOfRange and naming the side and the region length.
func CheckSegments(segs []kvcache.Segment, srcLen, dstLen uint64) error {
	for i, s := range segs {
		if !inside(s.Src, s.Len, srcLen) {
			return &rdma.SegmentError{Index: i, Segment: s,
				Err: fmt.Errorf("%w: source [%d, +%d) outside the %d-byte source region", rdma.ErrOutOfRange, s.Src, s.Len, srcLen)}
		}
		if !inside(s.Dst, s.Len, dstLen) {
			return &rdma.SegmentError{Index: i, Segment: s,
				Err: fmt.Errorf("%w: destination [%d, +%d) outside the %d-byte destination region", rdma.ErrOutOfRange, s.Dst, s.Len, dstLen)}
		}
	}
	return nil
}

// inside reports whether [off, off+n) lies in [0, size), without overflow.
func inside(off, n, size uint64) bool { return off <= size && n <= size-off }
