package actors

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Counters are an engine's monotonically increasing event counts.
type Counters struct {
	OpsPosted      atomic.Int64
	WorkerRestarts atomic.Int64
	FramesUnsent   atomic.Int64
	FramesRejected atomic.Int64
	// FramesStale counts the frames kvxfer_frames_rejected_total{reason=
	// "stale"} counts (shellEnv.stale, rxKind.stepped): late for their
	// request (finished, unknown, a closing rank's), of an earlier
	// incarnation, or ignored by a live session (RxSession.StaleFrames).
	FramesStale atomic.Int64
	// FramesShed counts RequestData and Cancel frames refused because
	// their peer's frame credits were spent (credits.go).
	FramesShed    atomic.Int64
	SessionPanics atomic.Int64
	// SessionPanicsPastBudget counts session panics after the session's
	// restart budget was spent (each resumed it to drain; not a restart).
	SessionPanicsPastBudget atomic.Int64
	// ParentPanics counts panics of the engine's top-level actors (the tx
	// and rx parents, the senders) and of its listener (Engine.deliver):
	// each failed the engine (parentStrategy).
	ParentPanics atomic.Int64
	PinErrors    atomic.Int64
	// StreamViolations counts peer-stream actors that disagreed with their
	// session's step (a terminal frame while ops were unsettled, an effect
	// after the terminal frame): always a bug, never expected.
	StreamViolations atomic.Int64
	// BlocksRevoked counts destination blocks revoked (EngineConfig.Revoker)
	// instead of quarantined.
	BlocksRevoked atomic.Int64
	// RevokedHeld is how many revoked blocks' old memory is still held
	// (its proof has not come, or the Revoker failed to release it).
	RevokedHeld atomic.Int64
	// CallerAwaitingProof is how many of the framework's own destination
	// blocks (RxRequest.Blocks) wait for a writer's proof after their
	// request failed: kvxfer's pool does not hold them, the handle's
	// Released is not closed yet.
	CallerAwaitingProof atomic.Int64
	// DestBlockErrors counts quarantines, releases and frees of a
	// terminal request's destination blocks that the pools refused
	// (shellEnv.destRefused), and revoked memory the Revoker failed to
	// release: the blocks stay held where they were.
	DestBlockErrors atomic.Int64

	// LeasesLapsed counts writer leases that lapsed (the writer fenced
	// itself from that peer: EngineConfig.WriterLease).
	LeasesLapsed atomic.Int64
	// ClosesUnproven counts endpoint closes that could not prove the
	// writes on them over (rdma.ErrCloseUnproven): their ops stay in
	// doubt and their requests keep their source pages — unless the close
	// proved their sources released (rdma.ErrSourcesReleased): then the
	// requests release their source pages, and their streams end without
	// a terminal frame.
	ClosesUnproven atomic.Int64
	// FramesSilenced counts Cancel and RequestData frames left unanswered
	// for good: their request's stream to their sender ended without a
	// terminal frame, its writes may still land there, and any answer
	// would be a proof (TxTable.Silence).
	FramesSilenced atomic.Int64
	// CancelsDeferred counts Cancel frames left unanswered for now because
	// no cancel tombstone could be kept for them (TxTable.Cancel's hold;
	// their sender re-sends them): the frames
	// kvxfer_frames_rejected_total{reason="tombstones_full"} counts.
	CancelsDeferred atomic.Int64
	// OpsInDoubt is how many ops of live tx sessions are IN_DOUBT now
	// (TxSession.InDoubt): a crashed or cut worker may still be writing
	// them. Moved only by inDoubtShare, with the kvxfer_ops_in_doubt
	// gauge, metrics on or off.
	OpsInDoubt atomic.Int64
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
	after    []func() bool  // AfterFinish's, run once the outcome is delivered
	afterBuf [1]func() bool // backs after for the first AfterFinish
	over     bool
	released lazyDone
	finished lazyDone // closed once the outcome is on done
	// pins: the source pins a context-side handle took for chunks its
	// session has not stepped yet (TxHandle.ChunkPayload).
	pins pinLedger
}

