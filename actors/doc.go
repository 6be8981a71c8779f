// Package actors is kvxfer's engine: the protoactor shells that run the
// pure steps of package core (TxSession, RxSession), the sender workers,
// the tx and rx parents, the listener and their supervision.
//
// # Pure steps, thin shells
//
// Each session is a pure state machine in package core: Step(msg, now)
// returns effects as data, with no I/O, clock, randomness or blocking
// inside. The shells execute effects and turn callbacks — fences, backend
// completions, timers, control frames — into messages: one generic session
// shell (session_shell.go) runs both sessions, with a kind for what each
// adds (tx_shell.go, rx_shell.go); the workers and parents run the pure
// tables of package core. Tests, the simulator and trace replay
// drive the same steps directly. steps.go re-exports core's names here.
//
// # Ordering and ownership
//
//   - A stream's op state lives in its TxSession alone: admission, the drain
//     decision and the release happen in one actor, so no op can be admitted
//     after the session decided it had drained.
//   - Each stream is a child actor of its session (stream.go), bound to one
//     worker by WorkerFor(request, peer). The stream actor is the only
//     sender of its ops, flush and terminal frame (FAILED, CANCELLED,
//     CancelAck, SUCCESS): they pass through its mailbox, then its worker's,
//     in the order the step emitted them. It holds its terminal frame until
//     every op it handed over was settled by a worker report, then stops;
//     the session releases its pins only after every stream child's
//     Terminated. The worker is the only user of its endpoints and control
//     connections, so they leave in that order.
//   - Ops leave in admission order; an op whose fence fired waits for the
//     ops before it.
//
// # The one rule
//
// A page is freed, reused or unpinned only when every op that references it
// is quiescent (NOT_SUBMITTED, BACKEND_DONE or RETIRED) and every pinned
// chunk's fence has fired. Timeouts, cancels and errors change the logical
// outcome at once; the physical release waits. A stream sends its terminal
// frame (Result or CancelAck) only when it is quiescent, so the generation
// side may free destination pages on that frame. A source page is only
// read: an op whose endpoint's close proved the backend reads its source no
// more, but not that its writes no longer land (SOURCES_RELEASED), lets its
// source pages go, and its stream ends without a terminal frame.
//
// # Metrics
//
// With EngineConfig.Metrics set, the shells keep package metrics' series up
// to date (metrics.go): after each step a session's meter compares the
// session's state, its streams' bytes and the states of the ops still in
// flight with what it saw last, and moves the gauges, counters and
// histograms by the difference. Steps know nothing of metrics, and the
// meter's cost is O(streams + ops in flight) per message, with label
// children resolved once per engine. Without Metrics every meter is nil.
//
// # Deviation from DESIGN.md §7
//
// A stream's op state lives in its TxSession, not in its stream actor: the
// session and its streams share pins and the drain decision, and one actor
// makes "admission and drain in the same actor" true by construction. The
// stream child actor (stream.go) carries the stream's ops, flush and
// terminal frame to its worker in order, on its session's goroutine (a
// synchronized dispatcher: a call, not a wake-up).
//
// The listener is a step without an actor: the control link's delivery
// callback runs core.RouteFrame and sends each frame straight to the tx or
// rx parent. A link delivers a connection's frames one at a time, in order,
// so each parent receives them in the order sent, as through a listener
// mailbox, one goroutine wake sooner.
package actors
