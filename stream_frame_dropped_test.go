//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// TestSessionDroppedResultFailsPromptly: a TxSession panics twice running
// its stream's SUCCESS Result (SendFrame): the run again panics too, and
// the frame is dropped — it never reached the stream, so it never left.
// Before, nothing said so: the restart's TxPanic failed nothing (every
// Result was handed over), no report that the Result left (TxSent) ever
// came, and the context side decided only at its deadline. Now the
// dropped frame is stepped as a Result that did not leave (TxSent with an
// error): the request fails at once (ErrFrameUnsent), the stream ends
// without a frame, and every source pin is dropped at Done. The generation
// side, which got no Result, ends at its deadline or, here, its Cancel.
func TestSessionDroppedResultFailsPromptly(t *testing.T) {
	l := smallLayout()
	// No deadline ends either side in the test's time: only the fix
	// decides the context side.
	ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = time.Hour })
	var hits atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		f, ok := e.(actors.SendFrame)
		if !ok || side != "tx" || !f.FromStream {
			return false
		}
		r, ok := f.Frame.(*messages.Result)
		return ok && r.Status == messages.StatusSuccess && hits.Add(1) <= 2
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	rx, tx := receiveAndSend(t, ce, ge, "dropped", 3)
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its Result was dropped (%d panics): it waits for its deadline", hits.Load())
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d panics running the Result, want 2: the test proves nothing", n)
	}
	if o.OK || !errors.Is(o.Err, actors.ErrFrameUnsent) {
		t.Fatalf("tx %s (%v): want FAILED, the Result unsent", o.Status, o.Err)
	}
	for g, st := range ce.Pools().Stats() {
		if st.Pinned != 0 {
			t.Fatalf("group %d: %d blocks pinned after Done", g, st.Pinned)
		}
	}
	// The generation side got no Result: its caller gives up on it.
	rx.Cancel()
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx %s: want it failed (no Result came)", ro.Status)
	}
	select {
	case <-rx.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx never released")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// TestSessionDroppedSubmitStillDrains: a TxSession panics twice running a
// stream's Submit (its run again panics too): the Submit is dropped. It
// never reached the stream, so no worker ever got the op and nothing
// would ever report it. Before, the op stayed SUBMITTING for good: the
// session never drained, its source pins held, Done never came. Now the
// dropped Submit is stepped as an op its worker refused (never posted):
// NOT_SUBMITTED, quiescent. The request has failed (the panic), both
// sides end, every pin is dropped at Done, and Close is clean.
//
// behind: the stream is open (its first chunk's op went) when the
// dropped Submit comes first in a batch (the fence of the chunk ahead of
// two fired ones fires last). The restarts stopped the stream; the
// Submits after the dropped one spawn it again with the step's ops in
// flight as its account — which must not count the dropped op: no
// report would ever settle it, and the stream would hold its terminal
// frame, and the session's release, for good.
func TestSessionDroppedSubmitStillDrains(t *testing.T) {
	for _, mode := range []string{"one", "behind"} {
		t.Run(mode, func(t *testing.T) { testDroppedSubmit(t, mode == "behind") })
	}
}

func testDroppedSubmit(t *testing.T, behind bool) {
	l := smallLayout()
	ce, ge := faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.TransferTimeout = time.Hour })
	var hits atomic.Int32
	var first atomic.Bool // the first op's Submit ran
	drop := 0             // the op whose Submit panics twice
	if behind {
		drop = 1
	}
	hook := func(side string, e actors.Effect) bool {
		s, ok := e.(actors.Submit)
		if !ok || side != "tx" {
			return false
		}
		if s.Op.Seq == 0 {
			first.Store(true)
		}
		return s.Op.Seq == drop && hits.Add(1) <= 2
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	var rx *kvxfer.RxHandle
	var tx *kvxfer.TxHandle
	if behind {
		var err error
		if rx, err = ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "dropsub", PromptLen: 64, Context: "ctx"}); err != nil {
			t.Fatal(err)
		}
		if tx, err = ce.Send(context.Background(), kvxfer.SendRequest{ID: "dropsub", PromptLen: 64}); err != nil {
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
		chunks, err := kvcache.Chunks(64, l.TokensPerBlock, l.TokensPerBlock)
		if err != nil {
			t.Fatal(err)
		}
		if len(chunks) < 3 {
			t.Fatalf("%d chunks: the test needs 3", len(chunks))
		}
		fences := make([]*kvxfer.ManualFence, len(chunks))
		for i, ch := range chunks {
			fences[i] = &kvxfer.ManualFence{}
			if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), fences[i]); err != nil {
				t.Fatal(err)
			}
			b0, b1 := ch.Blocks(l.TokensPerBlock)
			for g := range l.Groups {
				for b := b0; b < b1; b++ {
					fill(ce, l, g, src[g][b], b, 3)
				}
			}
		}
		fences[0].Fire(nil)
		waitUntil(t, "the first op's Submit (the stream open)", first.Load)
		// Those behind the second chunk first: its fence lets them all go
		// in one batch, the second chunk's op first.
		for i := 2; i < len(fences); i++ {
			fences[i].Fire(nil)
		}
		fences[1].Fire(nil)
	} else {
		rx, tx = receiveAndSend(t, ce, ge, "dropsub", 3)
	}
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its Submit was dropped (%d panics): the session never drains", hits.Load())
	}
	if n := hits.Load(); n < 2 {
		t.Fatalf("%d panics running a Submit, want 2: the test proves nothing", n)
	}
	if o.OK || !errors.Is(o.Err, actors.ErrSessionCrashed) {
		t.Fatalf("tx %s (%v): want FAILED by the panic", o.Status, o.Err)
	}
	for g, st := range ce.Pools().Stats() {
		if st.Pinned != 0 {
			t.Fatalf("group %d: %d blocks pinned after Done", g, st.Pinned)
		}
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx %s: want it failed", ro.Status)
	}
	select {
	case <-rx.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx never released")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// TestSessionDroppedEndStreamStillReleases: as
// TestUnprovenCloseWithSourcesReleased (a cut write whose close proves its
// sources released but not its write over: the stream ends without a
// terminal frame, EndStream), but the session has spent its restart
// budget (three crashes while the write hangs, before its deadline) and
// then panics twice running that EndStream: resumed, not restarted, its
// stream child lives on, and the EndStream dropped never reached it.
// Before, the stream never stopped, and the session's release (its
// source unpins, Finish) waited for it for good: Done never came. Now a
// dropped EndStream is handed to the stream anyway (it touches no page
// and no peer, and the stream still stops only once its own count of ops
// unsettled is empty): the context side releases.
func TestSessionDroppedEndStreamStillReleases(t *testing.T) {
	l := smallLayout()
	var hits atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		_, ok := e.(actors.EndStream)
		return ok && side == "tx" && hits.Add(1) <= 2
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	var hung atomic.Bool
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.WithUnprovenClose(), faulty.WithSourcesReleased(),
		faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	gag := loopback.New(loopback.WithNetwork(net))
	defer func() { _, _ = ag.Close(), gag.Close() }()
	clk := actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))
	ce, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: ag, TransferTimeout: time.Hour, DrainGrace: 50 * time.Millisecond, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ge, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: gag, TransferTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rx, tx, src := sendCut(t, ce, ge, l, "cut", time.Second) // (the context side's deadline on the fake clock)
	waitUntil(t, "the write to hang", hung.Load)
	for range 3 {
		tx.Crash()
	}
	waitUntil(t, "three restarts", func() bool { return ce.Stats().SessionPanics == 3 })
	// The deadline puts the hung op in doubt; the drain closes its
	// endpoint: sources released, the write not proven over.
	waitUntil(t, "the endpoint's unproven close", func() bool {
		clk.Advance(10 * time.Millisecond)
		return ce.Stats().ClosesUnproven == 1
	})
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its EndStream was dropped (%d panics): its stream never stopped", hits.Load())
	}
	if o.OK || !errors.Is(o.Err, actors.ErrSessionCrashed) {
		t.Fatalf("tx %s (%v): want FAILED by the crash", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("the source blocks after Done: %v", err)
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d panics running the EndStream, want 2: the test proves nothing", n)
	}
	if n := ce.Stats().SessionPanicsPastBudget; n != 2 {
		t.Fatalf("%d panics past the budget, want 2 (the EndStream's)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Errorf("context engine Close: %v", err)
	}
	rx.Cancel() // its pages stay quarantined: no frame said the write is over
	if err := ge.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Errorf("generation engine Close: %v, want ErrUndrained (its pages are quarantined)", err)
	}
}

