package actors

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/metrics"
)

// behindTheBack applies f to group 0's pool of r straight, under the
// pools' lock as the engine's own calls are made: a block's state changed
// by a bug elsewhere, which the session's next pool call then meets.
func behindTheBack(r *testRank, f func(*kvcache.Pool) error) error {
	p := r.e.Pools()
	p.mu.Lock()
	defer p.mu.Unlock()
	return f(r.pools[0])
}

// blockStates is the state of each of ids in group 0's pool of r.
func blockStates(t *testing.T, r *testRank, ids []int32) []kvcache.BlockState {
	t.Helper()
	p := r.e.Pools()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]kvcache.BlockState, len(ids))
	for i, id := range ids {
		st, err := r.pools[0].State(kvcache.BlockID(id))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = st
	}
	return out
}

// TestDestBlocksRefusedAreCountedAndKept: when the pools refuse a
// generation session's quarantine, release from quarantine or free of its
// destination blocks (here: one block's state was changed behind the
// session's back), the request is over already, so the refusal is
// counted (Counters.DestBlockErrors, once per refusal) — not only logged —
// and the blocks stay exactly where the pools hold them: the refusal
// frees none, and a refused quarantine is not followed by a release that
// the pools would refuse again. (Checked to fail without the fix: the
// counter stayed 0 in every case; and 2 in the first when the release
// after a refused quarantine was not skipped.)
func TestDestBlocksRefusedAreCountedAndKept(t *testing.T) {
	const id, prompt = "refused", 48
	type setup struct {
		gen, ctx *testRank
		rx       *RxHandle
		blocks   []int32 // the request's destination blocks (group 0)
	}
	// start starts both ranks, their frames through genTap and ctxTap,
	// and the receive.
	start := func(t *testing.T, genTap, ctxTap func(messages.Frame) (bool, error)) (*setup, *tapLink) {
		ml := control.NewMemLink()
		cl := &tapLink{Link: ml, on: ctxTap}
		s := &setup{ctx: startTestRank(t, "ctx", cl), gen: startTestRank(t, "gen", &tapLink{Link: ml, on: genTap})}
		var err error
		s.rx, err = s.gen.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
			ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(20 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		return s, cl
	}
	pass := func(messages.Frame) (bool, error) { return false, nil }
	holdOf := func(took chan<- messages.Frame, match func(messages.Frame) bool) func(messages.Frame) (bool, error) {
		return func(f messages.Frame) (bool, error) {
			if f.Request() != id || !match(f) {
				return false, nil
			}
			took <- f
			return true, nil
		}
	}
	isRequestData := func(f messages.Frame) bool { _, ok := f.(*messages.RequestData); return ok }
	isCancelAck := func(f messages.Frame) bool { _, ok := f.(*messages.CancelAck); return ok }
	check := func(t *testing.T, s *setup, quarantined int, want kvcache.BlockState) {
		t.Helper()
		if n := s.gen.e.Stats().DestBlockErrors.Load(); n != 1 {
			t.Errorf("Counters.DestBlockErrors = %d, want 1 (one refusal)", n)
		}
		// Block 0 is the one changed behind the session's back (free
		// now); the others stay as the pools held them at the refusal.
		sts := blockStates(t, s.gen, s.blocks)
		if sts[0] != kvcache.BlockFree {
			t.Errorf("block %d (changed behind the session's back): %v, want free", s.blocks[0], sts[0])
		}
		for i, st := range sts[1:] {
			if st != want {
				t.Errorf("block %d: %v after the refusal, want %v (held, never freed)", s.blocks[i+1], st, want)
			}
		}
		if q := s.gen.e.Pools().Quarantined(); q != quarantined {
			t.Errorf("%d blocks quarantined, want %d", q, quarantined)
		}
	}

	t.Run("quarantine", func(t *testing.T) {
		took := make(chan messages.Frame, 4)
		// The RequestData "leaves" but never arrives: the context rank
		// answers the Cancel with a CancelAck (it never heard of the
		// request), the proof that releases the blocks from quarantine.
		s, _ := start(t, holdOf(took, isRequestData), pass)
		s.blocks = wait(t, "RequestData", took).(*messages.RequestData).Groups[0].Blocks
		if err := behindTheBack(s.gen, func(p *kvcache.Pool) error { return p.FreeReceiving(kvcache.BlockID(s.blocks[0])) }); err != nil {
			t.Fatal(err)
		}
		s.rx.Cancel()
		if o := wait(t, "generation outcome", s.rx.Done()); o.Status != StatusCancelled {
			t.Fatalf("generation side: %s %v, want CANCELLED", o.Status, o.Err)
		}
		wait(t, "the blocks' release", s.rx.Released())
		// The quarantine was refused: the blocks stay the receive's (in
		// use), and the release after the CancelAck neither frees them
		// nor counts a second refusal.
		check(t, s, 0, kvcache.BlockReceiving)
	})

	t.Run("release from quarantine", func(t *testing.T) {
		took, acks := make(chan messages.Frame, 4), make(chan messages.Frame, 4)
		s, cl := start(t, holdOf(took, isRequestData), holdOf(acks, isCancelAck))
		s.blocks = wait(t, "RequestData", took).(*messages.RequestData).Groups[0].Blocks
		s.rx.Cancel()
		if o := wait(t, "generation outcome", s.rx.Done()); o.Status != StatusCancelled {
			t.Fatalf("generation side: %s %v, want CANCELLED", o.Status, o.Err)
		}
		// Done comes after the step's effects: the blocks are quarantined.
		if q := s.gen.e.Pools().Quarantined(); q != len(s.blocks) {
			t.Fatalf("%d blocks quarantined after the cancel, want %d", q, len(s.blocks))
		}
		if err := behindTheBack(s.gen, func(p *kvcache.Pool) error { return p.ReleaseQuarantine(kvcache.BlockID(s.blocks[0])) }); err != nil {
			t.Fatal(err)
		}
		wait(t, "CancelAck", acks)
		if err := cl.release(); err != nil {
			t.Fatal(err)
		}
		wait(t, "the blocks' release", s.rx.Released())
		check(t, s, len(s.blocks)-1, kvcache.BlockQuarantined)
	})

	t.Run("free", func(t *testing.T) {
		// The control plane refuses the RequestData for good: the request
		// fails at once, its writer never got it (quiescent), and the
		// session frees the blocks in that step — after the refusal
		// changed block 0 behind its back.
		var gen atomic.Pointer[testRank] // set before the receive starts
		type refusal struct {
			blocks []int32
			err    error
		}
		refused := make(chan refusal, 1)
		refuse := func(f messages.Frame) (bool, error) {
			rd, ok := f.(*messages.RequestData)
			if !ok || rd.RequestID != id {
				return false, nil
			}
			blocks := rd.Groups[0].Blocks
			err := behindTheBack(gen.Load(), func(p *kvcache.Pool) error { return p.FreeReceiving(kvcache.BlockID(blocks[0])) })
			select {
			case refused <- refusal{blocks, err}:
			default: // only the first is the test's
			}
			return false, fmt.Errorf("%w: refused by the test", control.ErrFrameRefused)
		}
		ml := control.NewMemLink()
		s := &setup{ctx: startTestRank(t, "ctx", ml), gen: startTestRank(t, "gen", &tapLink{Link: ml, on: refuse})}
		gen.Store(s.gen)
		var err error
		s.rx, err = s.gen.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
			ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(20 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		r := wait(t, "the RequestData's refusal", refused)
		if r.err != nil {
			t.Fatal(r.err)
		}
		s.blocks = r.blocks
		o := wait(t, "generation outcome", s.rx.Done())
		if o.Status != StatusFailed || !errors.Is(o.Err, ErrFrameUnsent) {
			t.Fatalf("generation side: %s %v, want FAILED, frame unsent", o.Status, o.Err)
		}
		wait(t, "the blocks' release", s.rx.Released())
		check(t, s, 0, kvcache.BlockReceiving)
	})
}

// TestDestBlockErrorsMetric: Counters.DestBlockErrors is scraped as
// kvxfer_dest_block_errors_total.
func TestDestBlockErrorsMetric(t *testing.T) {
	set := metrics.New("test/0")
	stats := &Counters{}
	if _, err := newMeters(set, stats, NewPools(nil), nil, new(atomic.Int64), new(orphanStats)); err != nil {
		t.Fatal(err)
	}
	stats.DestBlockErrors.Add(2)
	mfs, err := set.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metrics.Namespace+"_dest_block_errors_total" {
			continue
		}
		if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 2 {
			t.Fatalf("%s = %v, want 2", mf.GetName(), v)
		}
		return
	}
	t.Fatalf("no %s_dest_block_errors_total in the scrape", metrics.Namespace)
}
