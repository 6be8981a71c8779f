package actors

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/messages"
)

// Counters are an engine's monotonically increasing event counts.
type Counters struct {
	OpsPosted      atomic.Int64
	WorkerRestarts atomic.Int64
	FramesUnsent   atomic.Int64
	FramesRejected atomic.Int64
	FramesStale    atomic.Int64
	// FramesShed counts RequestData and Cancel frames refused because
	// their peer's frame credits were spent (credits.go).
	FramesShed    atomic.Int64
	SessionPanics atomic.Int64
	// SessionPanicsPastBudget counts session panics after the session's
	// restart budget was spent (each resumed it to drain; not a restart).
	SessionPanicsPastBudget atomic.Int64
	PinErrors               atomic.Int64
	// StreamViolations counts peer-stream actors that disagreed with their
	// session's step (a terminal frame while ops were unsettled, an effect
	// after the terminal frame): always a bug, never expected.
	StreamViolations atomic.Int64

	// LeasesLapsed counts writer leases that lapsed (the writer fenced
	// itself from that peer: EngineConfig.WriterLease).
	LeasesLapsed atomic.Int64
}

// Fence says when a chunk's KV is written. OnReady calls f exactly once,
// from any goroutine, when the producer finished (err nil) or failed.
type Fence interface {
	OnReady(f func(err error))
}

// FiredFence is a fence that has already fired (host memory).
type FiredFence struct{}

// OnReady implements Fence.
func (FiredFence) OnReady(f func(error)) { f(nil) }

// ManualFence fires when Fire is called; tests use it to hold a chunk.
type ManualFence struct {
	mu    sync.Mutex
	fired bool
	err   error
	cbs   []func(error)
}

// OnReady implements Fence.
func (m *ManualFence) OnReady(f func(error)) {
	m.mu.Lock()
	if m.fired {
		err := m.err
		m.mu.Unlock()
		f(err)
		return
	}
	m.cbs = append(m.cbs, f)
	m.mu.Unlock()
}

// Fire fires the fence once; later calls do nothing.
func (m *ManualFence) Fire(err error) {
	m.mu.Lock()
	if m.fired {
		m.mu.Unlock()
		return
	}
	m.fired, m.err = true, err
	cbs := m.cbs
	m.cbs = nil
	m.mu.Unlock()
	for _, f := range cbs {
		f(err)
	}
}

// Handle receives a session's outcome exactly once.
type Handle struct {
	once     sync.Once
	done     chan Outcome
	decided  atomic.Pointer[Decide]
	mu       sync.Mutex
	after    []func() bool // AfterFinish's, run once the outcome is delivered
	over     bool
	relOnce  sync.Once
	released chan struct{}
	finished chan struct{} // closed once the outcome is on done
}

// Finished is closed once the outcome has been delivered on Done: a
// watcher that must not take the outcome from the caller selects on it.
func (h *Handle) Finished() <-chan struct{} { return h.finished }

// Released is closed when no write of the request can touch its
// destination blocks any more (generation side): at READY, or after a
// failure once every writer is quiescent. A framework that owns its blocks
// (RxRequest.Blocks) may reuse them from then on, and never before.
func (h *Handle) Released() <-chan struct{} { return h.released }

func (h *Handle) release() { h.relOnce.Do(func() { close(h.released) }) }

