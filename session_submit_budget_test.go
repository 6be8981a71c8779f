//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestSessionPastBudgetDropsSubmitsAndEnds: a TxSession panics running
// its Submits — after the first `skip` of them, the next `panics` runs
// (each Submit runs again once, then is dropped) — up to past its
// restart budget. Every op dropped so is stepped as never posted (no
// stream nor worker ever got it): both sides end, every source pin goes
// at Done, and Close is clean. (It passed before the fix of
// TestSessionPastBudgetDroppedSubmitSettlesItsStream: it needs a stream
// spawned again that counted a Submit still to run.)
func TestSessionPastBudgetDropsSubmitsAndEnds(t *testing.T) {
	for _, c := range [][2]int{{0, 3}, {0, 5}, {0, 8}, {1, 5}, {1, 6}, {2, 4}, {1, 8}} {
		skip, panics := c[0], c[1]
		t.Run(fmt.Sprint(skip, "/", panics), func(t *testing.T) {
			var n atomic.Int32
			hook := func(side string, e actors.Effect) bool {
				_, ok := e.(actors.Submit)
				if side != "tx" || !ok {
					return false
				}
				i := n.Add(1)
				return i > int32(skip) && i <= int32(skip+panics)
			}
			actors.PanicOnEffect.Store(&hook)
			t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
			l := smallLayout()
			ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = 10 * time.Minute })
			th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "b", PromptLen: 64})
			if err != nil {
				t.Fatal(err)
			}
			src, err := sendFilled(t, ce, th, l, 64, 16, 1)
			if err != nil {
				t.Fatal(err)
			}
			rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "b", PromptLen: 64, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
			if o := waitOutcome(t, th.Done()); o.OK {
				t.Fatalf("tx %s, want the request failed by the panics", o.Status)
			}
			if err := ce.Pools().Free(src); err != nil {
				t.Fatalf("free the source blocks after Done: %v", err)
			}
			if ro := waitOutcome(t, rh.Done()); ro.OK {
				t.Fatalf("rx %s, want a failure", ro.Status)
			}
			select {
			case <-rh.Released():
			case <-time.After(30 * time.Second):
				t.Fatal("rx never released its blocks")
			}
			if v := ce.Stats().StreamViolations; v != 0 {
				t.Fatalf("%d stream violations", v)
			}
		})
	}
}

// TestSessionPastBudgetDroppedSubmitSettlesItsStream: a stream spawned
// again after a restart of its session takes the step's ops in flight as
// its account — those whose Submit is still to run among them. When one
// of those Submits is then dropped past the session's restart budget (a
// resumed session keeps its children), the step takes it as never
// posted; before, the stream never learnt it: it counted the op unsettled
// for good, held its terminal frame, and its session's release (Unpin,
// Finish) waited for it — Done never came, the source pins stayed, the
// generation side waited for its deadline (here ten minutes). The Submit
// calls panic at 2, 4, 6 (three restarts, each Submit running again
// fine and spawning the stream again) and at 8 and 9 (past the budget:
// the fifth Submit, counted by the stream spawned at 7, is dropped).
func TestSessionPastBudgetDroppedSubmitSettlesItsStream(t *testing.T) {
	var n atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		if _, ok := e.(actors.Submit); !ok || side != "tx" {
			return false
		}
		switch n.Add(1) {
		case 2, 4, 6, 8, 9:
			return true
		}
		return false
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	l := smallLayout()
	ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = 10 * time.Minute })
	th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "s", PromptLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	// Every chunk's fence fires before the RequestData comes: the step
	// that takes it emits the eight Submits in one batch. (The step hook
	// only watches: it counts the fences the session stepped.)
	var fired atomic.Int32
	watch := func(side string, m any) bool {
		if _, ok := m.(actors.TxFenceFired); ok && side == "tx" {
			fired.Add(1)
		}
		return false
	}
	actors.PanicOnStep.Store(&watch)
	t.Cleanup(func() { actors.PanicOnStep.Store(nil) })
	src, err := sendFilled(t, ce, th, l, 128, 16, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every chunk's fence stepped", func() bool { return fired.Load() == 8 })
	rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "s", PromptLen: 128, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	var o kvxfer.Outcome
	select {
	case o = <-th.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("no tx outcome 60 s after a Submit dropped past the restart budget (%d Submit runs, %d panics past budget): the stream holds the release",
			n.Load(), ce.Stats().SessionPanicsPastBudget)
	}
	if got := ce.Stats().SessionPanicsPastBudget; got != 2 {
		t.Fatalf("%d panics past the budget, want 2 (%d Submit runs): the test proves nothing", got, n.Load())
	}
	if o.OK {
		t.Fatalf("tx %s, want the request failed by the panics", o.Status)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free the source blocks after Done: %v", err)
	}
	if ro := waitOutcome(t, rh.Done()); ro.OK {
		t.Fatalf("rx %s, want a failure", ro.Status)
	}
	select {
	case <-rh.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx never released its blocks")
	}
}

