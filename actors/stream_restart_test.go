//go:build kvxfer_invariants

package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestStreamHeldFrameSurvivesSessionRestart: a peer stream holds its
// terminal frame (its own count has an op unsettled: here it dropped the
// worker's report after panicking on it twice, a stream-accounting
// violation) when its session restarts. The restart stops the stream.
// Before, the frame was lost with it: nothing sent it again (the step had
// finished the stream), the generation side waited for its deadline, and
// the session released its source pins although its stream still counted
// an op unsettled. Now the stream is spawned again over the state it
// held: the report that settles its count (here the same completion once
// more) lets the frame leave, the generation side ends READY on it, and
// the context side DONE.
func TestStreamHeldFrameSurvivesSessionRestart(t *testing.T) {
	const id, prompt = "held", 32
	ml := control.NewMemLink()
	ctxR := startTestRank(t, "ctx", ml)
	genR := startTestRank(t, "gen", ml)

	var settles atomic.Int32
	hook := func(e Effect) bool { return e == nil && settles.Add(1) <= 2 }
	PanicOnStream.Store(&hook)
	t.Cleanup(func() { PanicOnStream.Store(nil) })

	src, rx, tx := transfer(t, ctxR, genR, id, prompt, time.Minute)
	defer func() { _ = ctxR.e.FreeBlocks(src) }()
	stats := ctxR.e.env.stats
	pollUntil(t, "the stream to hold its frame", func() bool { return stats.StreamViolations.Load() == 1 })
	tx.Crash()
	pollUntil(t, "the session to restart", func() bool { return stats.SessionPanics.Load() == 1 })
	// The completion once more (a late duplicate: the step ignores it)
	// settles the stream's count.
	ctxR.e.sys.Root.Send(tx.pid, TxCompleted{Op: OpRef{Request: id, Peer: 0, Seq: 0}})
	if o := wait(t, "generation outcome", rx.Done()); !o.OK {
		t.Fatalf("generation side %s %v, want READY on the held Result", o.Status, o.Err)
	}
	if o := wait(t, "context outcome", tx.Done()); !o.OK {
		t.Fatalf("context side %s %v, want DONE", o.Status, o.Err)
	}
	wait(t, "generation blocks released", rx.Released())
	if n := settles.Load(); n != 3 {
		t.Fatalf("%d settles, want 3 (two panics, then the one that settled)", n)
	}
	if n := stats.StreamViolations.Load(); n != 1 {
		t.Fatalf("%d stream violations, want 1 (the held frame)", n)
	}
}

// pollUntil polls cond until it holds, failing the test if it does not
// within 10s (a bound on a bug, not a way of waiting).
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s", what)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