// AfterFinish runs f once the outcome has been delivered (at once if it
// has been): a context.AfterFunc's stop, for instance.
func (h *Handle) AfterFinish(f func() bool) {
	h.mu.Lock()
	if !h.over {
		h.after = append(h.after, f)
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	f()
}

// Decided returns the session's logical outcome once it is decided (before
// the drain and Done), or nil while the request is live.
func (h *Handle) Decided() *Decide { return h.decided.Load() }

func (h *Handle) decide(d Decide) { h.decided.CompareAndSwap(nil, &d) }

// NewHandle returns a handle whose Done channel is buffered for one outcome.
func NewHandle() *Handle {
	return &Handle{done: make(chan Outcome, 1), released: make(chan struct{}), finished: make(chan struct{})}
}

// Done delivers the outcome once.
func (h *Handle) Done() <-chan Outcome { return h.done }

func (h *Handle) finish(o Outcome) {
	h.once.Do(func() {
		h.decide(Decide{Status: o.Status.String(), Err: o.Err})
		h.done <- o
		close(h.done)
		close(h.finished)
		h.mu.Lock()
		after := h.after
		h.after, h.over = nil, true
		h.mu.Unlock()
		for _, f := range after {
			f()
		}
	})
}

// shellEnv is what session shells share with their engine.
type shellEnv struct {
	pools    *Pools
	workers  []*actor.PID
	clock    Clock
	log      zerolog.Logger
	stats    *Counters
	recorder Recorder
	tracer   Tracer // recorder, when it is a Tracer
	self     messages.PeerID
	meters   *meters // nil: metrics off
	// throttle rate-limits warnings per (peer, kind), engine-wide.
	throttle *control.Throttle
	// credits bounds each peer's frames in flight inside the engine.
	credits *frameCredits
	// dead marks workers stopped for good (restart budget spent); failed
	// is set with the first: the engine refuses new work.
	dead    []atomic.Bool
	failed  atomic.Bool
	closing atomic.Bool

	// incarnation is this engine's (EngineConfig.Incarnation).
	incarnation uint64

	// dispatch runs every mailbox of the engine but peer streams'
	// (dispatch.go).
	dispatch *poolDispatcher
}

// props are the props of one of the engine's actors: its mailboxes run on
// the engine's dispatcher.
func (env *shellEnv) props(p actor.Producer, opts ...actor.PropsOption) *actor.Props {
	return actor.PropsFromProducer(p, append(opts, actor.WithDispatcher(env.dispatch))...)
}

// opWorker is worker i for ops (submit, flush, close), or nil once it is
// dead: what would have gone to it is never posted.
func (env *shellEnv) opWorker(i int) *actor.PID {
	if env.dead != nil && env.dead[i].Load() {
		return nil
	}
	return env.workers[i]
}

// frameWorker is the worker that sends a control frame routed to worker i:
// i itself, or the next live one once i is dead (a dead worker's streams
// have failed, and their terminal frames must still go out); nil when
// every worker is dead.
func (env *shellEnv) frameWorker(i int) *actor.PID {
	for k := range env.workers {
		j := (i + k) % len(env.workers)
		if env.dead == nil || !env.dead[j].Load() {
			return env.workers[j]
		}
	}
	return nil
}

// sendTo delivers m to pid unless pid is nil (a dead worker).
func sendTo(ctx actor.Context, pid *actor.PID, m any) {
	if pid != nil {
		ctx.Send(pid, m)
	}
}

// txChunkMsg carries a chunk and its fence from the handle to the shell.
type txChunkMsg struct {
	TxChunk
	fence Fence
}

// txPeerRequestMsg carries a resolved RequestData from the tx parent to the
// shell with what resolved it, for the tracer.
type txPeerRequestMsg struct {
	TxPeerRequest
	hello *messages.Hello
	rd    *messages.RequestData
}

// sessionStopped tells a parent that a session released everything.
type sessionStopped struct {
	request string
	outcome Outcome
}

// txCell is what a TxSession's actor keeps across restarts: the session
// itself (its chunks, streams and ops outlive a panic of the shell), its
// handle, its timers and its tracer and meter. Each incarnation of the
// actor is a fresh txActor over the same cell.
type txCell struct {
	env    *shellEnv
	s      *TxSession
	handle *Handle
	timers []Timer
	path   string        // actor path for the recorder
	tr     SessionTracer // nil unless tracing
	meter  *txMeter      // nil: metrics off
	// incarnations counts the actors produced for the session: the first
	// is its birth, each later one a restart after a panic.
	incarnations int
	// streams are the session's peer-stream children by generation rank
	// index (stream.go), until their Terminated.
	streams map[int]*streamChild
	// release holds the effects that release the session (Unpin, Finish,
	// Stop) until every stream child has terminated.
	release []Effect
}

// streamChild is a live peer-stream child of a session.
type streamChild struct {
	pid *actor.PID
	st  *streamState
}

// produce is the session's actor.Producer: a fresh shell per incarnation.
func (c *txCell) produce() actor.Actor {
	c.incarnations++
	return &txActor{txCell: c, restarted: c.incarnations > 1}
}

// txActor is the protoactor shell of a TxSession: one incarnation.
type txActor struct {
	*txCell
	// restarted: this incarnation follows a panic (its parent's strategy
	// restarted it); on Started it fails the request and goes on draining.
	restarted bool
	fence     Fence // the fence of the chunk being stepped
	// feedback holds the failures of effects being executed (a refused
	// pin), stepped as messages right after the effects that caused them.
	feedback []any
}

func (a *txActor) Receive(ctx actor.Context) {
	now := a.env.clock.Now()
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("tx.%T", ctx.Message()), a.s.Config().Request)
	}
	var eff []Effect
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if a.restarted {
			// Counted once its effects ran, so the count says the session
			// has failed and acted on it.
			a.exec(ctx, a.step(ctx, TxPanic{Err: fmt.Errorf("restarted after panic")}, now), now)
			a.env.stats.SessionPanics.Add(1)
			return
		}
		cfg := a.s.Config()
		a.path, a.tr = openTrace(a.env, ctx.Self().Id, Birth{At: now, Tx: &cfg})
		eff = a.s.Init(now)
		if a.tr != nil {
			a.tr.Stepped(a.s, eff)
		}
		if a.meter != nil {
			a.meter.born(a.s, now)
		}
	case *actor.Stopped:
		if a.meter != nil {
			a.meter.close() // when the session could not release
		}
		return
	case *actor.Restarting, *actor.Stopping, *actor.Restart:
		return
	case *actor.Terminated:
		a.streamTerminated(ctx, m.Who)
		return
	case TxCompleted:
		a.settle(ctx, m.Op.Peer, streamSettle{seqs: []int{m.Op.Seq}})
		eff = a.step(ctx, m, now)
	case TxRetired:
		for _, r := range m.Ops {
			a.settle(ctx, r.Peer, streamSettle{seqs: []int{r.Seq}})
		}
		eff = a.step(ctx, m, now)
	case TxWorkerDead:
		for peer := range a.streams {
			a.settle(ctx, peer, streamSettle{dead: m.Worker + 1})
		}
		eff = a.step(ctx, m, now)
	case txChunkMsg:
		// The fence must be in place while the effects run: WatchFence
		// takes it.
		a.fence = m.fence
		a.exec(ctx, a.step(ctx, m.TxChunk, now), now)
		a.fence = nil
		return
	case *txPanicNow:
		panic("tx session: panic requested")
	case *txSetHandle:
		a.handle = m.h
		eff = a.step(ctx, m.start, now)
		if st := a.s.State(); st.Terminal() {
			// Decided before Send adopted the session (a peer's frame or a
			// timer came first): the handle learns it now, so Chunk
			// refuses at once.
			a.handle.decide(Decide{Status: st.String(), Err: a.s.Err()})
		}
	case txPeerRequestMsg:
		if a.tr != nil {
			a.tr.Resolved(m.hello, m.rd)
		}
		eff = a.step(ctx, m.TxPeerRequest, now)
	default:
		eff = a.step(ctx, m, now)
	}
	a.exec(ctx, eff, now)
}

