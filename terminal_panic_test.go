//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// afterEffectTracer is a Tracer whose sessions of one side ("tx" or "rx")
// panic once, after the first step that returned an effect match accepts
// (in its Stepped): as a panic inside the step once it has emitted that
// effect does, it loses the step's effects while the step's changes to
// the session (a terminal outcome, a stream finished, the release) stay.
type afterEffectTracer struct {
	side  string
	match func(actors.Effect) bool
	hit   atomic.Int32
}

func (*afterEffectTracer) Record(string, any, time.Time) {}
func (*afterEffectTracer) Engine(actors.EngineInfo)      {}
func (tr *afterEffectTracer) Session(string, actors.Birth) actors.SessionTracer {
	return afterEffectSession{tr}
}

type afterEffectSession struct{ tr *afterEffectTracer }

func (afterEffectSession) Record(any, time.Time)                           {}
func (afterEffectSession) Resolved(*messages.Hello, *messages.RequestData) {}
func (s afterEffectSession) Stepped(session any, eff []actors.Effect) {
	switch session.(type) {
	case *actors.TxSession:
		if s.tr.side != "tx" {
			return
		}
	case *actors.RxSession:
		if s.tr.side != "rx" {
			return
		}
	}
	for _, e := range eff {
		if s.tr.match(e) && s.tr.hit.CompareAndSwap(0, 1) {
			panic("tracer: panic injected after a step")
		}
	}
}

// transferPanickingAfter runs request a (64 tokens in one chunk) between a
// context and a generation engine whose side tr.side traces with tr, and
// requires both sides to end (no hang: each Done within waitOutcome's
// deadline), the source blocks to free once the tx side is done (every
// pin dropped), the generation side's blocks released, and one panic
// injected. It returns both outcomes.
func transferPanickingAfter(t *testing.T, tr *afterEffectTracer) (tx, rx kvxfer.Outcome) {
	t.Helper()
	l := smallLayout()
	inst := "ctx"
	if tr.side == "rx" {
		inst = "gen"
	}
	ce, ge := faultyPairWith(t, l, 1, func(i string, cfg *kvxfer.Config) {
		if i == inst {
			cfg.Recorder = tr
		}
	})
	rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "a", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "a", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, ce, th, l, 64, 64, 1)
	if err != nil && !errors.Is(err, kvxfer.ErrRequestFailed) {
		t.Fatal(err)
	}
	tx = waitOutcome(t, th.Done())
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free a's source blocks after Done: %v", err)
	}
	rx = waitOutcome(t, rh.Done())
	select {
	case <-rh.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx a never released its blocks")
	}
	if got := tr.hit.Load(); got != 1 {
		t.Fatalf("%d panics injected, want 1", got)
	}
	return tx, rx
}

// TestStepPanicAfterTheTxReleaseFinishes: the context session panics after
// the step that released it (Unpin…, Finish, Stop) — after its outcome,
// as the session's state had it. Before, those effects were lost with the
// panic and nothing emitted them again: the session was stopped for its
// step, the restart's TxPanic changed nothing (the outcome was decided),
// so Done never came, the source blocks stayed pinned, and the session
// never stopped. Now the effects the step emitted before it panicked run
// after the restart: Done comes with every pin dropped.
func TestStepPanicAfterTheTxReleaseFinishes(t *testing.T) {
	tx, rx := transferPanickingAfter(t, &afterEffectTracer{side: "tx", match: func(e actors.Effect) bool {
		_, ok := e.(actors.Finish)
		return ok
	}})
	if tx.OK != rx.OK {
		t.Fatalf("tx a %s, rx a %s: the sides disagree", tx.Status, rx.Status)
	}
}

// TestStepPanicAfterATerminalFrameSendsIt: the context session panics
// after the step that emitted a stream's terminal frame (the writer's
// SUCCESS Result). Before, the frame was lost: the stream was finished for
// the step, so nothing sent it again; the generation side waited for its
// deadline and the context side never finished. Now the frame leaves
// after the restart, and the generation side ends READY on it.
func TestStepPanicAfterATerminalFrameSendsIt(t *testing.T) {
	_, rx := transferPanickingAfter(t, &afterEffectTracer{side: "tx", match: func(e actors.Effect) bool {
		f, ok := e.(actors.SendFrame)
		return ok && f.FromStream
	}})
	if !rx.OK {
		t.Fatalf("rx a %s (%v), want READY on the writer's Result", rx.Status, rx.Err)
	}
}

