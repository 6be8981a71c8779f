//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// stepPanicOn makes the side ("tx" or "rx") session of request id panic
// inside its step as it takes a message of type typ (as %T names it), at
// most times times (actors.PanicOnStep); it returns the count of panics
// injected.
func stepPanicOn(t *testing.T, side, id, typ string, times int32) *atomic.Int32 {
	t.Helper()
	var n atomic.Int32
	hook := func(s string, m any) bool {
		if s != side || fmt.Sprintf("%T", m) != typ || stepRequest(m) != id {
			return false
		}
		for {
			k := n.Load()
			if k >= times {
				return false
			}
			if n.CompareAndSwap(k, k+1) {
				return true
			}
		}
	}
	actors.PanicOnStep.Store(&hook)
	t.Cleanup(func() { actors.PanicOnStep.Store(nil) })
	return &n
}

// stepRequest is the request of a worker's report or a writer's frame
// ("" for other messages).
func stepRequest(m any) string {
	switch m := m.(type) {
	case actors.TxCompleted:
		return m.Op.Request
	case actors.RxFrame:
		return m.Frame.Request()
	case actors.TxChunk:
		return "a" // the only request TestStepPanicOnAChunkReleasesItsPins sends
	}
	return ""
}

// startHeld opens request id on both engines (64 tokens of smallLayout)
// with its first chunk, two blocks per group, held by an unfired fence.
func startHeld(t *testing.T, ce, ge *kvxfer.Engine, id string) (*kvxfer.RxHandle, *kvxfer.TxHandle, [][]kvcache.BlockID, *kvxfer.ManualFence) {
	t.Helper()
	l := smallLayout()
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	f := &kvxfer.ManualFence{}
	c0 := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0, Last: false}
	if err := tx.Chunk(c0, []kvcache.BlockRun{{First: 0, IDs: src[0][:2]}, {First: 0, IDs: src[1][:2]}}, f); err != nil {
		t.Fatal(err)
	}
	return rx, tx, src, f
}

// wantCrashNamed requires err to be a session crash that names where the
// panic came and its value.
func wantCrashNamed(t *testing.T, who string, err error, where string) {
	t.Helper()
	if !errors.Is(err, actors.ErrSessionCrashed) || !strings.Contains(err.Error(), where+": ") ||
		!strings.Contains(err.Error(), "panic injected in a step") {
		t.Fatalf("%s: %v, want a session crash naming %q and the panic", who, err, where)
	}
}

// TestStepPanicOnAWorkerReportFailsAtOnceAndDrains: the context session of
// request a panics inside its step as it takes its op's completion, the
// worker's only report of it. Before, that report was lost with the
// panic: the request failed ("restarted after panic", the panic not
// named), but its op stayed SUBMITTED for good — no terminal frame left
// for the generation side, which waited for its deadline; the session
// never drained, not even after its own deadline (closing the endpoint
// retired nothing: the worker had settled the op); Done never came, and
// Close reported it undrained. Now the request fails at once with an
// error naming the panic and the message, the lost report is stepped
// again (a completion proves the op over), the generation side learns of
// the failure from the writer's Result — not from its deadline — and
// releases its blocks on that proof, and Done comes with every pin
// dropped. Request b, live on the same engines all along, ends READY
// with every byte.
func TestStepPanicOnAWorkerReportFailsAtOnceAndDrains(t *testing.T) {
	l := smallLayout()
	ce, ge, c, rxB, txB, srcB, fB := heldChunk(t, "b")
	hits := stepPanicOn(t, "tx", "a", "core.TxCompleted", 1)
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, ce, tx, l, 64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "request a to fail", func() bool { return tx.Err() != nil })
	wantCrashNamed(t, "tx a's Err", tx.Err(), "panicked stepping core.TxCompleted")

	o := waitOutcome(t, tx.Done())
	if o.OK {
		t.Fatalf("tx a %s, want the request failed by the panic", o.Status)
	}
	wantCrashNamed(t, "tx a's outcome", o.Err, "panicked stepping core.TxCompleted")
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free a's source blocks after Done: %v", err)
	}
	ro := waitOutcome(t, rx.Done())
	if ro.OK || !errors.Is(ro.Err, kvxfer.ErrPeerFailed) || !strings.Contains(ro.Err.Error(), "panicked stepping core.TxCompleted") {
		t.Fatalf("rx a %s %v, want the writer's failure naming the panic (not its deadline)", ro.Status, ro.Err)
	}
	select {
	case <-rx.Released():
	case <-time.After(10 * time.Second):
		t.Fatal("rx a never released its blocks: the writer's Result proved it over")
	}
	if got := hits.Load(); got != 1 {
		t.Fatalf("%d panics injected, want 1", got)
	}
	if got := ce.Stats().SessionPanics; got != 1 {
		t.Fatalf("session restarts %d, want 1", got)
	}

	ob := finishHeld(t, ce, ge, rxB, txB, srcB, fB, 9, "after request a's session panicked")
	if err := ge.FreeBlocks(ob.Blocks); err != nil {
		t.Fatal(err)
	}
	if err := ce.Pools().Free(srcB); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}

