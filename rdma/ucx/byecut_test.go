//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"golang.org/x/sys/unix"
)

// TestNoByeAfterWritesCutUnproven: an agent's bye (and its
// acknowledgement of a peer's bye) is the peer's proof that the agent's
// writes into the peer's memory are over. A writer one of whose
// endpoints to the receiver had a batch cut on the wire without proof
// (UCX's report of the endpoint failed, injected while the receiver's
// worker is held, as in TestDataEndpointErrorCutsBatchesUnproven; or the
// endpoint's close timeout passing while it is held) cannot say so:
// over tcp and UCX's software RMA the cut bytes sit in the receiver's
// socket buffers on another connection than the bye's, and its worker
// may apply them after it took the bye. So:
//
//   - the writer's Close says no bye: the receiver's Deregister of the
//     written region fails busy and its Close returns
//     rdma.ErrCloseUnproven keeping its allocation mapped; the writer's
//     own Close returns ErrCloseUnproven too (nothing proves the
//     receiver's writes into it over) unless its memory is registered
//     as a source only;
//   - the receiver's Close, whose bye the writer does not acknowledge,
//     returns ErrCloseUnproven and keeps its allocation mapped;
//   - a writer whose endpoints all closed cleanly still says bye and
//     acknowledges one, as before: Deregister and both Closes return nil.
//
// Before the fix the writer said bye and acknowledged the receiver's
// bye regardless: the receiver's Deregister unmapped the region and its
// Close returned nil and unmapped its allocation.
func TestNoByeAfterWritesCutUnproven(t *testing.T) {
	// tcp: a put's flush needs the receiver's worker, which the test holds.
	t.Setenv("UCX_TLS", "tcp")
	// No UCX keepalive. Its check of an endpoint whose peer closed its
	// end (the writer closes its end of the link once it has declined the
	// receiver's bye) is answered with EP_REMOVED, which fails the
	// receiver's control endpoint ("Connection reset by remote peer"): a
	// link failure without proof, an end as valid as the unacknowledged
	// bye but not the one the receiver-first cases name; it beat the
	// revoke timeout about once in 2,700 runs (in every run with a 50 ms
	// interval). Answering opens a new tcp connection to the checker, and
	// UCX 1.13.1 aborts the answering process (an assertion in
	// uct_tcp_ep_destroy_progress) when the checker's worker is destroyed
	// as that connection is set up: the writer, when the receiver closes
	// first. The cut cases inject UCX's report instead.
	t.Setenv("UCX_KEEPALIVE_INTERVAL", "inf")
	cases := []struct {
		name   string
		cut    string // "error": UCX reports the endpoint failed; "timeout": its close timeout passes
		source bool   // the writer's memory is registered as a source only
		first  string
	}{
		{name: "writer closes after an endpoint error's cut", cut: "error", first: "writer"},
		{name: "writer closes after a close timeout's cut", cut: "timeout", first: "writer"},
		{name: "source-only writer closes after a cut", cut: "error", source: true, first: "writer"},
		{name: "receiver closes after an endpoint error's cut", cut: "error", first: "receiver"},
		{name: "receiver closes after a close timeout's cut", cut: "timeout", first: "receiver"},
		{name: "writer closes, nothing cut", first: "writer"},
		{name: "receiver closes, nothing cut", first: "receiver"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A short revoke timeout where a bye or a revocation must go
			// unanswered (the cut cases wait it out); a long one where the
			// answer must come, so that a loaded machine's slow answer is
			// not taken for none.
			revoke := time.Minute
			if tc.cut != "" {
				revoke = 200 * time.Millisecond
			}
			r, err := New(WithIdentity("gen/0"), WithRevokeTimeout(revoke), WithCloseTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			closeTimeout := time.Minute
			if tc.cut == "timeout" {
				closeTimeout = 100 * time.Millisecond
			}
			s, err := New(WithRevokeTimeout(revoke), WithCloseTimeout(closeTimeout))
			if err != nil {
				r.Close()
				t.Fatal(err)
			}
			rClosed, sClosed := false, false
			defer func() {
				if !sClosed {
					s.Close()
				}
				if !rClosed {
					r.Close()
				}
			}()
			dst, _, err := r.Alloc(1 << 16)
			if err != nil {
				t.Fatal(err)
			}
			src, err := kvcache.NewHostRegion(1 << 16)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			dreg, err := r.Register(dst)
			if err != nil {
				t.Fatal(err)
			}
			register := s.Register
			if tc.source {
				register = s.RegisterSource
			}
			sreg, err := register(src)
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
			// up both ways before the receiver is held (UCX 1.13 aborts on
			// a wireup reply still pending when its connection fails).
			post(0)
			if err := <-errs; err != nil {
				t.Fatal(err)
			}

			cut := tc.cut != ""
			if cut {
				// Hold the receiver's worker: the writer's flush stays in
				// flight.
				rIn, rGo, rDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
				go func() {
					defer close(rDone)
					r.w.do(func() { close(rIn); <-rGo })
				}()
				<-rIn
				post(8192)
				deadline := time.Now().Add(30 * time.Second)
				for {
					pending := false
					s.w.do(func() { pending = len(ep.u.pend) > 0 })
					if pending && OnTheWire(ep) {
						break
					}
					if time.Now().After(deadline) {
						close(rGo)
						t.Fatal("the batch never went on the wire")
					}
					time.Sleep(time.Millisecond) // poll with a deadline
				}
				var closeErr error
				if tc.cut == "error" {
					// UCX reports the endpoint failed (a keepalive
					// timeout): the batch on the wire is cut unproven.
					s.w.do(func() { s.w.onError(ep.u.id, ucsEndpointTimeout) })
				} else {
					// The flush cannot complete while the receiver is
					// held: the close timeout cuts the batch.
					closeErr = ep.Close()
				}
				err := <-errs
				close(rGo)
				<-rDone
				if !errors.Is(err, rdma.ErrCloseUnproven) {
					t.Fatalf("batch cut on the wire: Done(%v), want ErrCloseUnproven", err)
				}
				if tc.cut == "error" {
					closeErr = ep.Close()
				}
				if !errors.Is(closeErr, rdma.ErrCloseUnproven) {
					t.Fatalf("Close of the endpoint whose batch was cut: %v, want ErrCloseUnproven", closeErr)
				}
			} else if err := ep.Close(); err != nil {
				t.Fatalf("Close of the endpoint: %v", err)
			}

			switch tc.first {
			case "writer":
				sClosed = true
				err := s.Close()
				switch {
				case !cut || tc.source:
					if err != nil {
						t.Errorf("writer's Close: %v, want nil", err)
					}
				case !errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), "told no bye"):
					t.Errorf("writer's Close after a cut: %v, want ErrCloseUnproven saying the receiver was told no bye", err)
				}
				err = r.Deregister(dreg)
				switch {
				case !cut && err != nil:
					t.Errorf("receiver's Deregister after the writer's bye: %v, want nil", err)
				case cut && !errors.Is(err, rdma.ErrRegionBusy):
					t.Errorf("receiver's Deregister after the writer closed with a write cut on the wire: %v, want ErrRegionBusy", err)
				}
				rClosed = true
				err = r.Close()
				switch {
				case !cut && err != nil:
					t.Errorf("receiver's Close after the writer's bye: %v, want nil", err)
				case cut && !errors.Is(err, rdma.ErrCloseUnproven):
					t.Errorf("receiver's Close after the writer closed with a write cut on the wire: %v, want ErrCloseUnproven", err)
				}
			case "receiver":
				rClosed = true
				err := r.Close()
				switch {
				case !cut && err != nil:
					t.Errorf("receiver's Close, the writer's endpoint closed cleanly: %v, want nil", err)
				case cut && (!errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), "did not acknowledge")):
					t.Errorf("receiver's Close, a write of the writer cut on the wire: %v, want ErrCloseUnproven naming the unacknowledged bye", err)
				}
			}
			if cut {
				// msync fails with ENOMEM on a range that is not mapped.
				if err := unix.Msync(dst.Bytes(), unix.MS_ASYNC); err != nil {
					t.Errorf("the receiver's allocation after its Close: msync: %v (unmapped while a cut write may still land in it)", err)
				}
			}
		})
	}
}
