package actors

import (
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/internal/hoptrace"
)

// The session shell (DESIGN.md §7): one generic protoactor shell runs a
// pure step of package core — a TxSession or an RxSession. It turns
// mailbox messages, fence callbacks and timers (on the engine's injected
// clock) into step messages, executes the step's effects, and steps the
// failures of effects that fail (a refused pin) right after the effects
// that caused them. What differs between the two sessions — their own
// messages and effects, their tracer birth and their meter — is a kind.

// cell is what a session's actor keeps across restarts: the step itself
// (its chunks, streams, ops and writers outlive a panic of the shell), its
// handle, its timers, its tracer and its kind's own state. Each
// incarnation of the actor is a fresh shell over the same cell.
type cell[S stepper] struct {
	env    *shellEnv
	s      S
	k      kind[S]
	handle *Handle
	timers []*armedTimer // armed and not known to have fired
	// timerBuf backs timers until a session has more armed at once (most
	// arm one or two in their life): no slice to allocate per session.
	timerBuf [2]*armedTimer
	// finishLater tells the handle the outcome once the whole step's
	// effects ran (exec): a caller woken by it then finds the session's
	// stop, if the step stopped it, already in the parent's mailbox.
	finishLater func()
	path        string        // actor path for the recorder
	tr          SessionTracer // nil unless tracing
	// incarnations counts the actors produced for the session: the first
	// is its birth, each later one a restart after a panic.
	incarnations int
	// firstShell is the first incarnation's actor, allocated with the
	// cell; a restart produces a fresh shell on the heap.
	firstShell shell[S]
	// pending is what is left of the effects being run, and running the
	// effect under way; feedback holds the failures of effects already
	// run, stepped right after them. The step has moved on when its
	// effects run, so a panic in one would lose the rest (a release's
	// unpins and its outcome, a terminal frame): the next incarnation runs
	// them first. The effect that panicked is dropped (what it did, if
	// anything, is not known: pins it would have dropped stay, never a
	// page freed early) — unless it is one of the session's own ends
	// (rerunnable), which touch no page and no peer and, dropped, would
	// leave the handle without its outcome or the session never
	// stopping: that one runs again, once (retried), and a second panic
	// in it has it run anyway, outside the run (run), once more: a third
	// drops it.
	pending  []Effect
	running  Effect
	retried  bool
	feedback []any
	// behind are the effect lists that wait for what a panic left
	// (pending, running) to run first — the effects of the steps taken
	// since, each whole, in order: a panic in those leftovers leaves them
	// here for the next incarnation (or, past the restart budget, the next
	// run), after the rest of the leftovers. Before, it lost them: a
	// resumed session's step, taken before the supervisor's runLeftover,
	// lost its Submit, and the op stayed SUBMITTING for good.
	behind [][]Effect
	// stepping is the message a step is taking, nil between steps: a
	// panic inside the step leaves it set — the message is lost with the
	// panic. The next incarnation (or, past the restart budget, the next
	// message) takes it as lost and steps it once more after the request
	// has failed (restep): a worker's report in it may be the only proof
	// that an op is over (its completion, its endpoint's close), a fence
	// the only word that the producer stopped writing. Dropped, its op
	// stayed SUBMITTED for good: the session never drained, its peer got
	// no terminal frame and waited for its deadline, Done never came.
	stepping any
	// lost are the messages panics inside steps lost, oldest first, each
	// stepped once more in that order (restep). A list: a step of the
	// restart path (its TxPanic/RxPanic, a failure of the leftover
	// effects) may panic before the re-step, and its message must not
	// take the place of one still waiting (a worker's report, which may
	// be an op's only proof).
	lost []lostMsg
	// lostRetried: the lost message is being stepped again; a second
	// panic in it drops it for good (what it would have proved stays
	// unproven: pins held, no terminal frame, blocks quarantined).
	lostRetried bool
	// waiting are the messages the shell took from its mailbox and has
	// not handled yet, oldest first: each waits there while the shell
	// first runs what a panic left and lost (Receive: a session resumed
	// past its restart budget gets no Started), and a panic in that leaves
	// it for the next run (a runLeftover follows each such panic, a
	// Started each restart), which handles it after its own catch-up, in
	// order. Before, it was lost with that panic: a fence fired, a
	// worker's report, taken from the mailbox and never stepped — the
	// session waited for it for good and never drained. waitBuf backs it
	// until more than one waits (no allocation per message).
	waiting []any
	waitBuf [1]any
	// owed is the error of the panic a restart's Started is to step
	// (TxPanic, RxPanic), until it does: a panic before that (in what
	// the panic left, run first) leaves it owed for the next incarnation
	// or, past the restart budget, the next run (stepOwed). Before, a
	// session whose every Started so panicked went past its budget with
	// its request never failed: four panics later it ended DONE, and an
	// effect its failure would have made moot (a Flush dropped) left it
	// waiting for its deadline.
	owed error
	// counted is how many of the session's restarts (incarnations after
	// the first) SessionPanics counts: each once the failure it owes is
	// stepped (countRestarts). A restart whose Started panics first is
	// counted by the next run that gets that far — the next Started or,
	// past the restart budget, the resumed run. Before, it was never
	// counted: a session whose every Started panicked showed no restart
	// at all in SessionPanics (kvxfer_session_panics_total).
	counted int
	// restarting: between the actor's Restarting and its next
	// incarnation's Started.
	restarting bool
	// stopping: the actor is stopping (its Stopping came): it spawns no
	// child from now on.
	stopping bool
	// crash is the value of the panic that ended the last incarnation
	// (Receive records it on its way up), for the request's error.
	crash string
}