// TestStepPanicTwiceOnAWorkerReportQuarantines: the lost completion
// panics the step again when it is stepped again: it is dropped for good,
// and what it would have proved stays unproven. Request a has failed at
// once, naming the panic; its source blocks stay pinned (a Free is
// refused, Done does not come); the generation side gets no terminal
// frame, fails at its own deadline and quarantines its blocks (not
// freed, not released); Close reports both sides undrained. Request b,
// live on the same engines, ends READY with every byte.
func TestStepPanicTwiceOnAWorkerReportQuarantines(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	cag := loopback.New(loopback.WithNetwork(net))
	gag := loopback.New(loopback.WithNetwork(net))
	ce, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: cag, TransferTimeout: 30 * time.Second, DrainGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ge, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: gag, TransferTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = cag.Close(), gag.Close() }()
	rxB, txB, srcB, fB := startHeld(t, ce, ge, "b")
	hits := stepPanicOn(t, "tx", "a", "core.TxCompleted", 2)

	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: 64, Context: "ctx", Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, ce, tx, l, 64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "request a to fail", func() bool { return tx.Err() != nil })
	wantCrashNamed(t, "tx a's Err", tx.Err(), "panicked stepping core.TxCompleted")
	waitUntil(t, "the lost report's second panic", func() bool { return ce.Stats().SessionPanics == 2 })

	ro := waitOutcome(t, rx.Done())
	if ro.OK || !errors.Is(ro.Err, kvxfer.ErrTimeout) {
		t.Fatalf("rx a %s %v, want its deadline: the writer gave no proof", ro.Status, ro.Err)
	}
	waitUntil(t, "rx a's blocks quarantined", func() bool { return ge.Stats().QuarantinedBytes > 0 })
	select {
	case <-rx.Released():
		t.Fatal("rx a released its blocks with no proof from the writer")
	default:
	}
	select {
	case o := <-tx.Done():
		t.Fatalf("tx a Done (%s %v) with its op unproven: its pins were dropped", o.Status, o.Err)
	default:
	}
	if err := ce.Pools().Free(src); err == nil {
		t.Fatal("a's source blocks were freed while its op is unproven")
	}
	if got := hits.Load(); got != 2 {
		t.Fatalf("%d panics injected, want 2 (the step, its one retry)", got)
	}

	ob := finishHeld(t, ce, ge, rxB, txB, srcB, fB, 9, "after request a's report was lost")
	if err := ge.FreeBlocks(ob.Blocks); err != nil {
		t.Fatal(err)
	}
	if err := ce.Pools().Free(srcB); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := ce.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Errorf("context engine Close: %v, want ErrUndrained (request a's op is unproven)", err)
	}
	if err := ge.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Errorf("generation engine Close: %v, want ErrUndrained (request a's blocks are quarantined)", err)
	}
}

