package actors

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// fakeRevoker is a kvcache.Revoker of the test's: Revoke takes every run
// (or refuses each with refuse), and each release it hands out returns
// releaseErr. Nothing moves for writers (Remap adds nothing): the test's
// request never has a writer that writes.
type fakeRevoker struct {
	refuse, releaseErr error
	mu                 sync.Mutex
	runs               int // runs taken back
	released           atomic.Int64
}

func (r *fakeRevoker) Revoke(off, n uint64) (func() error, error) {
	if r.refuse != nil {
		return nil, r.refuse
	}
	r.mu.Lock()
	r.runs++
	r.mu.Unlock()
	return func() error {
		r.released.Add(1)
		return r.releaseErr
	}, nil
}

func (r *fakeRevoker) Remap(dst []kvcache.Extent, off, n uint64) []kvcache.Extent { return dst }

func (r *fakeRevoker) taken() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs
}

// startRevokingRank is startTestRank with rv as the engine's Revoker.
func startRevokingRank(t *testing.T, inst string, link control.Link, rv kvcache.Revoker) *testRank {
	t.Helper()
	return startTestRankWith(t, inst, link, loopback.New(), true, func(c *EngineConfig) { c.Revoker = rv })
}

// TestRevokedDestRefusedAreCountedOnce: with a Revoker, a cancelled
// request's destination blocks are revoked (or, where the Revoker refuses,
// quarantined) instead of quarantined. When the pools refuse the free of
// the revoked blocks or the quarantine of those the Revoker refused (one
// block's state changed behind the session's back), or a release of the
// revoked memory fails at the proof, that is counted in
// Counters.DestBlockErrors exactly once — not only logged, and a refused
// quarantine is not followed by a release from quarantine that the pools
// refuse again — and the blocks stay as the pools hold them. (Checked to
// fail: with revokeDest's Free or Quarantine refusal, or releaseRevoked's
// failed release, only logged, the counter stayed 0; without r.held = nil
// after the refused quarantine it was 2 after the proof.) A release that
// fails leaves its blocks in Counters.RevokedHeld: the Revoker still holds
// their old memory (checked to fail with the count lowered regardless).
func TestRevokedDestRefusedAreCountedOnce(t *testing.T) {
	const id, prompt = "revoke-refused", 48
	errSpent := errors.New("spare reserve spent (the test's Revoker)")
	errRelease := errors.New("release failed (the test's Revoker)")
	cases := []struct {
		name string
		rv   *fakeRevoker
		// behind: block 0 is freed behind the session's back before the
		// cancel, so the pools refuse the revocation's free or quarantine.
		behind bool
		// revoked: how many runs the Revoker takes back (one: the
		// request's blocks are consecutive); released how many releases
		// it sees at the proof.
		revoked, released int
		// want: each block's state at the end (block 0's too) and how
		// many are quarantined.
		want        func(i int) kvcache.BlockState
		quarantined int
		// stillHeld: the revoked memory's release failed, so every
		// block stays in Counters.RevokedHeld.
		stillHeld bool
	}{
		{name: "free of revoked blocks refused", rv: &fakeRevoker{}, behind: true, revoked: 1, released: 1,
			want: receivingBut0},
		{name: "quarantine of blocks not revoked refused", rv: &fakeRevoker{refuse: errSpent}, behind: true,
			want: receivingBut0},
		{name: "release of revoked memory fails", rv: &fakeRevoker{releaseErr: errRelease}, revoked: 1, released: 1,
			want: func(int) kvcache.BlockState { return kvcache.BlockFree }, stillHeld: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			took, acks := make(chan messages.Frame, 4), make(chan messages.Frame, 4)
			holdOf := func(took chan<- messages.Frame, match func(messages.Frame) bool) func(messages.Frame) (bool, error) {
				return func(f messages.Frame) (bool, error) {
					if f.Request() != id || !match(f) {
						return false, nil
					}
					took <- f
					return true, nil
				}
			}
			// The RequestData "leaves" but never arrives; the context
			// rank answers the Cancel with a CancelAck (it never heard of
			// the request), the proof, held until the test lets it go.
			ml := control.NewMemLink()
			cl := &tapLink{Link: ml, on: holdOf(acks, func(f messages.Frame) bool { _, ok := f.(*messages.CancelAck); return ok })}
			startTestRank(t, "ctx", cl)
			gen := startRevokingRank(t, "gen", &tapLink{Link: ml, on: holdOf(took, func(f messages.Frame) bool {
				_, ok := f.(*messages.RequestData)
				return ok
			})}, tc.rv)
			rx, err := gen.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
				ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(20 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			blocks := wait(t, "RequestData", took).(*messages.RequestData).Groups[0].Blocks
			if tc.behind {
				if err := behindTheBack(gen, func(p *kvcache.Pool) error { return p.FreeReceiving(kvcache.BlockID(blocks[0])) }); err != nil {
					t.Fatal(err)
				}
			}
			rx.Cancel()
			if o := wait(t, "generation outcome", rx.Done()); o.Status != StatusCancelled {
				t.Fatalf("generation side: %s %v, want CANCELLED", o.Status, o.Err)
			}
			// Done comes after the step's effects: the revocation is over.
			wantErrs := int64(0)
			if tc.behind {
				wantErrs = 1
			}
			if n := gen.e.Stats().DestBlockErrors.Load(); n != wantErrs {
				t.Errorf("after the cancel: Counters.DestBlockErrors = %d, want %d", n, wantErrs)
			}
			if n := tc.rv.taken(); n != tc.revoked {
				t.Errorf("the Revoker took %d runs back, want %d", n, tc.revoked)
			}
			wait(t, "CancelAck", acks)
			if err := cl.release(); err != nil {
				t.Fatal(err)
			}
			wait(t, "the blocks' release", rx.Released())
			if n := gen.e.Stats().DestBlockErrors.Load(); n != 1 {
				t.Errorf("after the proof: Counters.DestBlockErrors = %d, want 1 (one refusal or failure, counted once)", n)
			}
			if n := tc.rv.released.Load(); n != int64(tc.released) {
				t.Errorf("the Revoker saw %d releases, want %d", n, tc.released)
			}
			wantHeld := int64(0)
			if tc.stillHeld {
				wantHeld = int64(len(blocks))
			}
			if n := gen.e.Stats().RevokedHeld.Load(); n != wantHeld {
				t.Errorf("Counters.RevokedHeld = %d after the proof, want %d", n, wantHeld)
			}
			for i, st := range blockStates(t, gen, blocks) {
				if w := tc.want(i); st != w {
					t.Errorf("block %d: %v after the proof, want %v", blocks[i], st, w)
				}
			}
			if q := gen.e.Pools().Quarantined(); q != tc.quarantined {
				t.Errorf("%d blocks quarantined, want %d", q, tc.quarantined)
			}
		})
	}
}

// receivingBut0: block 0 was freed behind the session's back; the others
// stay the receive's (in use) after the refusal: never freed.
func receivingBut0(i int) kvcache.BlockState {
	if i == 0 {
		return kvcache.BlockFree
	}
	return kvcache.BlockReceiving
}