// lostMsg is a message a panic inside a step lost; retried: the panic came
// as it was stepped again.
type lostMsg struct {
	m       any
	retried bool
}

// restarter is a kind that acts first when a restart of its session
// ends, before the leftovers of the panic run (txKind: the stream children
// the restart stopped with their terminal frame still to send).
type restarter[S stepper] interface {
	restarted(a *shell[S], ctx actor.Context)
}

// effectDropper is a kind told of an effect a panic interrupted that is
// dropped (run): it may act on what the effect's absence means (txKind: a
// stream's terminal frame that never left).
type effectDropper[S stepper] interface {
	droppedEffect(a *shell[S], ctx actor.Context, e Effect)
}

// reforwarder is a kind that hands a lost message, about to be stepped
// again (restep), to whoever else took it before its first step (txKind:
// a worker's report, to the stream whose ops it settles).
type reforwarder[S stepper] interface {
	reforward(a *shell[S], ctx actor.Context, m any)
}

// kind is what a session kind adds to the generic shell.
type kind[S stepper] interface {
	// side names the kind ("tx", "rx") in traces and panics.
	side() string
	request() string
	// born handles the first Started: it opens the tracer and meter and
	// returns the session's first effects.
	born(a *shell[S], ctx actor.Context, now time.Time) []Effect
	// panicked is the message a restarted incarnation steps first.
	panicked(err error) any
	// restepable reports whether a message a panic inside a step lost
	// may be stepped again (shell.restep).
	restepable(m any) bool
	// restepping is told just before a lost message is stepped again:
	// the kind hands the tracer what it handed it before the first step
	// (a TxPeerRequest's route inputs), so that the trace still replays.
	restepping(a *shell[S], m any)
	// dropped is told of a lost message that is not stepped again (not
	// restepable, or it panicked again): what the step took of it before
	// it panicked, and whose effects were lost with the panic, the kind
	// may still need to act on (a taken chunk's fence).
	dropped(a *shell[S], ctx actor.Context, m any, now time.Time)
	// timeout is the message a fired timer of the kind steps.
	timeout(k TimerKind) any
	// receive handles a message of the kind's own; false: the shell steps
	// it as it is.
	receive(a *shell[S], ctx actor.Context, m any, now time.Time) bool
	// hold may keep the rest of a step's effects back (the TxSession's
	// release waits for its stream children); true: the shell stops there.
	hold(a *shell[S], rest []Effect) bool
	// effect executes an effect the shell does not (all but StartTimer
	// and Log).
	effect(a *shell[S], ctx actor.Context, e Effect, now time.Time)
	// stepped is told of each step (the meter).
	stepped(m any, now time.Time)
	// stopped is told when the actor stopped (the meter, when the session
	// could not release).
	stopped()
}