// pinLedger accounts for source pins taken by the caller's goroutine, in
// Chunk, before the chunk reaches its session: each is released exactly
// once — by the session that takes the chunk (its own pins from then on),
// by its shell when the session does not take it, or, for a chunk that
// never reached the session (the actor stopped first), when the session's
// actor stops. Once stopped, no pin is taken.
//
// The session steps its chunks in the order the handle sent them (one
// mailbox, sends under the handle's lock), so the records form a queue:
// each consume takes the head.
type pinLedger struct {
	mu      sync.Mutex
	stopped bool
	next    uint64
	pending []pinRecord // oldest first, from head on
	head    int
}

type pinRecord struct {
	seq uint64
	src []kvcache.BlockRun
}

// take records src's pins under a new sequence number; false once the
// session's actor stopped (nothing is pinned then).
func (l *pinLedger) take(pin func() error, src []kvcache.BlockRun) (uint64, error, bool) {
	if l.stopped {
		return 0, nil, false
	}
	if err := pin(); err != nil {
		return 0, err, true
	}
	l.next++
	l.pending = append(l.pending, pinRecord{l.next, src})
	return l.next, nil, true
}

// consume removes chunk seq's record: true when it was pending (its pins
// are the caller's to hand over), false when stop swept it.
func (l *pinLedger) consume(seq uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := l.head
	for i < len(l.pending) && l.pending[i].seq != seq {
		i++ // (the head, but for chunks stepped out of order: none are)
	}
	if i == len(l.pending) {
		return false // swept
	}
	copy(l.pending[l.head+1:i+1], l.pending[l.head:i])
	l.pending[l.head] = pinRecord{}
	l.head++
	if l.head == len(l.pending) { // empty: reuse the array
		l.pending, l.head = l.pending[:0], 0
	}
	return true
}

// stop marks the ledger stopped and returns the pins of chunks that never
// reached the session, for the caller to release.
func (l *pinLedger) stop() [][]kvcache.BlockRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	var out [][]kvcache.BlockRun
	for _, r := range l.pending[l.head:] {
		out = append(out, r.src)
	}
	l.pending, l.head = nil, 0
	return out
}

// Finished is closed once the outcome has been delivered on Done: a
// watcher that must not take the outcome from the caller selects on it.
func (h *Handle) Finished() <-chan struct{} { return h.finished.wait() }

// Released is closed when no write of the request can touch its
// destination blocks any more (generation side): at READY, or after a
// failure once every writer is quiescent. A framework that owns its blocks
// (RxRequest.Blocks) may reuse them from then on, and never before.
func (h *Handle) Released() <-chan struct{} { return h.released.wait() }

func (h *Handle) release() { h.released.close() }

// AfterFinish runs f once the outcome has been delivered (at once if it
// has been): a context.AfterFunc's stop, for instance.
func (h *Handle) AfterFinish(f func() bool) {
	h.mu.Lock()
	if !h.over {
		if h.after == nil {
			h.after = h.afterBuf[:0]
		}
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

// decide keeps the first outcome. A handle already decided (a context
// session's step emits its Decide effect before its Finish) is left
// as it is without a copy of d made on the heap first.
func (h *Handle) decide(d Decide) {
	if h.decided.Load() != nil {
		return
	}
	p := new(Decide)
	*p = d
	h.decided.CompareAndSwap(nil, p)
}

// lazyDone is a channel closed once, made only when someone asks for it
// (most handles' Released and Finished never are): two allocations fewer
// a handle. A wait after the close gets an already closed channel.
type lazyDone struct {
	mu     sync.Mutex
	ch     chan struct{}
	closed bool
}

// closedChan is closed: what a wait after the close returns.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (l *lazyDone) wait() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ch == nil {
		if l.closed {
			return closedChan
		}
		l.ch = make(chan struct{})
	}
	return l.ch
}

// close closes the channel once; later calls do nothing.
func (l *lazyDone) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		if l.ch != nil {
			close(l.ch)
		}
	}
}

// NewHandle returns a handle whose Done channel is buffered for one outcome.
func NewHandle() *Handle {
	return &Handle{done: make(chan Outcome, 1)}
}

// Done delivers the outcome once.
func (h *Handle) Done() <-chan Outcome { return h.done }

