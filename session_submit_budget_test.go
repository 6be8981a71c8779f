//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
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
			endedFailed(t, ce, waitOutcome(t, th.Done()), src, rh)
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
	// that takes it emits the eight Submits in one batch.
	fired := fencesStepped(t)
	src, err := sendFilled(t, ce, th, l, 128, 16, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every chunk's fence stepped", func() bool { return fired.Load() == 8 })
	rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "s", PromptLen: 128, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	o := waitTxOutcome(t, th, func() string {
		return fmt.Sprintf("a Submit dropped past the restart budget (%d Submit runs, %d panics past budget): the stream holds the release",
			n.Load(), ce.Stats().SessionPanicsPastBudget)
	})
	if got := ce.Stats().SessionPanicsPastBudget; got != 2 {
		t.Fatalf("%d panics past the budget, want 2 (%d Submit runs): the test proves nothing", got, n.Load())
	}
	endedFailed(t, ce, o, src, rh)
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
	src, fences := chunksUnfired(t, ce, th, l, 64, 16)
	if len(fences) != 4 {
		t.Fatalf("%d chunks, want 4", len(fences))
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
	fired := fencesStepped(t)
	for _, f := range fences[:3] {
		f.Fire(nil)
	}
	waitUntil(t, "three fences stepped", func() bool { return fired.Load() == 3 })
	rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "k", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	o := waitTxOutcome(t, th, func() string {
		return fmt.Sprintf("%d Submit runs, %d panics past budget: the fence step's Submit was lost behind the leftovers",
			n.Load(), ce.Stats().SessionPanicsPastBudget)
	})
	if got := ce.Stats().SessionPanicsPastBudget; got < 2 {
		t.Fatalf("%d panics past the budget, want 2 or more (%d Submit runs): the test proves nothing", got, n.Load())
	}
	endedFailed(t, ce, o, src, rh)
}

// TestSessionPastBudgetKeepsAMessageTakenBeforeItsCatchUp: a session
// resumed past its restart budget takes the next message in its mailbox
// before the supervisor's runLeftover — here the chunk's fence, fired from
// inside the step panic that takes the session past its budget (a Cancel's
// step, after three crashes), so that it is queued first. The shell first
// steps the lost Cancel again, and that step panics too: the Cancel is
// dropped, as a second panic drops a lost message. Before, the fence went
// with it — taken from the mailbox, never stepped, in no list a later run
// takes: the chunk stayed pinned and unfired for good, the session never
// drained and Done never came, though its fence had fired.
func TestSessionPastBudgetKeepsAMessageTakenBeforeItsCatchUp(t *testing.T) {
	l := smallLayout()
	ce, _ := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = 10 * time.Minute })
	th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "f", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, fences := chunksUnfired(t, ce, th, l, 64, 64)
	if len(fences) != 1 {
		t.Fatalf("%d chunks, want 1", len(fences))
	}
	fence := fences[0]
	// The restart budget, spent: the session fails the request at the
	// first restart and waits, pinned, for its chunk's fence.
	for i := int64(1); i <= 3; i++ {
		th.Crash()
		waitUntil(t, fmt.Sprint("restart ", i), func() bool { return ce.Stats().SessionPanics == i })
	}
	var n atomic.Int32
	hook := func(side string, m any) bool {
		if _, ok := m.(actors.TxCancel); !ok || side != "tx" {
			return false
		}
		i := n.Add(1)
		if i == 1 {
			fence.Fire(nil)
		}
		return i <= 2
	}
	actors.PanicOnStep.Store(&hook)
	t.Cleanup(func() { actors.PanicOnStep.Store(nil) })
	th.Cancel()
	o := waitTxOutcome(t, th, func() string {
		return fmt.Sprintf("%d Cancel steps, %d panics past budget: the fence taken before the catch-up was lost",
			n.Load(), ce.Stats().SessionPanicsPastBudget)
	})
	if got := ce.Stats().SessionPanicsPastBudget; got != 2 || n.Load() != 2 {
		t.Fatalf("%d panics past the budget, %d Cancel steps, want 2 and 2: the test proves nothing", got, n.Load())
	}
	endedFailed(t, ce, o, src, nil)
}