// produce is the session's actor.ProducerWithActorSystem: a fresh shell
// per incarnation.
func (c *cell[S]) produce(*actor.ActorSystem) actor.Actor {
	c.incarnations++
	if c.incarnations == 1 {
		c.firstShell = shell[S]{cell: c}
		return &c.firstShell
	}
	return &shell[S]{cell: c, restarted: true}
}

// shell is one incarnation of a session's actor.
type shell[S stepper] struct {
	*cell[S]
	// restarted: this incarnation follows a panic (its parent's strategy
	// restarted it); on Started it fails the request and goes on draining.
	restarted bool
}

// panicNow makes a session panic (crash injection, kvxfer_invariants
// builds only send it).
type panicNow struct{}

// runLeftover has a session resumed after a panic (past its restart
// budget: no Started comes) run the effects the panic left (cell.pending).
type runLeftover struct{}

func (a *shell[S]) Receive(ctx actor.Context) {
	defer a.notePanic()
	now := a.env.clock.Now()
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("%s.%T", a.k.side(), ctx.Message()), a.k.request())
	}
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if a.restarted {
			a.restarting = false
			if r, ok := a.k.(restarter[S]); ok {
				r.restarted(a, ctx)
			}
			// (An error still owed, a Started before this one having
			// panicked first, is kept: it names the crash that began it.)
			if err := a.panicErr(a.takeLost()); a.owed == nil {
				a.owed = err
			}
			// What a panic while effects ran left (run: the rest of them,
			// and their failures) first, as their step decided.
			a.exec(ctx, nil, now)
			// What the step that panicked emitted before it did (its
			// outcome, a terminal frame, the release: the session's state
			// says they were sent), as it decided.
			a.unreturned(ctx, now)
			a.stepOwed(ctx, now)
			// Counted once its effects ran, so the count says the session
			// has failed and acted on it (and a panic in what follows
			// counts again).
			a.countRestarts()
			// Then what a panic inside a step lost, the request failed,
			// and what a panic in a catch-up left waiting (a message taken
			// between a panic and its restart: a stream's Terminated).
			a.restep(ctx, now)
			a.handleWaiting(ctx, now)
			return
		}
		a.exec(ctx, a.k.born(a, ctx, now), now)
	case *actor.Stopped:
		a.k.stopped()
	case *actor.Restarting:
		a.restarting = true
	case *actor.Stopping:
		a.stopping = true
	case *actor.Restart:
	case *panicNow:
		panic(a.k.side() + " session: panic requested")
	case runLeftover:
		// The lost message first, as Started takes it: a step below (a
		// failure of the leftovers, the panic owed) would take its place.
		a.takeLost()
		a.exec(ctx, nil, now) // run runs what a panic left, exec its failures
		a.unreturned(ctx, now)
		a.stepOwed(ctx, now)
		a.countRestarts()
		a.restep(ctx, now)
		a.handleWaiting(ctx, now)

	default:
		if a.restarting {
			// (While the actor restarts, its stream children's Terminated
			// come before Started, which takes what a panic left.)
			a.take(ctx, m, now)
			return
		}
		// Resumed past its restart budget (no Started came, and
		// runLeftover may be behind this): what a panic left and lost
		// first, m waiting meanwhile (cell.waiting).
		if len(a.waiting) == 0 {
			a.waiting = a.waitBuf[:0]
		}
		a.waiting = append(a.waiting, m)
		if a.takeLost() || a.owed != nil {
			a.exec(ctx, nil, now)
		}
		a.unreturned(ctx, now)
		a.stepOwed(ctx, now)
		a.countRestarts()
		a.restep(ctx, now)
		a.handleWaiting(ctx, now)
	}
}

// countRestarts counts in SessionPanics the session's restarts not
// counted yet (cell.counted), once the failure they owe is stepped.
func (a *shell[S]) countRestarts() {
	if n := a.incarnations - 1 - a.counted; n > 0 {
		a.env.stats.SessionPanics.Add(int64(n))
		a.counted += n
	}
}

// stepOwed steps the panic a restart owes the session (cell.owed), if
// any: the request fails. Past the restart budget, the run that follows a
// panic steps it when no Started did. A panic in that step leaves it in
// stepping, lost: it is stepped again (restep), not owed.
func (a *shell[S]) stepOwed(ctx actor.Context, now time.Time) {
	err := a.owed
	if err == nil {
		return
	}
	a.owed = nil
	a.exec(ctx, a.step(a.k.panicked(err), now), now)
}