type txPanicNow struct{}
type rxPanicNow struct{}
type txSetHandle struct {
	h     *Handle
	start TxStart
}

func (a *txActor) step(_ actor.Context, m any, now time.Time) []Effect {
	eff := traced(a.env, a.path, a.tr, a.s, m, now)
	if a.meter != nil {
		a.meter.stepped(a.s, m, now)
	}
	return eff
}

// exec runs a step's effects, then steps what failed among them, in order,
// until nothing more fails.
func (a *txActor) exec(ctx actor.Context, eff []Effect, now time.Time) {
	a.run(ctx, eff, now)
	for len(a.feedback) > 0 {
		m := a.feedback[0]
		a.feedback = a.feedback[1:]
		a.run(ctx, a.step(ctx, m, now), now)
	}
}

func (a *txActor) run(ctx actor.Context, eff []Effect, now time.Time) {
	for i, e := range eff {
		if a.holdRelease(eff[i:]) {
			return
		}
		switch e := e.(type) {
		case Pin:
			if err := a.env.pools.Pin(e.Group, e.IDs); err != nil {
				// The refusal goes back to the session before anything else
				// reaches it: the chunk's fence cannot have been stepped
				// yet, so none of its ops has left.
				a.env.stats.PinErrors.Add(1)
				a.feedback = append(a.feedback, TxPinFailed{Chunk: e.Chunk, Group: e.Group, Err: err})
			}
		case Unpin:
			if err := a.env.pools.Unpin(e.Group, e.IDs); err != nil {
				a.env.stats.PinErrors.Add(1)
				a.env.log.Error().Err(err).Str("request", a.s.Config().Request).Msg("unpin")
			}
		case WatchFence:
			f := a.fence
			if f == nil {
				f = FiredFence{}
			}
			sys, self, idx := ctx.ActorSystem(), ctx.Self(), e.Chunk
			f.OnReady(func(err error) { sys.Root.Send(self, TxFenceFired{Index: idx, Err: err}) })
		case Submit:
			a.toStream(ctx, e.Peer, e.Worker, e)
		case Flush:
			a.toStream(ctx, e.Peer, e.Worker, e)
		case CloseEndpoint:
			a.toStream(ctx, e.Peer, e.Worker, e)
		case SendFrame:
			if e.FromStream {
				a.toStream(ctx, e.Peer, e.Worker, e)
				break
			}
			// A frame of no stream (an answer to a peer the session has
			// no stream for): nothing of it is in flight.
			sendTo(ctx, a.env.frameWorker(e.Worker), &workerSend{SendFrame: e})
		case StartTimer:
			a.timers = append(a.timers, a.env.startTimer(ctx, e, now, TxTimeout{Kind: e.Kind}))
		case Decide:
			if a.handle != nil {
				a.handle.decide(e)
			}
		case Finish:
			if a.handle != nil {
				a.handle.finish(e.Outcome)
			}
			ctx.Send(ctx.Parent(), &sessionStopped{request: a.s.Config().Request, outcome: e.Outcome})
		case Stop:
			// The tx supervisor poisons the session once it has taken it
			// off its table: frames it forwarded before that are still in
			// this mailbox, and the stopped session answers them instead of
			// letting them fall into dead letters.
			for _, t := range a.timers {
				t.Stop()
			}
		case Log:
			a.env.logEffect(e)
		}
	}
}

