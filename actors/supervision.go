package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Supervision (DESIGN.md §7), declared on the parents' props: protoactor
// applies a parent's strategy to the failures of its children.
//
//   - The tx and rx parents supervise their sessions with sessionStrategy.
//
//   - The senders supervise the workers one-for-one: at most
//     workerRestarts restarts within workerRestartWindow; past that the
//     worker is stopped and the engine fails (engine.go).
//
//   - A session supervises its peer-stream children with protoactor's
//     default strategy; a stream's state survives its restart
//     (streamState). A restart of the session stops them (protoactor
//     stops a restarting actor's children); they are spawned again on
//     their next effect, with the step's ops in flight as their account —
//     except one stopped with its terminal frame held (or its end
//     waiting, or a message a panic lost): the step will emit nothing
//     more for it, so it is spawned again at the restart's Started, over
//     its own state (txKind.carried).
//
// A producer returns a fresh shell per incarnation over the state that
// survives it (a session's cell, a stream's streamState, workerSlot).
const (
	// sessionRestarts is how many times one session may be restarted
	// after a panic in its life.
	sessionRestarts     = 3
	workerRestarts      = 10
	workerRestartWindow = 10 * time.Second
)

// sessionStrategy supervises the sessions of a tx or rx parent. A session
// that panics is restarted: its fresh shell steps TxPanic or RxPanic, with
// an error naming the panic, so the request fails at once and the session
// goes on draining. Past its budget (sessionRestarts in its life) it is
// resumed instead, never stopped: a stopped session would leave its pins
// and its ops in flight with no one to settle them, and its handle with no
// outcome. Its request has failed already (at its first restart); it
// drains and releases as any other. Either way a message a panic inside
// the step lost (a worker's report may be an op's only proof) is stepped
// once more, after the failure (cell.stepping); a second panic in it
// drops it, and what it would have proved stays unproven.
type sessionStrategy struct {
	env  *shellEnv
	side string // "tx" or "rx", for the log
}

var _ actor.SupervisorStrategy = sessionStrategy{}

// HandleFailure implements actor.SupervisorStrategy; it runs on the
// parent's goroutine. rs is the child's own record: it survives restarts.
func (s sessionStrategy) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, _ any) {
	rs.Fail()
	if n := rs.FailureCount(); n <= sessionRestarts {
		s.env.log.Warn().Str("session", child.Id).Str("side", s.side).Int("restart", n).
			Str("panic", fmt.Sprint(reason)).Msg("session panicked: restarting it; its request fails, it drains")
		sup.RestartChildren(child)
		return
	}
	s.env.stats.SessionPanicsPastBudget.Add(1)
	s.env.log.Error().Str("session", child.Id).Str("side", s.side).Int("restarts", sessionRestarts).
		Str("panic", fmt.Sprint(reason)).Msg("session panicked past its restart budget: resumed to drain, message dropped")
	// A panic while effects ran left the rest of them (cell.pending): a
	// resumed session gets no Started, and may wait for nothing more.
	sys.Root.Send(child, runLeftover{})
	sup.ResumeChildren(child)
}

// parentStrategy is the guardian of one of the engine's top-level actors
// (the tx and rx parents, the senders): each holds what no restart could
// rebuild — the request tables and their tombstones, the sessions and
// their handles, the allocation queue, the workers' pids. protoactor's
// default would restart it empty after stopping its children: a tx
// parent that no longer knows a request would acknowledge a Cancel of it
// (the generation side's proof to free blocks a write may still reach),
// sessions would stop with their pins and no outcome, and Close would
// find nothing to drain. Instead the actor is resumed with its state —
// the message it panicked on is dropped, as a restart would drop it — and
// the engine fails: it refuses new requests (ErrEngineFailed), those
// live drain and end as usual, and Close reports what cannot drain.
type parentStrategy struct {
	env  *shellEnv
	name string // "tx parent", "rx parent", "senders", for the log and the error
}

var _ actor.SupervisorStrategy = (*parentStrategy)(nil)

// HandleFailure implements actor.SupervisorStrategy.
func (s *parentStrategy) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, msg any) {
	s.env.stats.ParentPanics.Add(1)
	s.env.fail(fmt.Sprintf("its %s panicked (%v)", s.name, reason))
	s.env.log.Error().Str("actor", s.name).Str("panic", fmt.Sprint(reason)).Str("message", fmt.Sprintf("%T", msg)).
		Msg("engine actor panicked: resumed with its state, the message dropped; the engine refuses new requests, live ones drain")
	sup.ResumeChildren(child)
}