// handleWaiting handles the messages waiting (cell.waiting), oldest
// first; a panic in one leaves the rest there.
func (a *shell[S]) handleWaiting(ctx actor.Context, now time.Time) {
	for len(a.waiting) > 0 {
		m := a.waiting[0]
		a.waiting = a.waiting[1:]
		a.take(ctx, m, now)
	}
	a.waitBuf[0], a.waiting = nil, nil
}

// take hands m to the kind, or steps it as it is.
func (a *shell[S]) take(ctx actor.Context, m any, now time.Time) {
	if !a.k.receive(a, ctx, m, now) {
		a.exec(ctx, a.step(m, now), now)
	}
}

// takeLost takes the message a panic inside a step lost (cell.stepping)
// as lost, after those lost before it; false when there is none.
func (a *shell[S]) takeLost() bool {
	if a.stepping == nil {
		return false
	}
	a.lost = append(a.lost, lostMsg{m: a.stepping, retried: a.lostRetried})
	a.stepping, a.lostRetried = nil, false
	return true
}

// notePanic records the value of a panic on its way up to the session's
// supervisor (sessionStrategy), for the next incarnation's error.
func (a *shell[S]) notePanic() {
	if r := recover(); r != nil {
		a.crash = fmt.Sprint(r)
		panic(r)
	}
}

// panicErr names the panic that ended the last incarnation and where it
// came: inside a step (the message it was taking, lost: takeLost took
// it), running an effect, or elsewhere in the shell.
func (a *shell[S]) panicErr(lost bool) error {
	what := a.crash
	if what == "" {
		what = "unknown panic"
	}
	a.crash = ""
	switch {
	case lost:
		return fmt.Errorf("panicked stepping %T: %s", a.lost[len(a.lost)-1].m, what)
	case a.running != nil:
		return fmt.Errorf("panicked running %T: %s", a.running, what)
	}
	return fmt.Errorf("panicked: %s", what)
}

// restep steps the message a panic inside a step lost (cell.lost) once
// more, the request failed by then (the restart stepped the panic first):
// a lost worker report, fence or timer is not lost for good. A second
// panic in it drops it: what it would have proved stays unproven. A
// chunk (TxChunk) is never stepped again: its pins were the shell's to
// release (txKind.receive) unless the step took them — then its fence is
// watched still (txKind.dropped), its WatchFence lost with the panic.
//
// Each lost message is stepped in turn, oldest first; a panic in one
// leaves the rest in cell.lost for the next incarnation.
func (a *shell[S]) restep(ctx actor.Context, now time.Time) {
	for len(a.lost) > 0 {
		l := a.lost[0]
		a.lost = a.lost[1:]
		m := l.m
		if l.retried || !a.k.restepable(m) {
			why := "it is not stepped again"
			if l.retried {
				why = "it panicked again; what it would have proved stays unproven"
			}
			a.env.log.Error().Str("request", a.k.request()).Str("side", a.k.side()).Str("dropped", fmt.Sprintf("%T", m)).
				Msg("session panicked stepping a message: dropped, " + why)
			a.k.dropped(a, ctx, m, now)
			continue
		}
		a.env.log.Error().Str("request", a.k.request()).Str("side", a.k.side()).Str("again", fmt.Sprintf("%T", m)).
			Msg("session panicked stepping a message: its request failed; the message is stepped again, once")
		a.lostRetried = true
		a.k.restepping(a, m)
		if r, ok := a.k.(reforwarder[S]); ok {
			r.reforward(a, ctx, m)
		}
		eff := a.step(m, now)
		a.lostRetried = false
		a.exec(ctx, eff, now)
	}
}

// step steps the session on m, telling the tracer and the meter.
func (a *shell[S]) step(m any, now time.Time) []Effect {
	// No defer: a panic must leave stepping as it is.
	a.stepping = m
	if panicOnStep(a.k.side(), m) {
		panic(a.k.side() + " session: panic injected in a step")
	}
	eff := traced(a.env, a.path, a.tr, a.s, m, now)
	a.stepping = nil
	a.k.stepped(m, now)
	// Returned: nothing of it is left for a panic to lose (unreturned).
	a.s.Unreturned()
	return eff
}