// TestStreamHeldFrameCloseStops: a stream spawned again over its held
// frame, whose count never settles (the report it dropped never comes
// again), holds the frame and its session's release for good — as it does
// without a restart — but Close still returns, naming the session
// undrained: a session that is stopping spawns no stream again (checked:
// spawning it there, Close never returned).
func TestStreamHeldFrameCloseStops(t *testing.T) {
	const id, prompt = "held", 32
	ml := control.NewMemLink()
	ctxR := startTestRank(t, "ctx", ml)
	genR := startTestRank(t, "gen", ml)
	var settles atomic.Int32
	hook := func(e Effect) bool { return e == nil && settles.Add(1) <= 2 }
	PanicOnStream.Store(&hook)
	t.Cleanup(func() { PanicOnStream.Store(nil) })
	_, _, tx := transfer(t, ctxR, genR, id, prompt, time.Minute)
	stats := ctxR.e.env.stats
	pollUntil(t, "the stream to hold its frame", func() bool { return stats.StreamViolations.Load() == 1 })
	tx.Crash()
	pollUntil(t, "the session to restart", func() bool { return stats.SessionPanics.Load() == 1 })
	// Both sides stay undrained: the context side's session holds its
	// release for its stream, the generation side waits for the frame.
	ctxR.undrainedOK, genR.undrainedOK = true, true
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		done <- ctxR.e.Close(ctx)
	}()
	if err := wait(t, "Close to return", done); !errors.Is(err, ErrUndrained) {
		t.Fatalf("Close: %v, want ErrUndrained (the held stream)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = genR.e.Close(ctx) // (its Receive waits for the frame)
}

// TestStreamPanicAfterItsFrameLeft: a peer stream panics right after it
// handed its SUCCESS Result to its worker, before that returned (the frame
// left). Its next incarnation finishes it again: the frame is sent once
// more (a duplicate: the peer drops it, the second report that it left
// changes nothing) and the stream stops. Before, the stream had already
// marked the frame sent and itself done: handled again, the frame counted
// as a second terminal frame (a stream violation, for no bug of the step),
// and — when the frame had been held for a settle — it was never sent
// again and the stream never stopped, holding its session's release.
func TestStreamPanicAfterItsFrameLeft(t *testing.T) {
	for _, held := range []bool{false, true} {
		t.Run(map[bool]string{false: "sent", true: "held"}[held], func(t *testing.T) { testPanicAfterFrameLeft(t, held) })
	}
}

func testPanicAfterFrameLeft(t *testing.T, held bool) {
	const id, prompt = "left", 32
	ml := control.NewMemLink()
	ctxR := startTestRank(t, "ctx", ml)
	genR := startTestRank(t, "gen", ml)

	var sent, settles atomic.Int32
	frameHook := func(f SendFrame) bool { return sent.Add(1) == 1 }
	PanicOnFrameSent.Store(&frameHook)
	t.Cleanup(func() { PanicOnFrameSent.Store(nil) })
	if held {
		// The stream drops the report of its op (two panics): it holds
		// its Result until the same completion comes once more.
		hook := func(e Effect) bool { return e == nil && settles.Add(1) <= 2 }
		PanicOnStream.Store(&hook)
		t.Cleanup(func() { PanicOnStream.Store(nil) })
	}

	src, rx, tx := transfer(t, ctxR, genR, id, prompt, time.Hour)
	stats := ctxR.e.env.stats
	violations := int64(0)
	if held {
		violations = 1 // the held frame
		pollUntil(t, "the stream to hold its frame", func() bool { return stats.StreamViolations.Load() == 1 })
		ctxR.e.sys.Root.Send(tx.pid, TxCompleted{Op: OpRef{Request: id, Peer: 0, Seq: 0}})
	}
	if o := wait(t, "context outcome", tx.Done()); !o.OK {
		t.Fatalf("context side %s %v, want DONE", o.Status, o.Err)
	}
	if err := ctxR.e.FreeBlocks(src); err != nil {
		t.Fatalf("source blocks after Done: %v", err)
	}
	if o := wait(t, "generation outcome", rx.Done()); !o.OK {
		t.Fatalf("generation side %s %v, want READY", o.Status, o.Err)
	}
	wait(t, "generation blocks released", rx.Released())
	if n := sent.Load(); n != 2 {
		t.Fatalf("the frame handed over %d times, want 2 (the panic, then once more)", n)
	}
	if n := stats.StreamViolations.Load(); n != violations {
		t.Fatalf("%d stream violations, want %d", n, violations)
	}
}

// TestStreamLostReportForwardedAgainAtRestep: a peer stream holds its
// SUCCESS Result (it dropped its op's completion after panicking on it
// twice: its count keeps the op unsettled). The same completion comes
// once more; the stream drops it again (two more panics) and the
// session's step panics on it: lost, it is stepped again after the
// restart. Before, only the step got it again (a duplicate there: it
// changes nothing); the stream, spawned again over its held frame, never
// got the report that settles its count, so the frame was never sent and
// the session never released. Now the report is forwarded to the stream
// again before it is stepped again (a settle is idempotent): the frame
// leaves, the generation side ends READY on it, the context side DONE.
func TestStreamLostReportForwardedAgainAtRestep(t *testing.T) {
	const id, prompt = "relost", 32
	ml := control.NewMemLink()
	ctxR := startTestRank(t, "ctx", ml)
	genR := startTestRank(t, "gen", ml)

	var settles, steps atomic.Int32
	streamHook := func(e Effect) bool { return e == nil && settles.Add(1) <= 4 }
	PanicOnStream.Store(&streamHook)
	t.Cleanup(func() { PanicOnStream.Store(nil) })
	stepHook := func(side string, m any) bool {
		_, ok := m.(TxCompleted)
		return side == "tx" && ok && steps.Add(1) == 2
	}
	PanicOnStep.Store(&stepHook)
	t.Cleanup(func() { PanicOnStep.Store(nil) })

	src, rx, tx := transfer(t, ctxR, genR, id, prompt, time.Hour)
	stats := ctxR.e.env.stats
	pollUntil(t, "the stream to hold its frame", func() bool { return stats.StreamViolations.Load() == 1 })
	// The completion once more (a late duplicate): lost by the stream and
	// by the step.
	ctxR.e.sys.Root.Send(tx.pid, TxCompleted{Op: OpRef{Request: id, Peer: 0, Seq: 0}})
	if o := wait(t, "generation outcome", rx.Done()); !o.OK {
		t.Fatalf("generation side %s %v, want READY on the held Result", o.Status, o.Err)
	}
	if o := wait(t, "context outcome", tx.Done()); !o.OK {
		t.Fatalf("context side %s %v, want DONE", o.Status, o.Err)
	}
	if err := ctxR.e.FreeBlocks(src); err != nil {
		t.Fatalf("source blocks after Done: %v", err)
	}
	wait(t, "generation blocks released", rx.Released())
	if s, n := settles.Load(), steps.Load(); s != 5 || n != 3 {
		t.Fatalf("%d settles, %d steps of TxCompleted: want 5 (four panics, then the one that settled) and 3", s, n)
	}
	if n := stats.StreamViolations.Load(); n != 1 {
		t.Fatalf("%d stream violations, want 1 (the held frame)", n)
	}
}

// TestStreamDroppedFrameEndsRequest: a peer stream panics twice on its
// SUCCESS Result and drops it after the second panic. "take": both panics
// come as it takes the frame, before it holds it; "send": both come as it
// hands the held frame to its worker (its next incarnation finishes
// again, and panics again). Before, the stream stayed alive without
// sending the frame again and never stopped: no report that the Result
// left came, and the session's release (source unpins, Finish) waited for
// the stream for good. Now the dropped frame is reported as one that did
// not leave (TxSent with an error) and the stream ends without it,
// stopping once its own count of ops unsettled is empty: the context side
// ends at once — FAILED with ErrFrameUnsent ("send": or DONE, when the
// worker's report that the frame left comes first), its sources freeable
// at Done.
func TestStreamDroppedFrameEndsRequest(t *testing.T) {
	for _, mode := range []string{"take", "send"} {
		t.Run(mode, func(t *testing.T) { testStreamDroppedFrame(t, mode == "send") })
	}
}

func testStreamDroppedFrame(t *testing.T, send bool) {
	const id, prompt = "dropframe", 32
	ml := control.NewMemLink()
	ctxR := startTestRank(t, "ctx", ml)
	genR := startTestRank(t, "gen", ml)

	var hits atomic.Int32
	success := func(f SendFrame) bool {
		r, ok := f.Frame.(*messages.Result)
		return ok && r.Status == messages.StatusSuccess
	}
	if send {
		hook := func(f SendFrame) bool { return success(f) && hits.Add(1) <= 2 }
		PanicOnFrameSent.Store(&hook)
		t.Cleanup(func() { PanicOnFrameSent.Store(nil) })
	} else {
		hook := func(e Effect) bool { f, ok := e.(SendFrame); return ok && success(f) && hits.Add(1) <= 2 }
		PanicOnStream.Store(&hook)
		t.Cleanup(func() { PanicOnStream.Store(nil) })
	}

	src, rx, tx := transfer(t, ctxR, genR, id, prompt, time.Hour)
	o := wait(t, "context outcome", tx.Done())
	t.Logf("context side %s %v", o.Status, o.Err)
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d panics on the Result, want 2: the test proves nothing", n)
	}
	if !(send && o.OK) && (o.OK || !errors.Is(o.Err, ErrFrameUnsent)) {
		t.Fatalf("context side %s %v, want FAILED, the Result unsent", o.Status, o.Err)
	}
	if err := ctxR.e.FreeBlocks(src); err != nil {
		t.Fatalf("source blocks after Done: %v", err)
	}
	if !send {
		// The generation side got no Result: its caller gives up on it.
		rx.Cancel()
	}
	wait(t, "generation outcome", rx.Done())
	wait(t, "generation blocks released", rx.Released())
	if n := ctxR.e.env.stats.StreamViolations.Load(); n != 0 {
		t.Fatalf("%d stream violations, want none", n)
	}
}