// TestStepPanicAfterASuccessResultBothSidesAgree: the context session
// panics after the step that handed the writer's SUCCESS Result to its
// stream (in the tracer, as a panic in the meter would). The Result
// leaves after the restart, so the generation side ends READY on it.
// Before, the restart's crash failed the context side before the
// worker's report that the Result left (TxSent) could decide DONE: the
// generation side READY, the context side FAILED. Now a panic after every
// stream's SUCCESS Result was handed over fails nothing: both sides end
// with success, every pin dropped.
func TestStepPanicAfterASuccessResultBothSidesAgree(t *testing.T) {
	tx, rx := transferPanickingAfter(t, &afterEffectTracer{side: "tx", match: func(e actors.Effect) bool {
		f, ok := e.(actors.SendFrame)
		r, result := f.Frame.(*messages.Result)
		return ok && f.FromStream && result && r.Status == messages.StatusSuccess
	}})
	if !rx.OK || !tx.OK {
		t.Fatalf("tx a %s (%v), rx a %s (%v): want DONE and READY, the Result having left", tx.Status, tx.Err, rx.Status, rx.Err)
	}
}

// TestStepPanicAfterRxReadyFinishes: the generation session panics after
// the step that made it READY (its Finish, its Stop). Before, both were
// lost: the session was READY and stopped for its step, RxPanic changed
// nothing, and Done never came. Now Done comes READY and the blocks are
// released.
func TestStepPanicAfterRxReadyFinishes(t *testing.T) {
	_, rx := transferPanickingAfter(t, &afterEffectTracer{side: "rx", match: func(e actors.Effect) bool {
		f, ok := e.(actors.Finish)
		return ok && f.Outcome.OK
	}})
	if !rx.OK {
		t.Fatalf("rx a %s (%v), want READY", rx.Status, rx.Err)
	}
}

// TestStepPanicOnTheRestartKeepsTheLostReport: the context session panics
// inside its step as it takes its op's completion (the worker's only
// report of it), then again inside the restart's own first step
// (TxPanic), before the completion was stepped again. Before, the second
// lost message took the first one's place silently: the completion was
// never stepped again, the op stayed SUBMITTED for good, no terminal
// frame left for the generation side, and Done never came. Now both are
// kept and stepped again in order: the request fails naming a panic, Done
// comes with every pin dropped, and the generation side fails on the
// writer's Result and releases its blocks on that proof.
func TestStepPanicOnTheRestartKeepsTheLostReport(t *testing.T) {
	l := smallLayout()
	var completion, restart atomic.Int32
	hook := func(side string, m any) bool {
		if side != "tx" {
			return false
		}
		switch m := m.(type) {
		case actors.TxCompleted:
			return m.Op.Request == "a" && completion.CompareAndSwap(0, 1)
		case actors.TxPanic:
			return restart.CompareAndSwap(0, 1)
		}
		return false
	}
	actors.PanicOnStep.Store(&hook)
	t.Cleanup(func() { actors.PanicOnStep.Store(nil) })
	ce, ge := faultyPairWith(t, l, 1, nil)
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
	if o.OK || !errors.Is(o.Err, actors.ErrSessionCrashed) {
		t.Fatalf("tx a %s %v, want the request failed by the panic", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free a's source blocks after Done: %v", err)
	}
	ro := waitOutcome(t, rx.Done())
	if ro.OK || !errors.Is(ro.Err, kvxfer.ErrPeerFailed) {
		t.Fatalf("rx a %s %v, want the writer's failure (not its deadline)", ro.Status, ro.Err)
	}
	select {
	case <-rx.Released():
	case <-time.After(30 * time.Second):
		t.Fatal("rx a never released its blocks: the writer's Result proved it over")
	}
	if completion.Load() != 1 || restart.Load() != 1 {
		t.Fatalf("panics injected: %d on the completion, %d on the restart; want 1 and 1", completion.Load(), restart.Load())
	}
}