// unreturned runs the effects a step emitted before it panicked, inside
// the step or in what the shell does with its effects before it runs
// them (the tracer, the meter): the step's changes to the session stay,
// and each of those effects goes with one — a Decide with the outcome, a
// stream's terminal frame with its stream finished, the release (Unpin…,
// Finish, Stop) with the session stopped. Lost, the session was terminal
// and stopped for its step but nothing had told the handle (Done never
// came), the peer (no terminal frame: it waited for its deadline) or the
// parent, and its TxPanic or RxPanic changed nothing (the outcome was
// decided). None of them ran: the step never returned them.
func (a *shell[S]) unreturned(ctx actor.Context, now time.Time) {
	eff := a.s.Unreturned()
	if len(eff) == 0 {
		return
	}
	a.env.log.Error().Str("request", a.k.request()).Str("side", a.k.side()).Int("effects", len(eff)).
		Msg("session panicked after its step emitted effects: they run now, as it decided")
	a.exec(ctx, eff, now)
}

// exec runs a step's effects, then steps what failed among them, in order,
// until nothing more fails.
func (a *shell[S]) exec(ctx actor.Context, eff []Effect, now time.Time) {
	a.run(ctx, eff, now)
	a.recycle(eff)
	for len(a.feedback) > 0 {
		m := a.feedback[0]
		a.feedback = a.feedback[1:]
		eff := a.step(m, now)
		a.run(ctx, eff, now)
		a.recycle(eff)
	}
	if f := a.finishLater; f != nil {
		a.finishLater = nil
		f()
	}
}

// recycle hands a step's effects slice back to the session once run
// returned (a panic in it leaves the rest in pending: not recycled). run
// keeps nothing of it (pending is cleared, hold clones what it holds,
// the effects themselves are copied out of it); a tracer was handed the
// slice (Stepped) and may keep it, so under one nothing is recycled.
func (a *shell[S]) recycle(eff []Effect) {
	if a.tr == nil {
		a.s.Recycle(eff)
	}
}

func (a *shell[S]) run(ctx actor.Context, eff []Effect, now time.Time) {
	if a.running != nil || len(a.pending) > 0 {
		// Left by a panic (this incarnation restarted or resumed after
		// it; sessionStrategy): first.
		left, panicked := a.pending, a.running
		a.pending, a.running = nil, nil
		// eff waits behind them, after what waited before it.
		a.behind = append(a.behind, eff)
		if panicked != nil && !a.retried && rerunnable(panicked) {
			a.env.log.Error().Str("request", a.k.request()).Str("side", a.k.side()).Str("again", fmt.Sprintf("%T", panicked)).
				Int("left", len(left)).Msg("session panicked running an effect: that effect runs again, then the rest")
			left = append([]Effect{panicked}, left...)
			a.retried = true
		} else {
			a.env.log.Error().Str("request", a.k.request()).Str("side", a.k.side()).Str("dropped", fmt.Sprintf("%T", panicked)).
				Int("left", len(left)).Msg("session panicked running an effect: that effect dropped, the rest run now")
			a.retried = false
			// The rest waits in pending while the dropped effect is acted
			// on below: a panic there leaves it for the next run, which
			// drops that effect for good (nothing is running).
			a.pending = left
			switch e := panicked.(type) {
			case StartTimer:
				// Armed anyway: a timer touches no page and no peer, and
				// its timeout may be the only thing left to come (the
				// drain's, which closes the endpoints of ops in doubt: it
				// fires once). Before, dropped, those ops stayed IN_DOUBT
				// for good: the session never drained, Done never came.
				a.arm(ctx, e, now)
			case Decide, Finish, Stop:
				// Run anyway, as the timer: the session's own ends touch
				// no page and no peer, are safe twice (rerunnable), and
				// nothing emits them again. Before, dropped, a Finish left
				// Done unsent for good (and the tx parent never told: the
				// session stayed on its table, Close reported it
				// draining), a Stop left the session never stopping, and
				// a Decide left the handle without its outcome until Done
				// (Err said nil while a failed request drained).
				a.k.effect(a, ctx, e, now)
			default:
				if d, ok := a.k.(effectDropper[S]); ok && panicked != nil {
					d.droppedEffect(a, ctx, panicked)
				}
			}
			a.pending = nil
		}
		a.run(ctx, left, now)
		a.retried = false
		for len(a.behind) > 0 {
			next := a.behind[0]
			a.behind = a.behind[1:]
			a.run(ctx, next, now) // (nothing left by a panic: it runs them)
		}
		a.behind = nil
		return
	}
	// No defer: a panic must leave pending and running as they are.
	for i, e := range eff {
		if i > 0 && a.retried {
			a.retried = false // the effect run again (eff[0]) returned
		}
		if a.k.hold(a, eff[i:]) {
			a.pending, a.running = nil, nil
			return
		}
		a.pending, a.running = eff[i+1:], e
		if panicOnEffect(a.k.side(), e) {
			panic(fmt.Sprintf("%s session: panic injected running %T", a.k.side(), e))
		}
		switch e := e.(type) {
		case StartTimer:
			a.arm(ctx, e, now)
		case Log:
			a.env.logEffect(e)
		default:
			a.k.effect(a, ctx, e, now)
		}
	}
	a.pending, a.running = nil, nil
}