// TestSessionPastBudgetKeepsStepEffectsBehindLeftovers: a session resumed
// past its restart budget takes the next message in its mailbox before
// the supervisor's runLeftover — here the last chunk's fence, fired from
// inside the panic that takes the session past its budget, so that it is
// queued first. The fence's step emits a Submit (op 3), run behind what
// the panic left (the Submits of ops 1 and 2). Before, a panic in those
// leftovers lost the fence step's own effects (they were in no list a
// later incarnation runs): op 3 stayed SUBMITTING for good, the session
// never drained, Done never came, and the generation side waited for its
// deadline. (It showed as a rare timeout of
// TestSessionPastBudgetDropsSubmitsAndEnds/0/8 under load.) The Submits
// panic at runs 1-8: each of ops 0-3 runs twice and is dropped.
func TestSessionPastBudgetKeepsStepEffectsBehindLeftovers(t *testing.T) {
	l := smallLayout()
	ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = 10 * time.Minute })
	th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "k", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(64)
	}
	src, err := ce.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(64, 16, l.TokensPerBlock)
	if err != nil || len(chunks) != 4 {
		t.Fatalf("%d chunks (%v), want 4", len(chunks), err)
	}
	fences := make([]*kvxfer.ManualFence, len(chunks))
	for i, ch := range chunks {
		fences[i] = &kvxfer.ManualFence{}
		if err := th.Chunk(ch, ch.Runs(l.TokensPerBlock, src), fences[i]); err != nil {
			t.Fatal(err)
		}
	}
	var n atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		if _, ok := e.(actors.Submit); !ok || side != "tx" {
			return false
		}
		i := n.Add(1)
		if i == 4 {
			// The panic that takes the session past its budget (three
			// restarts): the last fence's TxFenceFired is queued before
			// the supervisor's runLeftover.
			fences[3].Fire(nil)
		}
		return i <= 8
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	// Fences 0-2 fire before the RequestData: the step that takes it emits
	// the Submits of ops 0-2 in one batch.
	var fired atomic.Int32
	watch := func(side string, m any) bool {
		if _, ok := m.(actors.TxFenceFired); ok && side == "tx" {
			fired.Add(1)
		}
		return false
	}
	actors.PanicOnStep.Store(&watch)
	t.Cleanup(func() { actors.PanicOnStep.Store(nil) })
	for _, f := range fences[:3] {
		f.Fire(nil)
	}
	waitUntil(t, "three fences stepped", func() bool { return fired.Load() == 3 })
	rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "k", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	var o kvxfer.Outcome
	select {
	case o = <-th.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("no tx outcome in 60 s (%d Submit runs, %d panics past budget): the fence step's Submit was lost behind the leftovers",
			n.Load(), ce.Stats().SessionPanicsPastBudget)
	}
	if got := ce.Stats().SessionPanicsPastBudget; got < 2 {
		t.Fatalf("%d panics past the budget, want 2 or more (%d Submit runs): the test proves nothing", got, n.Load())
	}
	if o.OK {
		t.Fatalf("tx %s, want the request failed by the panics", o.Status)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free the source blocks after Done: %v", err)
	}
	if ro := waitOutcome(t, rh.Done()); ro.OK {
		t.Fatalf("rx %s, want a failure", ro.Status)
	}
	select {
	case <-rh.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx never released its blocks")
	}
}