func (h *Handle) finish(o Outcome) {
	h.once.Do(func() {
		h.decide(Decide{Status: o.Status.String(), Err: o.Err})
		h.done <- o
		close(h.done)
		h.finished.close()
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
	// is set with the first, or by a panic of a top-level actor
	// (parentStrategy): the engine refuses new work, saying why
	// (failedWhy, set before failed).
	dead      []atomic.Bool
	failed    atomic.Bool
	failedWhy atomic.Pointer[string]
	closing   atomic.Bool
	// writesCut is set, for good, when a context session stopped with a
	// stream that ended silent (TxTable.Silence): writes of this engine
	// may still land at that peer, so its Close cannot say that every
	// write it started is over (Engine.WritesOver).
	writesCut atomic.Bool

	// incarnation is this engine's (EngineConfig.Incarnation).
	incarnation uint64
	// link is the control plane: rx sessions read a writer's latest Hello
	// before its RequestData leaves (nil: none, as in some tests).
	link control.Link

	// dispatch runs every mailbox of the engine but peer streams'
	// (dispatch.go).
	dispatch *poolDispatcher
	// propsOpts are every actor's but peer streams': the engine's mailbox
	// on dispatch.
	propsOpts []actor.PropsOption
	// revoker, when set, takes destination memory back from stale writers
	// (revoke.go).
	revoker kvcache.Revoker
	// allocWaiting is the length of the rx supervisor's allocation queue,
	// stored by the supervisor before each allocation attempt that may
	// leave a request queued and after each change: the pools' free hook
	// wakes the supervisor (blocksFreed) only while it is above zero, so
	// that a request's blocks going back cost no mailbox run and no
	// goroutine wake-up when nothing waits for them (rxParent.noteQueue).
	allocWaiting atomic.Int64
	// orphans is the tx table's orphans, as its parent last published
	// them (Engine.Orphans).
	orphans orphanStats
}

// props are the props of one of the engine's actors: the engine's mailbox
// (mailbox.go), run on the engine's dispatcher.
func (env *shellEnv) props(p actor.Producer, opts ...actor.PropsOption) *actor.Props {
	if len(opts) == 0 {
		return actor.PropsFromProducer(p, env.propsOpts...)
	}
	return actor.PropsFromProducer(p, append(opts, env.propsOpts...)...)
}

// sessionProps are a session's props, spawned once a request: its
// producer is taken as protoactor calls it, not wrapped in a closure as
// actor.PropsFromProducer wraps an actor.Producer (an allocation a spawn).
func (env *shellEnv) sessionProps(p actor.ProducerWithActorSystem) *actor.Props {
	return actor.PropsFromProducerWithActorSystem(p, env.propsOpts...)
}

// fail fails the engine: it takes no new request from now on. The first
// reason stays.
func (env *shellEnv) fail(why string) {
	env.failedWhy.CompareAndSwap(nil, &why)
	env.failed.Store(true)
}

// failedErr is the error a request gets from a failed engine.
func (env *shellEnv) failedErr(request string) error {
	why := "it failed"
	if w := env.failedWhy.Load(); w != nil {
		why = *w
	}
	return fmt.Errorf("%w: request %s: this engine takes no new request: %s; close it and start another", ErrEngineFailed, request, why)
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

// sessionStopped tells a parent that a session released everything.
type sessionStopped struct {
	request string
	// session is the session's actor: a parent takes the message only
	// from the session its table holds for the request (an effect a panic
	// interrupted runs again, and may send it twice; by then the id may
	// be another session's).
	session *actor.PID
	outcome Outcome
	// inDoubt: a generation session abandoned at Close that holds
	// destination blocks some writer may still write (suspected, no
	// proof): they stay quarantined, and Close reports the request.
	inDoubt bool
	// silent: the generation ranks a context session's streams ended
	// without a terminal frame for (TxSession.SilentPeers): the parent
	// never answers them about the request (TxTable.Silence).
	silent []core.SilentPeer
}

// violation records a shell disagreeing with its step (a bug).
func (env *shellEnv) violation(what string) {
	env.stats.StreamViolations.Add(1)
	env.log.Error().Msg("invariant: " + what)
}

// armedTimer is a step's timer and whether it has fired.
type armedTimer struct {
	Timer
	fired atomic.Bool
}

// startTimer arms a step's timer on the engine's clock: msg comes back to
// the actor at e.At.
func (env *shellEnv) startTimer(ctx actor.Context, e StartTimer, now time.Time, msg any) *armedTimer {
	sys, self := ctx.ActorSystem(), ctx.Self()
	t := &armedTimer{}
	t.Timer = env.clock.AfterFunc(max(e.At.Sub(now), 0), func() {
		t.fired.Store(true)
		sys.Root.Send(self, msg)
	})
	return t
}
