// Package core holds kvxfer's pure steps: the context-side TxSession (with
// one stream per generation rank it writes to) and the generation-side
// RxSession, the messages they step on, the effects they return, their
// states and op states, and the engine's sentinel errors.
//
// # Pure steps
//
// Each session is a state machine: Step(msg, now) returns effects (Pin,
// Unpin, WatchFence, Submit, Flush, CloseEndpoint, SendFrame,
// SendRequestData, Readdress, StartTimer, Decide, Finish, ReleaseDest,
// Stop, Log) as
// data, with no I/O, clock, randomness, goroutine or blocking inside. The
// package imports neither protoactor nor zmq nor any cgo package
// (TestDeps_NoActorRuntimeNoCgo checks it): package actors runs the steps
// in protoactor shells, and the simulator (test/sim) and trace replay
// drive them directly.
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
// source pages go, and its stream ends without a terminal frame. A session's op state has
// one writer, the session: admission, the drain decision and the release
// happen in one step function, so no op can be admitted after the session
// decided it had drained.
//
// # Invariants
//
// Builds with the kvxfer_invariants tag record illegal transitions in
// TxSession.Violations and carry Mutations, the switches that break a
// rule on purpose for test/sim to catch; a default build has neither.
package core