// toStream hands a stream effect to the stream's child actor, spawning it
// on the stream's first effect.
func (a *txActor) toStream(ctx actor.Context, peer, worker int, e Effect) {
	c := a.streams[peer]
	if c == nil {
		if a.streams == nil {
			a.streams = map[int]*streamChild{}
		}
		st := &streamState{env: a.env, session: ctx.Self(), peer: peer, worker: worker, inflight: map[int]struct{}{}}
		if a.incarnations > 1 {
			// Respawned after a restart of the session (protoactor stopped
			// the children): what the step has in flight for the peer is
			// the new stream's account.
			for r, s := range a.s.OpStates() {
				if r.Peer == peer && (s == OpSubmitting || s == OpSubmitted || s == OpInDoubt) {
					st.inflight[r.Seq] = struct{}{}
				}
			}
		}
		c = &streamChild{pid: ctx.Spawn(streamProps(st)), st: st}
		a.streams[peer] = c
	}
	ctx.Send(c.pid, streamOp{eff: e})
}

// settle forwards a worker's report about a stream's ops to the stream
// before the session steps it: the frame the step may emit in answer
// finds the stream's account settled.
func (a *txActor) settle(ctx actor.Context, peer int, m streamSettle) {
	if c := a.streams[peer]; c != nil && !c.st.done {
		ctx.Send(c.pid, m)
	}
}

// holdRelease reports whether rest is the session's release (Unpin…,
// Finish, Stop) while stream children are still alive: it is kept and run
// once the last of them has terminated.
func (a *txActor) holdRelease(rest []Effect) bool {
	if len(a.streams) == 0 || len(rest) == 0 {
		return false
	}
	switch rest[0].(type) {
	case Unpin, Finish:
	default:
		return false
	}
	for _, e := range rest {
		switch e.(type) {
		case Unpin, Finish, Stop:
		default:
			return false
		}
	}
	if _, ok := rest[len(rest)-1].(Stop); !ok {
		return false
	}
	a.release = slices.Clone(rest)
	return true
}

// streamTerminated forgets a stream child; the last one lets a held
// release run.
func (a *txActor) streamTerminated(ctx actor.Context, who *actor.PID) {
	for peer, c := range a.streams {
		if c.pid.Equal(who) {
			if !c.st.done {
				// Stopped by a restart of the session, not by its own
				// terminal frame: it is spawned again on its next effect.
				a.env.log.Debug().Str("request", a.s.Config().Request).Int("peer", peer).Msg("stream stopped before its terminal frame")
			}
			delete(a.streams, peer)
		}
	}
	if len(a.streams) == 0 && a.release != nil {
		rel := a.release
		a.release = nil
		a.run(ctx, rel, a.env.clock.Now())
	}
}

// violation records a shell disagreeing with its step (a bug).
func (env *shellEnv) violation(what string) {
	env.stats.StreamViolations.Add(1)
	env.log.Error().Msg("invariant: " + what)
}

// startTimer arms a step's timer on the engine's clock: msg comes back to
// the actor at e.At.
func (env *shellEnv) startTimer(ctx actor.Context, e StartTimer, now time.Time, msg any) Timer {
	sys, self := ctx.ActorSystem(), ctx.Self()
	return env.clock.AfterFunc(max(e.At.Sub(now), 0), func() { sys.Root.Send(self, msg) })
}

// rxCell is what an RxSession's actor keeps across restarts (as txCell).
type rxCell struct {
	env    *shellEnv
	s      *RxSession
	handle *Handle
	timers []Timer
	path   string        // actor path for the recorder
	tr     SessionTracer // nil unless tracing
	meter  *rxMeter      // nil: metrics off
	// incarnations counts the actors produced for the session.
	incarnations int
}

