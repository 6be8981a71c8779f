//go:build kvxfer_invariants

package actors

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
