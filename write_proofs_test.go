package kvxfer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/messages"
)

// TestWriteProofsCountedByKind: a writer's proof of each kind that
// releases a quarantined request counts in Stats.WriteProofs and
// kvxfer_write_proofs_total (and the request in
// kvxfer_write_proof_requests_total) under its own kind and no other; a
// second proof for the same incarnation, with nothing left to release,
// counts as a proof of no request; a kind that is none of kvxfer's is
// refused (ErrBadRequest) and counts nothing, and so does a proof after
// Close. (Checked to fail without the counting: no such series, and
// Stats.WriteProofs stayed zero.)
func TestWriteProofsCountedByKind(t *testing.T) {
	for k := range kvxfer.NumProofKinds {
		kind := kvxfer.ProofKind(k)
		t.Run(kind.String(), func(t *testing.T) {
			l := smallLayout()
			c, link := startPartClusterWith(t, l, func(inst string, cfg *kvxfer.Config) {
				if inst == "gen" {
					cfg.MetricsAddr = "127.0.0.1:0"
				}
			})
			gen, ctxE := c.gen[0], c.ctx[0]
			writer, inc := ctxE.Hello().From, ctxE.Hello().Incarnation
			engine := gen.Hello().From.String()
			want := func(what string, proofs, reqs int64) {
				t.Helper()
				st := gen.Stats()
				s := scrape(t, gen, engine)
				for o := range kvxfer.NumProofKinds {
					other := kvxfer.ProofKind(o)
					wp, wr := int64(0), int64(0)
					if other == kind {
						wp, wr = proofs, reqs
					}
					if got := st.WriteProofs[other]; got != (kvxfer.ProofCount{Proofs: wp, Requests: wr}) {
						t.Errorf("%s: Stats.WriteProofs[%s] = %+v, want %d proofs, %d requests", what, other, got, wp, wr)
					}
					if got := s.get(t, "kvxfer_write_proofs_total", "kind", other.String()); got != float64(wp) {
						t.Errorf("%s: kvxfer_write_proofs_total{kind=%s} = %v, want %d", what, other, got, wp)
					}
					if got := s.get(t, "kvxfer_write_proof_requests_total", "kind", other.String()); got != float64(wr) {
						t.Errorf("%s: kvxfer_write_proof_requests_total{kind=%s} = %v, want %d", what, other, got, wr)
					}
				}
			}
			want("at start", 0, 0)

			rx := receiveAtWriter(t, gen, link, "x1")
			link.setCut(true)
			gen.PeerDown(writer)
			if o := waitOutcome(t, rx.Done()); o.OK {
				t.Fatalf("x1 after suspicion: %s", o.Status)
			}
			waitUntil(t, "x1's blocks quarantined on suspicion", func() bool { return gen.Pools().Quarantined() > 0 })
			want("suspicion (no proof)", 0, 0)

			if n, err := gen.WriterProven(writer, inc, kvxfer.ProofKind(kvxfer.NumProofKinds), "test: forged"); n != 0 || !errors.Is(err, kvxfer.ErrBadRequest) {
				t.Fatalf("WriterProven of an unknown kind: %d, %v; want 0, ErrBadRequest", n, err)
			}
			if gen.Pools().Quarantined() == 0 {
				t.Fatal("a proof of an unknown kind released the quarantine")
			}
			want("a proof of an unknown kind", 0, 0)

			prove := gen.WriterProven
			if kind == kvxfer.ProofExited { // WriterExited's kind
				prove = func(p messages.PeerID, inc uint64, _ kvxfer.ProofKind, how string) (int, error) {
					return gen.WriterExited(p, inc, how)
				}
			}
			if n, err := prove(writer, inc, kind, "test: "+kind.String()); err != nil || n != 1 {
				t.Fatalf("WriterProven(%s) with x1 quarantined: %d, %v; want 1", kind, n, err)
			}
			waitUntil(t, "the quarantine to empty on the proof", func() bool { return gen.Pools().Quarantined() == 0 })
			want("the proof", 1, 1)

			if n, err := gen.WriterProven(writer, inc, kind, "test: again"); err != nil || n != 0 {
				t.Fatalf("a second WriterProven(%s): %d, %v; want 0", kind, n, err)
			}
			want("a proof that concerned nothing", 2, 1)

			link.setCut(false)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := gen.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if n, err := gen.WriterProven(writer, inc, kind, "test: after Close"); err == nil {
				t.Fatalf("WriterProven after Close: %d, no error", n)
			}
			if got := gen.Stats().WriteProofs[kind]; got != (kvxfer.ProofCount{Proofs: 2, Requests: 1}) {
				t.Errorf("after a proof refused by a closed engine: %+v, want 2 proofs, 1 request", got)
			}
		})
	}
}

// TestProofKindNames: the label values are fixed (dashboards name them),
// and a value out of range says what it is.
func TestProofKindNames(t *testing.T) {
	for k, want := range map[kvxfer.ProofKind]string{kvxfer.ProofExited: "exited", kvxfer.ProofPidfdExit: "pidfd_exit",
		kvxfer.ProofDrainedGoodbye: "drained_goodbye", kvxfer.ProofKind(9): "ProofKind(9)"} {
		if got := k.String(); got != want {
			t.Errorf("ProofKind(%d).String() = %q, want %q", uint8(k), got, want)
		}
	}
}