// TestSessionPastBudgetFailsWhenNoRestartSteppedThePanic: each restart's
// Started panics in what the panic before left (the Submits of one batch
// panic at their first run, each running again fine in the next
// incarnation), before it steps TxPanic — until the session is past its
// restart budget, resumed with no Started. Before, no incarnation ever
// stepped TxPanic: the request, four panics later, ended DONE; and with
// a panic as the Flush runs (flush=true; an effect a panic interrupts is
// dropped: a failed request needs no flush) its stream stayed flushing
// for good — the request, on both sides, waited for its deadline (here
// ten minutes). Now the resumed session steps the panic no restart
// stepped, once what the panics left has run: the request fails (no
// Flush is emitted), and both sides end.
func TestSessionPastBudgetFailsWhenNoRestartSteppedThePanic(t *testing.T) {
	for _, flush := range []bool{false, true} {
		t.Run(fmt.Sprint("flush=", flush), func(t *testing.T) {
			l := smallLayout()
			ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = 10 * time.Minute })
			th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "p", PromptLen: 64})
			if err != nil {
				t.Fatal(err)
			}
			var submits, flushes atomic.Int32
			hook := func(side string, e actors.Effect) bool {
				if side != "tx" {
					return false
				}
				switch e.(type) {
				case actors.Submit:
					// Runs 1, 3, 5, 7: the first run of ops 0-3.
					return submits.Add(1)%2 == 1
				case actors.Flush:
					return flush && flushes.Add(1) == 1
				}
				return false
			}
			actors.PanicOnEffect.Store(&hook)
			t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
			// Every chunk's fence fires before the RequestData: the step
			// that takes it emits the four Submits in one batch.
			fired := fencesStepped(t)
			src, err := sendFilled(t, ce, th, l, 64, 16, 1)
			if err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "every chunk's fence stepped", func() bool { return fired.Load() == 4 })
			rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "p", PromptLen: 64, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
			o := waitTxOutcome(t, th, func() string {
				return fmt.Sprintf("%d Submit runs, %d Flush runs, %d restarts counted, %d panics past budget: the dropped Flush left its stream flushing",
					submits.Load(), flushes.Load(), ce.Stats().SessionPanics, ce.Stats().SessionPanicsPastBudget)
			})
			if got := ce.Stats().SessionPanicsPastBudget; got < 1 || submits.Load() != 8 {
				t.Fatalf("%d panics past the budget, %d Submit runs, want 1 or more and 8: the test proves nothing", got, submits.Load())
			}
			if !errors.Is(o.Err, actors.ErrSessionCrashed) {
				t.Fatalf("tx %s (%v), want the request failed by the panics", o.Status, o.Err)
			}
			endedFailed(t, ce, o, src, rh)
			// Each of the three restarts is counted, though its Started
			// panicked before it stepped the panic: the resumed run that
			// stepped it counts them. Before, SessionPanics stayed 0.
			waitUntil(t, "three restarts counted", func() bool { return ce.Stats().SessionPanics == 3 })
		})
	}
}

// fencesStepped counts the TxFenceFired the context side's sessions step:
// its step hook only watches (it injects no panic).
func fencesStepped(t *testing.T) *atomic.Int32 {
	t.Helper()
	var fired atomic.Int32
	watch := func(side string, m any) bool {
		if _, ok := m.(actors.TxFenceFired); ok && side == "tx" {
			fired.Add(1)
		}
		return false
	}
	actors.PanicOnStep.Store(&watch)
	t.Cleanup(func() { actors.PanicOnStep.Store(nil) })
	return &fired
}

// chunksUnfired hands th promptLen tokens of fresh source blocks of ce in
// chunks of chunkTokens, each with a fence of its own not fired yet; it
// returns the blocks and the fences, in chunk order.
func chunksUnfired(t *testing.T, ce *kvxfer.Engine, th *kvxfer.TxHandle, l kvcache.Layout, promptLen, chunkTokens int) ([][]kvcache.BlockID, []*kvxfer.ManualFence) {
	t.Helper()
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(promptLen)
	}
	src, err := ce.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	fences := make([]*kvxfer.ManualFence, len(chunks))
	for i, ch := range chunks {
		fences[i] = &kvxfer.ManualFence{}
		if err := th.Chunk(ch, ch.Runs(l.TokensPerBlock, src), fences[i]); err != nil {
			t.Fatal(err)
		}
	}
	return src, fences
}

// waitTxOutcome waits up to 60 s for th's outcome; past that it fails the
// test with what why says (the test's counts, and what a hang means).
func waitTxOutcome(t *testing.T, th *kvxfer.TxHandle, why func() string) kvxfer.Outcome {
	t.Helper()
	select {
	case o := <-th.Done():
		return o
	case <-time.After(60 * time.Second):
		t.Fatal("no tx outcome in 60 s (" + why() + ")")
	}
	return kvxfer.Outcome{}
}

// endedFailed requires the tx outcome o to be a failure and the source
// blocks src to free (every pin dropped at Done); with rh, the rx side
// to fail too and release its blocks.
func endedFailed(t *testing.T, ce *kvxfer.Engine, o kvxfer.Outcome, src [][]kvcache.BlockID, rh *kvxfer.RxHandle) {
	t.Helper()
	if o.OK {
		t.Fatalf("tx %s, want the request failed by the panics", o.Status)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free the source blocks after Done: %v", err)
	}
	if rh == nil {
		return
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