// TestStreamDroppedSubmitStillDrains: a peer stream panics twice taking a
// Submit, before handing it to its worker, and drops it: no worker ever
// got the op, and nothing would report it. Before, the op stayed
// SUBMITTING for good, past the deadline too: the session never drained,
// its source pins held, Done never came. Now the stream reports the
// dropped op as one its worker refused (never posted): NOT_SUBMITTED,
// quiescent. The request fails, both sides end (the generation side on
// the FAILED Result), and the sources are freeable at Done.
func TestStreamDroppedSubmitStillDrains(t *testing.T) {
	const id, prompt = "dropsub", 32
	ml := control.NewMemLink()
	ctxR := startTestRank(t, "ctx", ml)
	genR := startTestRank(t, "gen", ml)
	var hits atomic.Int32
	hook := func(e Effect) bool { _, ok := e.(Submit); return ok && hits.Add(1) <= 2 }
	PanicOnStream.Store(&hook)
	t.Cleanup(func() { PanicOnStream.Store(nil) })

	src, rx, tx := transfer(t, ctxR, genR, id, prompt, time.Hour)
	o := wait(t, "context outcome", tx.Done())
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d panics on a Submit, want 2: the test proves nothing", n)
	}
	if o.OK || !errors.Is(o.Err, ErrSessionCrashed) {
		t.Fatalf("context side %s %v, want FAILED by the dropped op", o.Status, o.Err)
	}
	if err := ctxR.e.FreeBlocks(src); err != nil {
		t.Fatalf("source blocks after Done: %v", err)
	}
	if ro := wait(t, "generation outcome", rx.Done()); ro.OK {
		t.Fatalf("generation side %s, want it failed", ro.Status)
	}
	wait(t, "generation blocks released", rx.Released())
	if n := ctxR.e.env.stats.StreamViolations.Load(); n != 0 {
		t.Fatalf("%d stream violations, want none", n)
	}
}

// transfer allocates the source blocks of a prompt of one group on ctxR,
// opens its Receive on genR and its Send on ctxR (each with a deadline d
// from now), and hands every chunk of it over, its KV already written.
func transfer(t *testing.T, ctxR, genR *testRank, id string, prompt int, d time.Duration) ([][]kvcache.BlockID, *RxHandle, *TxHandle) {
	t.Helper()
	tpb := cancelOrderLayout.TokensPerBlock
	src, err := ctxR.e.Pools().Alloc([]int{prompt / tpb})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := genR.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
		ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(d)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ctxR.e.Send(TxRequest{ID: id, PromptLen: prompt, Deadline: time.Now().Add(d)})
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(prompt, prompt, tpb)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks {
		if err := tx.Chunk(c, c.Runs(tpb, src), FiredFence{}); err != nil {
			t.Fatal(err)
		}
	}
	return src, rx, tx
}