// arm arms a session timer (StartTimer).
func (a *shell[S]) arm(ctx actor.Context, e StartTimer, now time.Time) {
	// Forget the timers that fired: a session that waits long (a
	// quarantine re-sending Cancel every second) arms many.
	a.timers = slices.DeleteFunc(a.timers, func(t *armedTimer) bool { return t.fired.Load() })
	if a.timers == nil {
		a.timers = a.timerBuf[:0]
	}
	a.timers = append(a.timers, a.env.startTimer(ctx, e, now, a.k.timeout(e.Kind)))
}

// rerunnable reports whether an effect a panic interrupted runs again in
// the next incarnation rather than being dropped: the session's own ends
// and bookkeeping, which touch no page and no peer and are safe twice —
// the outcome (Decide, Finish: the handle takes it once, the parent
// ignores a second sessionStopped), the stop, a timer (a second one's
// timeout changes nothing), a log line. Dropped, a Finish left the
// handle's Done unsent for good and a Stop left the session never
// stopping (Close reported it draining, holding nothing); one a second
// panic drops runs anyway, once more (run), for the same reason. Never an
// Unpin, a ReleaseDest or a QuarantineDest (twice, it could release what
// another took since), nor a frame that goes to a worker (whether it left
// is not known). A peer stream's op (Submit) and terminal frame
// (SendFrame FromStream) do run again: a stream runs synchronously on its
// session's goroutine and recovers its own panics, so a panic that
// escaped the effect came before the stream took it — nothing of it left,
// and nothing would ever report it. Dropped, the op stayed SUBMITTING for
// good (the session never drained, its pins held, Close undrained), and
// the terminal frame never reached the peer (a generation side without a
// deadline waited for it for good). One a second panic drops is stepped
// as what it is: an op never posted, a frame that did not leave
// (txKind.droppedEffect). A stream's end without a frame (EndStream) runs
// again too, for the same reason: dropped, the stream never stopped and
// held the session's release for good. So does a stream's CloseEndpoint:
// dropped, the ops it was to prove over (in doubt after a deadline, a
// peer gone) stayed IN_DOUBT for good — the drain timer fires once — and
// the session never drained, as they did when that timer was dropped
// (one a second panic drops is armed anyway: run). A WatchFence runs
// again too: dropped, the chunk's fence was never watched, and its pins
// and ops waited for it for good; one a second panic drops is watched
// anyway (txKind.droppedEffect). (Only a live session takes chunks, so
// only a restart — its Started runs the rest first — can leave one, and
// the chunk's fence is still the shell's then: txKind.fence.)
func rerunnable(e Effect) bool {
	switch e := e.(type) {
	case Decide, Finish, Stop, StartTimer, Log, Submit, WatchFence, EndStream, CloseEndpoint:
		return true
	case SendFrame:
		return e.FromStream
	}
	return false
}

// stopTimers stops the session's timers (at its Stop).
func (a *shell[S]) stopTimers() {
	for _, t := range a.timers {
		t.Stop()
	}
}