// TestStepPanicOnAWritersResultFailsAndReleasesOnIt: the generation
// session panics inside its step as it takes its writer's Result. The
// request fails at once with an error naming the panic and the message;
// its blocks are quarantined, and the Result, stepped again, is the
// writer's proof: they are released. The writer ends as its peer let it.
func TestStepPanicOnAWritersResultFailsAndReleasesOnIt(t *testing.T) {
	l := smallLayout()
	ce, ge := faultyPair(t, l)
	hits := stepPanicOn(t, "rx", "a", "core.RxFrame", 1)
	rx, tx := receiveAndSend(t, ce, ge, "a", 2)
	ro := waitOutcome(t, rx.Done())
	if ro.OK {
		t.Fatalf("rx a %s, want the request failed by the panic", ro.Status)
	}
	wantCrashNamed(t, "rx a's outcome", ro.Err, "panicked stepping core.RxFrame")
	select {
	case <-rx.Released():
	case <-time.After(10 * time.Second):
		t.Fatal("rx a never released its blocks: the writer's Result proved it over")
	}
	// The writer ends DONE, or CANCELLED when the failed request's Cancel
	// reached it before its Result's report (TxSent).
	if o := waitOutcome(t, tx.Done()); !o.OK && !errors.Is(o.Err, kvxfer.ErrPeerCancelled) {
		t.Fatalf("tx a %s %v, want DONE or cancelled by its peer", o.Status, o.Err)
	}
	waitUntil(t, "no block quarantined", func() bool { return ge.Stats().QuarantinedBytes == 0 })
	if got := hits.Load(); got != 1 {
		t.Fatalf("%d panics injected, want 1", got)
	}
}

// TestStepPanicOnAChunkReleasesItsPins: the context session panics inside
// its step as it takes a chunk the handle pinned. The chunk is not
// stepped again (the session did not take it: the shell released its
// pins); the request fails at once naming the panic, Done comes with
// every pin dropped, and the generation side fails and releases.
func TestStepPanicOnAChunkReleasesItsPins(t *testing.T) {
	l := smallLayout()
	ce, ge := faultyPair(t, l)
	hits := stepPanicOn(t, "tx", "a", "core.TxChunk", 1)
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, ce, tx, l, 64, 64, 1)
	if err != nil && !errors.Is(err, kvxfer.ErrRequestFailed) {
		t.Fatal(err)
	}
	o := waitOutcome(t, tx.Done())
	if o.OK {
		t.Fatalf("tx a %s, want the request failed by the panic", o.Status)
	}
	wantCrashNamed(t, "tx a's outcome", o.Err, "panicked stepping core.TxChunk")
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free a's source blocks after Done: %v", err)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx a %s, want the writer's failure", ro.Status)
	}
	select {
	case <-rx.Released():
	case <-time.After(10 * time.Second):
		t.Fatal("rx a never released its blocks")
	}
	if got := hits.Load(); got != 1 {
		t.Fatalf("%d panics injected, want 1", got)
	}
}

// TestStepPanicOnAPeerRequestReplays: the context session panics inside
// its step as it takes a generation rank's RequestData (TxPeerRequest),
// and the shell steps it again after the restart. The trace must still
// replay: the re-stepped TxPeerRequest is recorded with the Hello and
// RequestData that built its route, as the first one was, so that replay
// can rebuild the route. Before, the re-step was recorded without them
// and replay diverged on it ("resolve inputs: a Hello and RequestData,
// none recorded").
func TestStepPanicOnAPeerRequestReplays(t *testing.T) {
	l := smallLayout()
	dir := t.TempDir()
	c := startTracedCluster(t, l, tp1, tp1, dir)
	// TxPeerRequest names no request; "a" is the only one on the cluster.
	hits := stepPanicOn(t, "tx", "", "core.TxPeerRequest", 1)
	// Send first: a RequestData that came first would open the session
	// (and panic it) before Send, which would then be refused.
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, c.ctx[0], tx, l, 64, 64, 1)
	if err != nil && !errors.Is(err, kvxfer.ErrRequestFailed) {
		t.Fatal(err)
	}
	o := waitOutcome(t, tx.Done())
	if o.OK {
		t.Fatalf("tx a %s, want the request failed by the panic", o.Status)
	}
	wantCrashNamed(t, "tx a's outcome", o.Err, "panicked stepping core.TxPeerRequest")
	if err := c.ctx[0].Pools().Free(src); err != nil {
		t.Fatalf("free a's source blocks after Done: %v", err)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx a %s, want the writer's failure", ro.Status)
	}
	select {
	case <-rx.Released():
	case <-time.After(10 * time.Second):
		t.Fatal("rx a never released its blocks")
	}
	if got := hits.Load(); got != 1 {
		t.Fatalf("%d panics injected, want 1", got)
	}
	closeAll(t, c)
	replayAndExport(t, dir)
}

