//go:build kvxfer_invariants

package kvxfer

// Crash injection, only in builds with the kvxfer_invariants tag (make
// test): a default build's API has no chaos hooks.

// Crash makes the request's session panic: the supervisor restarts it, the
// request fails, and it still drains before releasing.
func (h *TxHandle) Crash() {
	if h.valid() {
		h.inner.Crash()
	}
}

// Crash makes the request's session panic, once it has one: the
// supervisor restarts it, the request fails, and it still waits for its
// writers before releasing the blocks.
func (h *RxHandle) Crash() {
	if h.valid() {
		h.inner.Crash()
	}
}

// CrashWorker makes sender worker i panic.
func (e *Engine) CrashWorker(i int) {
	if e.started() {
		e.inner.CrashWorker(i)
	}
}

// CrashParent makes one of the engine's top-level actors panic: "tx" (the
// context side's parent), "rx" (the generation side's) or "senders" (the
// workers' supervisor). The engine fails: it refuses new requests, live
// ones drain.
func (e *Engine) CrashParent(which string) {
	if e.started() {
		e.inner.CrashParent(which)
	}
}
