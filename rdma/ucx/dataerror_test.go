//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// TestDataEndpointErrorCutsBatchesUnproven: when UCX reports a data
// endpoint failed (its error callback; here an injected
// UCS_ERR_ENDPOINT_TIMEOUT, as a keepalive gives of a peer stopped or
// paused long enough) with a batch on the wire, that report proves
// nothing of what already reached the peer: over tcp its own worker
// applies what sits in its socket buffers once it runs again. The batch
// must fail with rdma.ErrCloseUnproven beside rdma.ErrPeerGone, and the
// endpoint's Close return ErrCloseUnproven, whichever of UCX's reports
// comes first: the data endpoint's error, the failed flush (UCX fails an
// endpoint's operations before it calls its error callback), or the
// link's control endpoint's error. Only a proof of the peer's exit
// (Agent.PeerExited) taken first leaves the batch proven over
// (ErrPeerGone alone, Close nil); an endpoint with nothing on the wire
// closes with nil. Before the fix the data endpoint's own error, or its
// failed flush, failed the batch with ErrPeerGone alone (over, so the
// engine told the receiver the write was over and it freed the pages)
// and Close returned nil, while the link's error first cut it unproven.
func TestDataEndpointErrorCutsBatchesUnproven(t *testing.T) {
	// tcp: a put's flush needs the receiver's worker, which the test stops.
	t.Setenv("UCX_TLS", "tcp")
	const (
		data  = "data" // the data endpoint's error callback
		ctrl  = "ctrl" // the link's control endpoint's error callback
		flush = "flush"
		exit  = "exit" // Agent.PeerExited's proof
	)
	cases := []struct {
		name   string
		events []string
		idle   bool // no batch on the wire
		proven bool
	}{
		{name: "data endpoint error", events: []string{data}},
		{name: "flush failed, then the data endpoint error", events: []string{flush, data}},
		{name: "data endpoint error, then the link's", events: []string{data, ctrl}},
		{name: "link's error, then the data endpoint's, then its flush", events: []string{ctrl, data, flush}},
		{name: "peer's exit proven, then the data endpoint error", events: []string{exit, data}, proven: true},
		{name: "peer's exit proven, then the flush failed", events: []string{exit, flush, data}, proven: true},
		{name: "data endpoint error with nothing on the wire", events: []string{data}, idle: true, proven: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(WithIdentity("gen/0"), WithCloseTimeout(time.Minute))
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
			defer dst.Close()
			defer src.Close()
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
			errs := make(chan error, 2)
			post := func(off uint64) {
				t.Helper()
				if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(),
					Segments: []kvcache.Segment{{Src: off, Dst: off, Len: 4096}},
					Done:     func(err error) { errs <- err }}); err != nil {
					t.Fatal(err)
				}
			}
			// One batch through first, so that UCX has wired the endpoint
			// up both ways before the receiver stops (UCX 1.13 aborts on a
			// wireup reply still pending when its connection fails).
			post(0)
			if err := <-errs; err != nil {
				t.Fatal(err)
			}

			// Stop the receiver's worker: the sender's flush stays in
			// flight.
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

			if !tc.idle {
				post(8192)
				deadline := time.Now().Add(30 * time.Second)
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
			}

			// UCX's reports, in the case's order, in one turn of the
			// sender's progress goroutine (as one poll hands them on).
			s.w.do(func() {
				u, l := ep.u, s.w.links[r.id]
				for _, ev := range tc.events {
					switch ev {
					case data:
						s.w.onError(u.id, ucsEndpointTimeout)
					case ctrl:
						s.w.onError(l.u.id, ucsEndpointTimeout)
					case flush:
						for _, op := range u.pend {
							if !op.settled {
								s.w.onFlush(op.id, ucsEndpointTimeout)
								break
							}
						}
					case exit:
						c := &call{addr: address{id: r.id}, ident: "gen/0", how: "the test says so", done: make(chan struct{})}
						s.w.peerExited(c)
						if c.err != nil {
							t.Errorf("peerExited: %v", c.err)
						}
					}
				}
			})

			if !tc.idle {
				err := <-errs
				switch {
				case !errors.Is(err, rdma.ErrPeerGone):
					t.Errorf("batch on the wire: Done(%v), want ErrPeerGone", err)
				case tc.proven && errors.Is(err, rdma.ErrCloseUnproven):
					t.Errorf("batch on the wire, the peer's exit proven first: Done(%v), want no ErrCloseUnproven", err)
				case !tc.proven && !errors.Is(err, rdma.ErrCloseUnproven):
					t.Errorf("batch on the wire: Done(%v), want ErrCloseUnproven beside ErrPeerGone", err)
				case errors.Is(err, rdma.ErrSourcesReleased):
					t.Errorf("batch on the wire: Done(%v), want no ErrSourcesReleased (only Close says it)", err)
				}
			}
			err = ep.Close()
			switch {
			case tc.proven && err != nil:
				t.Errorf("Close: %v, want nil", err)
			case !tc.proven && !errors.Is(err, rdma.ErrCloseUnproven):
				t.Errorf("Close of the endpoint whose batch the error cut: %v, want ErrCloseUnproven", err)
			case !tc.proven && !errors.Is(err, rdma.ErrSourcesReleased):
				// Its forced close has completed when Close returns: UCX
				// reads none of the cut batch's source any more.
				t.Errorf("Close of the endpoint whose batch the error cut: %v, want ErrSourcesReleased beside ErrCloseUnproven", err)
			}
			if again := ep.Close(); !errors.Is(again, rdma.ErrCloseUnproven) != tc.proven || !errors.Is(again, rdma.ErrSourcesReleased) != tc.proven {
				t.Errorf("second Close: %v, want what the first said (%v)", again, err)
			}
		})
	}
}

