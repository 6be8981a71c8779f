//go:build kvxfer_invariants

package actors

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/messages"
)

// Crash injection, only in builds with the kvxfer_invariants tag.

// WorkerCrash makes a worker panic (crash injection).
type WorkerCrash = workerCrash

// Crash makes the session panic (crash injection): its supervisor restarts
// it, the request fails, and it still drains before it releases.
func (h *TxHandle) Crash() {
	if h.pid != nil {
		h.e.sys.Root.Send(h.pid, &panicNow{})
	}
}

// CrashWorker makes worker i panic (crash injection).
func (e *Engine) CrashWorker(i int) { e.sys.Root.Send(e.env.workers[i], workerCrash{}) }

// CrashParent makes the tx parent ("tx"), the rx parent ("rx") or the
// senders ("senders") panic (crash injection).
func (e *Engine) CrashParent(which string) {
	pid := map[string]*actor.PID{"tx": e.tx, "rx": e.rx, "senders": e.senders}[which]
	if pid == nil {
		panic("CrashParent: no actor " + which)
	}
	e.sys.Root.Send(pid, parentCrash{})
}

// Crash makes the request's session panic (crash injection), once it has
// one (a request still waiting for blocks has none: nothing happens).
func (h *RxHandle) Crash() { h.e.sys.Root.Send(h.e.rx, &rxCrashReq{request: h.request}) }

// Mutations are bug switches the simulator must catch (test/sim's
// TestMutations), in builds with the kvxfer_invariants tag only; core has
// its own (core.Mutations).
var Mutations struct {
	// WholePlanForParts plans a chunk's layer part as if it were the whole
	// chunk: every part writes every layer, before the later layers'
	// fences fired.
	WholePlanForParts bool
}

func mutWholePlanForParts() bool { return Mutations.WholePlanForParts }

// PanicOnEffect, when set, makes a session panic just before it runs an
// effect the function returns true for (crash injection: side is "tx" or
// "rx").
var PanicOnEffect atomic.Pointer[func(side string, e Effect) bool]

func panicOnEffect(side string, e Effect) bool {
	f := PanicOnEffect.Load()
	return f != nil && (*f)(side, e)
}

// PanicOnStep, when set, makes a session panic inside its step, as the
// step takes a message the function returns true for (crash injection:
// side is "tx" or "rx"). The step has not seen the message: it is lost
// with the panic, as a bug's panic anywhere in a step loses it.
var PanicOnStep atomic.Pointer[func(side string, m any) bool]

func panicOnStep(side string, m any) bool {
	f := PanicOnStep.Load()
	return f != nil && (*f)(side, m)
}

// PanicOnStream, when set, makes a peer stream panic as it handles a
// message the function returns true for (crash injection): e is the
// stream's effect for an op (Submit, Flush, CloseEndpoint, its terminal
// SendFrame, EndStream), nil for a worker's report about its ops.
var PanicOnStream atomic.Pointer[func(e Effect) bool]

func panicOnStream(e Effect) bool {
	f := PanicOnStream.Load()
	return f != nil && (*f)(e)
}

// PanicOnFrameSent, when set, makes a peer stream panic just after it
// handed its terminal frame to its worker, before that hand-over returned
// (crash injection): the frame may have left.
var PanicOnFrameSent atomic.Pointer[func(f SendFrame) bool]

func panicOnFrameSent(f SendFrame) bool {
	p := PanicOnFrameSent.Load()
	return p != nil && (*p)(f)
}

// PanicOnRoute, when set, makes the listener panic as a frame it returns
// true for comes in (crash injection).
var PanicOnRoute atomic.Pointer[func(f messages.Frame) bool]

func panicOnRoute(f messages.Frame) bool {
	p := PanicOnRoute.Load()
	return p != nil && (*p)(f)
}