// TestStreamDroppedEndStreamStillReleases: as
// TestEndpointErrorWithSourcesReleased (a cut write whose close proves its
// sources released but not its write over: the stream ends without a
// terminal frame, EndStream), but the peer stream panics twice taking that
// EndStream and drops it. Before, the stream lived on without its end and
// never stopped: the session's release (its source unpins, Finish) waited
// for it for good, and Done never came. Now a stream that drops its end
// still ends (it touches no page and no peer, and stops only once its own
// count of ops unsettled is empty): the context side releases.
func TestStreamDroppedEndStreamStillReleases(t *testing.T) {
	l := smallLayout()
	var hits atomic.Int32
	hook := func(e actors.Effect) bool {
		_, ok := e.(actors.EndStream)
		return ok && hits.Add(1) <= 2
	}
	actors.PanicOnStream.Store(&hook)
	t.Cleanup(func() { actors.PanicOnStream.Store(nil) })
	var cut atomic.Bool
	ce, ge, closeAgents := unprovenPair(t, l, filepath.Join(t.TempDir(), "ctx.jsonl"), faulty.WithSourcesReleased(),
		faulty.Cut(func(uint64, *rand.Rand) bool { return cut.CompareAndSwap(false, true) }))
	defer closeAgents()
	_, tx, src := sendCut(t, ce, ge, l, "lost", 30*time.Second)
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its stream dropped its EndStream (%d panics): the stream never stopped", hits.Load())
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d panics taking the EndStream, want 2: the test proves nothing", n)
	}
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerFailed) {
		t.Fatalf("tx %s (%v): want FAILED, the peer's endpoint lost", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("the source blocks after Done: %v", err)
	}
	if n := ce.Stats().StreamViolations; n != 0 {
		t.Fatalf("%d stream violations", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Errorf("context engine Close: %v", err)
	}
	if err := ge.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Errorf("generation engine Close: %v, want ErrUndrained (its pages are quarantined)", err)
	}
}