// TestCutBatchKeepsItsSourceBusyUntilTheForcedClose: a batch cut on the
// wire (rdma.ErrCloseUnproven) may have its Done run before the forced
// close of its UCP endpoint completes: UCX fails the flush first, and the
// dispatcher runs the Done at once. Until that close completes UCX may
// still read the batch's source (only the completed close purges its
// requests: Close's rdma.ErrSourcesReleased), so the source registration
// must stay busy past the Done: a Deregister of it then refuses rather
// than unmap memory UCX reads. Once the close completed, it is released.
// The test holds the sender's progress goroutine after UCX's failure of
// the flush, so that the close cannot complete, and waits there for the
// Done. Before the fix the batch stopped counting against its source
// just before its Done, whatever the close.
func TestCutBatchKeepsItsSourceBusyUntilTheForcedClose(t *testing.T) {
	// tcp: a put's flush needs the receiver's worker, which the test holds.
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
	defer dst.Close()
	defer src.Close()
	dreg, err := r.Register(dst)
	if err != nil {
		t.Fatal(err)
	}
	// A source only: its Deregister asks no peer.
	sregi, err := s.RegisterSource(src)
	if err != nil {
		t.Fatal(err)
	}
	sreg := sregi.(*registration)
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
	if err := <-errs; err != nil {
		t.Fatal(err)
	}

	// Hold the receiver's worker: the sender's flush stays in flight.
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
	defer func() {
		release()
		s.Close()
		r.Close()
	}()

	post(8192)
	deadline := time.Now().Add(30 * time.Second)
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

	// In one turn of the sender's progress goroutine: UCX fails the flush
	// (its failure comes before the endpoint's error callback), which
	// cuts the batch; the dispatcher runs its Done while the forced close
	// cannot complete.
	var (
		doneErr   error
		gotDone   bool
		ucpClosed bool
		busy      int64
	)
	s.w.do(func() {
		for _, op := range ep.u.pend {
			if !op.settled {
				s.w.onFlush(op.id, ucsEndpointTimeout)
				break
			}
		}
		ep.signal()
		timer := time.NewTimer(30 * time.Second)
		defer timer.Stop()
		select {
		case doneErr = <-errs:
			gotDone = true
		case <-timer.C:
			return
		}
		ep.mu.Lock()
		ucpClosed = ep.ucpClosed
		ep.mu.Unlock()
		busy = sreg.busy.Load() // what Deregister checks (tryRevoke)
	})
	if !gotDone {
		t.Fatal("no Done of the cut batch within 30s")
	}
	if !errors.Is(doneErr, rdma.ErrCloseUnproven) {
		t.Fatalf("batch cut on the wire: Done(%v), want ErrCloseUnproven", doneErr)
	}
	if ucpClosed {
		t.Fatal("the UCP endpoint closed before the test let it: the test does not hold the close")
	}
	if busy != 1 {
		t.Errorf("source registration after the cut batch's Done, its endpoint's forced close not completed: %d batches counted, want 1 (UCX may still read it: a Deregister must refuse)", busy)
	}

	release()
	if err := ep.Close(); !errors.Is(err, rdma.ErrCloseUnproven) || !errors.Is(err, rdma.ErrSourcesReleased) {
		t.Errorf("Close of the endpoint whose batch was cut: %v, want ErrCloseUnproven and ErrSourcesReleased", err)
	}
	// The forced close has completed: UCX reads the source no more.
	if err := s.Deregister(sreg); err != nil {
		t.Errorf("Deregister of the source after the endpoint's forced close completed: %v, want nil", err)
	}
}