// afterChunkTracer is a Tracer whose sessions panic once, after the step
// that took a chunk returned (its Stepped, with a WatchFence among the
// effects): as a panic inside the step once it has taken the chunk (a
// bug in planning it for a stream, admit) does, it loses the chunk's
// effects.
type afterChunkTracer struct{ hit atomic.Int32 }

func (*afterChunkTracer) Record(string, any, time.Time) {}
func (*afterChunkTracer) Engine(actors.EngineInfo)      {}
func (tr *afterChunkTracer) Session(string, actors.Birth) actors.SessionTracer {
	return afterChunkSession{tr}
}

type afterChunkSession struct{ tr *afterChunkTracer }

func (afterChunkSession) Record(any, time.Time)                           {}
func (afterChunkSession) Resolved(*messages.Hello, *messages.RequestData) {}
func (s afterChunkSession) Stepped(session any, eff []actors.Effect) {
	if _, tx := session.(*actors.TxSession); !tx {
		return
	}
	for _, e := range eff {
		if _, ok := e.(actors.WatchFence); ok && s.tr.hit.CompareAndSwap(0, 1) {
			panic("tracer: panic injected after a chunk's step")
		}
	}
}

// TestStepPanicAfterAChunkWasTakenDrains: the context session panics in
// its step after the step took a chunk (its pins are the session's now)
// but before the chunk's effects ran: its WatchFence is lost with them.
// The chunk is not stepped again (it would be taken twice), but its fence
// must still be watched: until it fires, the chunk's ops may read its
// pages, and the session never drains without it. The request fails
// naming the panic, Done comes with every pin dropped, and the
// generation side fails and releases. Before, the fence was never
// watched: the chunk stayed pinned and unfired for good, Done never came.
func TestStepPanicAfterAChunkWasTakenDrains(t *testing.T) {
	l := smallLayout()
	tr := &afterChunkTracer{}
	ce, ge := faultyPairWith(t, l, 1, func(inst string, cfg *kvxfer.Config) {
		if inst == "ctx" {
			cfg.Recorder = tr
		}
	})
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, ce, tx, l, 64, 64, 1)
	if err != nil && !errors.Is(err, kvxfer.ErrRequestFailed) {
		t.Fatal(err)
	}
	o := waitOutcome(t, tx.Done())
	if o.OK {
		t.Fatalf("tx a %s, want the request failed by the panic", o.Status)
	}
	if !errors.Is(o.Err, actors.ErrSessionCrashed) || !strings.Contains(o.Err.Error(), "panicked stepping core.TxChunk: tracer: panic injected") {
		t.Fatalf("tx a's outcome: %v, want a session crash naming the chunk and the panic", o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free a's source blocks after Done: %v", err)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx a %s, want the writer's failure", ro.Status)
	}
	select {
	case <-rx.Released():
	case <-time.After(10 * time.Second):
		t.Fatal("rx a never released its blocks")
	}
	if got := tr.hit.Load(); got != 1 {
		t.Fatalf("%d panics injected, want 1", got)
	}
}
