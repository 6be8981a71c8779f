//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// TestBatchQueuedWhenTheLinkFailsIsNotUnproven: when a link fails without
// proof (an error on its control endpoint), the batches of its endpoints
// that are on the wire are cut by the forced close and fail with
// rdma.ErrCloseUnproven (they may still land). A batch that Post accepted
// just before, still in the progress goroutine's queue when the link
// failed, never reaches UCX: its Done must not say ErrCloseUnproven, which
// keeps its op in doubt (and its pages quarantined) for good, and keeps it
// counted against the peer's registration.
func TestBatchQueuedWhenTheLinkFailsIsNotUnproven(t *testing.T) {
	// tcp: a put's flush needs the receiver's worker, which the test stops.
	t.Setenv("UCX_TLS", "tcp")
	r, err := New(WithCloseTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(WithCloseTimeout(time.Minute), WithRevokeTimeout(100*time.Millisecond))
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	dst, _ := kvcache.NewHostRegion(1 << 16)
	src, _ := kvcache.NewHostRegion(1 << 16)
	dreg, err := r.Register(dst)
	if err != nil {
		t.Fatal(err)
	}
	sreg, err := s.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	epi, err := s.Connect(r.Address())
	if err != nil {
		t.Fatal(err)
	}
	ep := epi.(*endpoint)
	// One batch through first, so that UCX has wired the endpoint up both
	// ways before the receiver stops (UCX 1.13 aborts on a wireup reply
	// still pending when its connection fails).
	warm := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(),
		Segments: []kvcache.Segment{{Len: 64}}, Done: func(err error) { warm <- err }}); err != nil {
		t.Fatal(err)
	}
	if err := <-warm; err != nil {
		t.Fatal(err)
	}

	// Stop the receiver's worker: the sender's flushes stay in flight.
	rIn, rGo := make(chan struct{}), make(chan struct{})
	rDone := make(chan struct{})
	go func() {
		defer close(rDone)
		r.w.do(func() { close(rIn); <-rGo })
	}()
	<-rIn
	defer func() {
		close(rGo)
		<-rDone
		s.Close()
		r.Close()
	}()

	errs := make(chan error, 2)
	post := func(off uint64) {
		t.Helper()
		if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(),
			Segments: []kvcache.Segment{{Src: off, Dst: off, Len: 4096}},
			Done:     func(err error) { errs <- err }}); err != nil {
			t.Fatal(err)
		}
	}
	post(0) // on the wire
	deadline := time.Now().Add(30 * time.Second)
	for {
		pending := false
		s.w.do(func() { pending = len(ep.u.pend) > 0 })
		if pending && OnTheWire(ep) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first batch never went on the wire")
		}
		time.Sleep(time.Millisecond)
	}

	// Hold the sender's worker, post a second batch (queued, not issued),
	// then fail the link as UCX's error callback on its control endpoint
	// would, before the worker takes the queued batch.
	sIn, sGo := make(chan struct{}), make(chan struct{})
	sDone := make(chan struct{})
	go func() {
		defer close(sDone)
		s.w.do(func() {
			close(sIn)
			<-sGo
			l := s.w.links[r.id]
			s.w.onError(l.u.id, ucsEndpointTimeout)
		})
	}()
	<-sIn
	post(8192) // queued behind the held worker
	close(sGo)
	<-sDone

	first, second := <-errs, <-errs
	if !errors.Is(first, rdma.ErrCloseUnproven) {
		t.Errorf("batch on the wire when its link failed unproven: Done(%v), want ErrCloseUnproven", first)
	}
	if !errors.Is(second, rdma.ErrPeerGone) || errors.Is(second, rdma.ErrCloseUnproven) {
		t.Errorf("batch still queued, never handed to UCX, when its link failed: Done(%v), want ErrPeerGone without ErrCloseUnproven", second)
	}
}
