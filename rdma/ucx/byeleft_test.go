//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

// TestLinkFailureAfterByeCutsBatchesUnproven: a peer's bye proves that
// the peer's writes into this agent are over, nothing of this agent's
// writes into the peer. A writer that took the receiver's bye closes its
// endpoints to it once their flushes complete; when the link's control
// endpoint then fails (UCX's report, injected while the receiver's
// worker is held), the forced close cuts the batch whose flush is still
// in flight, which over tcp may still be applied by the receiver's
// worker. Its Done must say rdma.ErrCloseUnproven and the endpoint's
// Close must return it, as when the same failure comes before the bye
// (TestBatchesCutByAnEndpointErrorAreUnproven) or as the close timeout
// would. Before the fix failLink took the bye, which cleared the link's
// unproven mark, as proof for the writer's own batches: Done said
// ErrPeerGone alone and Close returned nil.
func TestLinkFailureAfterByeCutsBatchesUnproven(t *testing.T) {
	// tcp: a put's flush needs the receiver's worker, which the test holds.
	t.Setenv("UCX_TLS", "tcp")
	r, err := New(WithRevokeTimeout(200*time.Millisecond), WithCloseTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := New(WithRevokeTimeout(200*time.Millisecond), WithCloseTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dst, _, err := r.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	dreg, err := r.Register(dst)
	if err != nil {
		t.Fatal(err)
	}
	src, err := kvcache.NewHostRegion(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	sreg, err := s.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	epi, err := s.Connect(r.Address())
	if err != nil {
		t.Fatal(err)
	}
	ep := epi.(*endpoint)
	errs := make(chan error, 2)
	post := func(off uint64) {
		t.Helper()
		if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(),
			Segments: []kvcache.Segment{{Src: off, Dst: off, Len: 4096}},
			Done:     func(err error) { errs <- err }}); err != nil {
			t.Fatal(err)
		}
	}
	// One batch through first, so that UCX has wired the endpoint up both
	// ways before the receiver is held.
	post(0)
	if err := rdmatest.Recv(t, errs, "Done of the first batch"); err != nil {
		t.Fatal(err)
	}

	// Hold the receiver's worker: the writer's flush stays in flight.
	rIn, rGo, rDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(rDone)
		r.w.do(func() { close(rIn); <-rGo })
	}()
	<-rIn
	released := false
	release := func() {
		if !released {
			released = true
			close(rGo)
			<-rDone
		}
	}
	defer release()
	post(8192)
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for {
		pending := false
		s.w.do(func() { pending = len(ep.u.pend) > 0 })
		if pending && OnTheWire(ep) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch never went on the wire")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}

	// The receiver's bye (sent as it began to close, before it stalled)
	// reaches the writer, sealed under the link's key as onMessage wants
	// it; then UCX reports the link's control endpoint failed.
	s.w.do(func() {
		l := s.w.links[r.id]
		s.w.onMessage(seal(&l.key, (&message{kind: msgBye, req: 1, from: r.id}).encode()))
		if st := l.getState(); st != linkLeft {
			t.Errorf("link after the receiver's bye: %v, want %v", st, linkLeft)
		}
	})
	select {
	case err := <-errs:
		t.Fatalf("batch completed (%v) with its flush held: the bye closes its endpoint once the flush completes", err)
	default:
	}
	if !FailControlEndpoint(s, r.Address()) {
		t.Fatal("the writer has no control endpoint to the receiver")
	}
	err = rdmatest.Recv(t, errs, "Done of the batch cut by the link's failure")
	if !errors.Is(err, rdma.ErrCloseUnproven) {
		t.Errorf("batch on the wire cut by the link's failure after the peer's bye: Done(%v), want ErrCloseUnproven", err)
	}
	if err := ep.Close(); !errors.Is(err, rdma.ErrCloseUnproven) {
		t.Errorf("Close of the endpoint whose batch the link's failure cut after the peer's bye: %v, want ErrCloseUnproven", err)
	}
	release()
}