// produce is the session's actor.Producer: a fresh shell per incarnation.
func (c *rxCell) produce() actor.Actor {
	c.incarnations++
	return &rxActor{rxCell: c, restarted: c.incarnations > 1}
}

// rxActor is the protoactor shell of an RxSession: one incarnation.
type rxActor struct {
	*rxCell
	restarted bool // this incarnation follows a panic
}

func (a *rxActor) Receive(ctx actor.Context) {
	now := a.env.clock.Now()
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("rx.%T", ctx.Message()), a.s.Config().Request)
	}
	var eff []Effect
	restarting := false // the Started of an incarnation after a panic
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if a.restarted {
			restarting = true
			eff = a.step(ctx, RxPanic{Err: fmt.Errorf("restarted after panic")}, now)
		} else {
			cfg := a.s.Config()
			a.path, a.tr = openTrace(a.env, ctx.Self().Id, Birth{At: now, Rx: &cfg})
			if a.tr != nil {
				a.tr.Stepped(a.s, nil)
			}
			if a.meter != nil {
				a.meter.born(a.s, now)
			}
			eff = a.step(ctx, RxBegin{}, now)
		}
	case *actor.Stopped:
		if a.meter != nil {
			a.meter.close() // when the session could not release
		}
		return
	case *actor.Restarting, *actor.Stopping, *actor.Restart:
		return
	case *rxPanicNow:
		panic("rx session: panic requested")
	default:
		eff = a.step(ctx, m, now)
	}
	for _, e := range eff {
		switch e := e.(type) {
		case SendFrame:
			sendTo(ctx, a.env.frameWorker(e.Worker), &workerSend{SendFrame: e})
		case SendRequestData:
			w := a.env.frameWorker(e.Worker)
			if w == nil {
				// No worker left: it never leaves.
				ctx.Send(ctx.Self(), RxSent{Writer: e.Writer, Err: fmt.Errorf("%w: no sender worker left", ErrEngineFailed)})
				break
			}
			ctx.Send(w, &workerSend{SendFrame: SendFrame{Worker: e.Worker, To: e.To, Frame: e.Frame},
				report: ctx.Self(), writer: e.Writer})
		case StartTimer:
			a.timers = append(a.timers, a.env.startTimer(ctx, e, now, RxTimeout{Kind: e.Kind}))
		case Finish:
			if hoptrace.On {
				hoptrace.Mark("rx.finish", a.s.Config().Request)
			}
			if e.Outcome.OK {
				// READY: every writer reported, none can touch the blocks
				// (the doc's promise: Released is closed at READY, so a
				// caller woken by Done finds it closed already).
				a.handle.release()
			}
			a.handle.finish(e.Outcome)
		case QuarantineDest:
			if a.s.Config().CallerOwned {
				break // the framework's: Released tells it only after the proof
			}
			if err := a.env.pools.Quarantine(e.Blocks); err != nil {
				a.env.log.Error().Err(err).Str("request", a.s.Config().Request).Msg("quarantine destination blocks")
			}
		case ReleaseDest:
			if a.s.Config().CallerOwned {
				break // the framework's: Released tells it below
			}
			if e.Quarantined {
				if err := a.env.pools.ReleaseQuarantine(e.Blocks); err != nil {
					a.env.log.Error().Err(err).Str("request", a.s.Config().Request).Msg("release quarantined destination blocks")
				}
				break
			}
			if err := a.env.pools.Free(e.Blocks); err != nil {
				a.env.log.Error().Err(err).Str("request", a.s.Config().Request).Msg("free destination blocks")
			}
		case Stop:
			for _, t := range a.timers {
				t.Stop()
			}
			// Every writer is quiescent: the blocks may be reused. A
			// session abandoned at Close with writers unproven keeps its
			// blocks quarantined: the handle never says Released.
			if a.s.WritersQuiescent() {
				a.handle.release()
			}
			ctx.Send(ctx.Parent(), &sessionStopped{request: a.s.Config().Request})
			ctx.Stop(ctx.Self())
		case Log:
			a.env.logEffect(e)
		}
	}
	if restarting {
		// Counted once its effects ran, as for a TxSession.
		a.env.stats.SessionPanics.Add(1)
	}
}

func (a *rxActor) step(_ actor.Context, m any, now time.Time) []Effect {
	eff := traced(a.env, a.path, a.tr, a.s, m, now)
	if a.meter != nil {
		a.meter.stepped(a.s, now)
	}
	return eff
}
