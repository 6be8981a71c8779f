//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// TestUnacknowledgedByeOfASourceOnlyAgent: an agent every registration of
// which is a source (RegisterSource: a send-only writer's pool, here
// memory it allocated) owes no proof for its memory at Close: no peer
// holds a key to write into it. A peer that does not acknowledge its bye
// (its worker held past the revoke timeout) must not make its Close
// return rdma.ErrCloseUnproven, nor keep its allocation mapped and its
// context alive. The same agent with the allocation registered for
// peers to write into keeps today's behaviour: Close returns
// ErrCloseUnproven naming the unacknowledged bye and leaves the
// allocation mapped. Before the fix the source-only agent's Close
// returned ErrCloseUnproven ("did not acknowledge the bye") and kept its
// allocation mapped too.
func TestUnacknowledgedByeOfASourceOnlyAgent(t *testing.T) {
	// tcp, as in TestNoByeAfterWritesCutUnproven: the bye's
	// acknowledgement needs the peer's worker, which the test holds.
	t.Setenv("UCX_TLS", "tcp")
	for _, source := range []bool{true, false} {
		name := "writable"
		if source {
			name = "source-only"
		}
		t.Run(name, func(t *testing.T) {
			// Short close timeouts: the agent's close of its link to the
			// held peer waits for the bye's send to flush, and the peer,
			// let go, acknowledges to an agent that is gone.
			r, err := New(WithIdentity("gen/0"), WithRevokeTimeout(200*time.Millisecond), WithCloseTimeout(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			rClosed, sClosed := false, false
			s, err := New(WithRevokeTimeout(200*time.Millisecond), WithCloseTimeout(200*time.Millisecond))
			if err != nil {
				r.Close()
				t.Fatal(err)
			}
			defer func() {
				if !sClosed {
					s.Close()
				}
				if !rClosed {
					r.Close()
				}
			}()
			dst, err := kvcache.NewHostRegion(1 << 16)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			dreg, err := r.Register(dst)
			if err != nil {
				t.Fatal(err)
			}
			const n = 1 << 16
			src, _, err := s.Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			register := s.Register
			if source {
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
			// One batch through, so that UCX has wired the endpoint up
			// both ways before the peer is held (UCX 1.13 aborts on a
			// wireup reply still pending when its connection fails).
			done := make(chan error, 1)
			if err := epi.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(),
				Segments: []kvcache.Segment{{Len: 4096}},
				Done:     func(err error) { done <- err }}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if err := epi.Close(); err != nil {
				t.Fatalf("Close of the endpoint: %v", err)
			}

			// Hold the peer's worker: it cannot acknowledge the bye.
			rIn, rGo, rDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
			go func() {
				defer close(rDone)
				r.w.do(func() { close(rIn); <-rGo })
			}()
			<-rIn
			sClosed = true
			err = s.Close()
			close(rGo)
			<-rDone
			base := uint64(src.Base)
			if source {
				if err != nil {
					t.Errorf("source-only agent's Close, its bye unacknowledged: %v, want nil", err)
				}
				if mapped(t, base, n) {
					t.Errorf("source-only agent's allocation still mapped after a Close that owed no proof")
				}
			} else {
				if !errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), "did not acknowledge the bye") {
					t.Errorf("writable agent's Close, its bye unacknowledged: %v, want ErrCloseUnproven naming the unacknowledged bye", err)
				}
				if !mapped(t, base, n) {
					t.Errorf("writable agent's allocation unmapped after a Close that proved nothing")
				}
			}
			rClosed = true
			r.Close() // whatever it proves of s is TestNoByeAfterWritesCutUnproven's
		})
	}
}
