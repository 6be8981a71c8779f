//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// TestCutFlushMarksAFailedBatchUnproven: a batch one of whose puts UCX
// refused part way (its error a *rdma.SegmentError) has its earlier puts
// on the wire. When the flush that covers it is then cut by a forced
// close (rdma.ErrCloseUnproven), its Done must say so too, beside the
// segment's error: those puts may still land. A batch without an error of
// its own gets the flush's error as it is.
func TestCutFlushMarksAFailedBatchUnproven(t *testing.T) {
	e := &endpoint{}
	seg := &rdma.SegmentError{Index: 2, Segment: kvcache.Segment{Len: 8},
		Err: fmt.Errorf("ucp_put_nbx: %w", rdma.ErrPeerGone)}
	failed := &entry{ep: e, err: seg}
	clean := &entry{ep: e}
	cut := fmt.Errorf("ep: %w: %w", rdma.ErrEndpointClosed, rdma.ErrCloseUnproven)
	w := &worker{round: 1}
	w.completeGroup(nil, []*entry{failed, clean}, cut)
	if !failed.done || !clean.done {
		t.Fatal("batches not completed")
	}
	var se *rdma.SegmentError
	if !errors.As(failed.err, &se) || se.Index != 2 || !errors.Is(failed.err, rdma.ErrCloseUnproven) {
		t.Errorf("batch with a refused put, its flush cut: Done(%v), want its SegmentError and ErrCloseUnproven", failed.err)
	}
	if clean.err != cut {
		t.Errorf("batch without an error, its flush cut: Done(%v), want %v", clean.err, cut)
	}

	// A failure that proves the end (the peer gone) leaves the segment's
	// error as it was.
	failed = &entry{ep: e, err: seg}
	w.completeGroup(nil, []*entry{failed}, fmt.Errorf("ep: %w", rdma.ErrPeerGone))
	if failed.err != error(seg) {
		t.Errorf("batch with a refused put, its flush failed: Done(%v), want its SegmentError alone", failed.err)
	}
}
