package actors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/metrics"
	"github.com/kvxfer/kvxfer/rdma"
)

// EngineConfig is a validated engine configuration (the root package builds
// it from the user's Config).
type EngineConfig struct {
	Self       messages.PeerID
	Topology   Topology
	Workers    int
	Agent      rdma.Agent
	Region     *kvcache.Region
	Pools      *Pools
	Link       control.Link
	Timeout    time.Duration
	DrainGrace time.Duration
	// Clock is the engine's time (nil: SystemClock).
	Clock    Clock
	Log      zerolog.Logger
	Recorder Recorder
	// FrameCredits is how many control frames of one peer the engine holds
	// at most before it refuses that peer's RequestData and Cancel (0:
	// DefaultFrameCredits); terminal frames always pass, and a refused
	// RequestData is answered FAILED (credits.go).
	FrameCredits int
	// MaxOrphans bounds, per generation instance, the requests whose
	// RequestData opened a session on this (context) rank before Send
	// adopted them (0: DefaultMaxOrphans; < 0: no bound). Past it a new
	// request's RequestData is refused with FAILED naming the limit, so a
	// peer cannot make this rank hold sessions for requests it never
	// sends.
	MaxOrphans int
	// Revoker, when set, is the pool region's: destination blocks of a
	// request that failed without proof are revoked (handed back at once,
	// their old memory quarantined in the Revoker until the proof) rather
	// than quarantined, and RequestData name the runs writers must address
	// elsewhere (revoke.go). Only for a backend whose writers address the
	// region's file (shm).
	Revoker kvcache.Revoker
	// Metrics, when set, receives the engine's metrics (package metrics);
	// nil turns them off. A Set serves one engine: a second engine on the
	// same Set fails to start.
	Metrics *metrics.Set
	// SendOnly: this rank only sends. Its region is registered as a source
	// (rdma.RegisterSource: where the agent can, the region has no key, no
	// peer can write into it, and the agent's Close owes no proof about
	// peers for it, a UCX rank's Close after a peer's crash), and its
	// Hello says messages.FeatureSendOnly with the placeholder key. Its
	// Receive is refused by the caller (the root package).
	SendOnly bool
	// Incarnation is this start of the rank, new at each start (0: the
	// engine takes the wall clock's nanoseconds). Its Hello and frames
	// carry it; frames of earlier incarnations are refused (issue 17).
	Incarnation uint64
	// WriterLease, when > 0, fences this rank as a writer (issue 17): it
	// posts for a generation peer only while it holds a lease on it,
	// renewed for WriterLease by each frame of the peer and by
	// Engine.PeerAlive (wire the control plane's heartbeats to it); when
	// a lease lapses the rank fails its requests to that peer and closes
	// its endpoints, as for PeerDown. Liveness, not proof: the receiver
	// still quarantines. 0: off.
	WriterLease time.Duration
}

// Engine is one engine rank's actor tree: senders (workers), tx and rx
// supervisors, and the listener step the control link's delivery runs.
type Engine struct {
	cfg      EngineConfig
	sys      *actor.ActorSystem
	reg      rdma.Registration
	env      *shellEnv
	tx, rx   *actor.PID
	listener *listener
	senders  *actor.PID
	lis      control.Listener
	stats    *Counters
	hello    *messages.Hello
	// parents are tx and rx, for the senders' watch of its workers.
	parents atomic.Pointer[[2]*actor.PID]
	// closeOnce makes Close idempotent: a second Close returns the first's
	// result instead of stopping a stopped actor system.
	closeOnce sync.Once
	closeErr  error
	// writesOver: Close drained every write this engine started
	// (WritesOver), set before Close returns.
	writesOver atomic.Bool
	// warmed are the peers whose connections the workers were told to
	// dial (warm), until the peer's Down closes them.
	warmed sync.Map
	// slots are the workers' slots (for tests), set before StartEngine
	// returns.
	slots []*workerSlot
}

// StartEngine builds the actor tree and starts listening.
func StartEngine(cfg EngineConfig) (_ *Engine, err error) {
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("%w: workers = %d, must be ≥ 1", ErrBadRequest, cfg.Workers)
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	// Whether a stream's Result needs a flush first is the agent's to say;
	// the trace records it with the topology, so replay decides the same.
	cfg.Topology.CompletionsDeliver = rdma.CompletionsDeliver(cfg.Agent)
	register := cfg.Agent.Register
	if cfg.SendOnly {
		register = func(r *kvcache.Region) (rdma.Registration, error) { return rdma.RegisterSource(cfg.Agent, r) }
	}
	reg, err := register(cfg.Region)
	if err != nil {
		return nil, fmt.Errorf("register pool region: %w", err)
	}
	defer func() {
		if err != nil {
			_ = cfg.Agent.Deregister(reg)
		}
	}()
	zl := cfg.Log
	// Dead letters (a late completion or timer aimed at a stopped session)
	// start protoactor's log throttle, a goroutine that lives one throttle
	// interval: keep it short so that a closed engine leaves nothing behind.
	sys := actor.NewActorSystem(actor.WithDeadLetterThrottleInterval(10*time.Millisecond), actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(zerolog.NewSlogHandler(zl.With().Str("component", "protoactor").Logger().Level(zerolog.WarnLevel)))
	}))
	defer func() {
		if err != nil {
			sys.Shutdown()
		}
	}()
	e := &Engine{cfg: cfg, sys: sys, reg: reg, stats: &Counters{}}
	e.env = &shellEnv{pools: cfg.Pools.forSessions(), clock: cfg.Clock, log: cfg.Log, stats: e.stats, recorder: cfg.Recorder, self: cfg.Self,
		throttle: control.NewThrottle(0, 0, 0), credits: newFrameCredits(cfg.FrameCredits),
		dispatch: newPoolDispatcher(300, 4*runtime.GOMAXPROCS(0)+16), revoker: cfg.Revoker, link: cfg.Link}
	e.env.propsOpts = []actor.PropsOption{actor.WithMailbox(newMailbox), actor.WithDispatcher(e.env.dispatch)}
	defer func() {
		if err != nil {
			e.env.dispatch.close()
		}
	}()
	if cfg.Metrics != nil {
		groups := make([]string, len(cfg.Topology.Layout.Groups))
		for g, grp := range cfg.Topology.Layout.Groups {
			groups[g] = grp.Name
		}
		if rc, ok := cfg.Link.(control.RejectCounter); ok {
			cfg.Metrics.AddRejectSource(rc.FramesRejected)
		}
		if e.env.meters, err = newMeters(cfg.Metrics, e.stats, cfg.Pools, groups, &e.env.allocWaiting, &e.env.orphans); err != nil {
			return nil, err
		}
	}
	if tr, ok := cfg.Recorder.(Tracer); ok {
		e.env.tracer = tr
		tr.Engine(EngineInfo{Self: cfg.Self, Topology: cfg.Topology, Workers: cfg.Workers})
	}

	// senders: a supervisor whose children are the workers.
	workerSup := actor.NewOneForOneStrategy(workerRestarts, workerRestartWindow, func(any) actor.Directive { return actor.RestartDirective })
	ready := make(chan []*actor.PID, 1)
	e.env.dead = make([]atomic.Bool, cfg.Workers)
	var pids []*actor.PID
	var slots []*workerSlot
	e.senders = sys.Root.Spawn(e.env.props(func() actor.Actor {
		return actor.ReceiveFunc(func(ctx actor.Context) {
			switch m := ctx.Message().(type) {
			case parentCrash:
				panic("senders: crash injected")
			case *actor.Started:
				pids = make([]*actor.PID, cfg.Workers)
				slots = make([]*workerSlot, cfg.Workers)
				for i := range pids {
					slot := newWorkerSlot(i, cfg.Agent, reg, cfg.Link, cfg.Log, e.stats, e.env)
					slots[i] = slot
					pids[i] = ctx.Spawn(e.env.props(func() actor.Actor { return &workerActor{slot: slot} }))
				}
				if e.slots == nil {
					e.slots = slots
				}
				ready <- pids
			case *actor.Terminated:
				// A worker stopped outside Close: its restart budget is spent.
				// Its Stopping closed its endpoints (no op of it can write,
				// but those whose close proved nothing), so its requests fail
				// and drain; the engine refuses new work. The closes' reports
				// it never handled (they came after it stopped) are carried
				// here: what proved sources released releases them.
				if e.env.closing.Load() {
					return
				}
				for i, pid := range pids {
					if pid.Equal(m.Who) {
						e.env.dead[i].Store(true)
						e.env.fail(fmt.Sprintf("its sender worker %d spent its restart budget", i))
						cfg.Log.Error().Int("worker", i).Msg("sender worker stopped: restart budget spent; failing its requests, refusing new ones")
						if ps := e.parents.Load(); ps != nil {
							dead := &workerDead{worker: i, inDoubt: slots[i].unprovenOps(), released: slots[i].releasedOps()}
							ctx.Send(ps[0], dead)
							ctx.Send(ps[1], dead)
						}
					}
				}
			}
		})
	}, actor.WithSupervisor(workerSup), actor.WithGuardian(&parentStrategy{env: e.env, name: "senders"})))
	e.env.workers = <-ready

	if cfg.Incarnation == 0 {
		cfg.Incarnation = nextIncarnation(time.Now())
	}
	e.env.incarnation = cfg.Incarnation
	txCfg := TxConfig{Self: cfg.Self, Workers: cfg.Workers, DrainGrace: cfg.DrainGrace, Timeout: cfg.Timeout, Incarnation: cfg.Incarnation}
	e.tx = sys.Root.Spawn(e.env.props(func() actor.Actor {
		return &txParent{env: e.env, topo: cfg.Topology, self: cfg.Self, link: cfg.Link, cfg: txCfg, leases: core.NewPeerLeases(cfg.WriterLease),
			table: e.env.txTable(4096, orphanLimit(cfg.MaxOrphans)), sessions: sessionTable{pids: map[string]*actor.PID{}}, handles: map[string]*Handle{}}
	}, actor.WithSupervisor(sessionStrategy{env: e.env, side: "tx"}), actor.WithGuardian(&parentStrategy{env: e.env, name: "tx parent"})))
	e.rx = sys.Root.Spawn(e.env.props(func() actor.Actor {
		return &rxParent{env: e.env, topo: cfg.Topology, self: cfg.Self, workers: cfg.Workers, link: cfg.Link,
			table: e.env.rxTable(cfg.Topology, cfg.Workers, cfg.Incarnation), queue: e.env.allocQueue(),
			sessions: sessionTable{pids: map[string]*actor.PID{}}, handles: map[string]*Handle{}}
	}, actor.WithSupervisor(sessionStrategy{env: e.env, side: "rx"}), actor.WithGuardian(&parentStrategy{env: e.env, name: "rx parent"})))
	e.parents.Store(&[2]*actor.PID{e.tx, e.rx})
	cfg.Pools.setOnFree(func() {
		// Blocks went back to the pools: a wake-up for the allocation
		// queue, if anything waits in it. A free that reads zero came
		// after the queue emptied, or before the supervisor's next
		// allocation attempt, which then sees the blocks (both take the
		// pools' lock; rxParent.noteQueue).
		if e.env.allocWaiting.Load() > 0 {
			sys.Root.Send(e.rx, &blocksFreed{})
		}
	})
	e.listener = &listener{env: e.env, root: sys.Root, tx: e.tx, rx: e.rx, tr: e.env.tableTracer("listener", TableRoute, TableBirth{}),
		incs: core.NewIncarnationTable(cfg.Incarnation)}

	topo := cfg.Topology
	pools := make([]messages.PoolGeometry, len(topo.Pools))
	for g, pg := range topo.Pools {
		pools[g] = messages.PoolGeometry{Offset: pg.Offset, BlockBytes: pg.BlockBytes, Blocks: int32(pg.Blocks)}
	}
	rr := reg.Remote()
	e.hello = &messages.Hello{From: cfg.Self, Backend: cfg.Agent.Backend(), AgentAddr: cfg.Agent.Address(),
		Region:     messages.RemoteRegion{Key: rr.Key, Len: rr.Len},
		LayoutHash: topo.LayoutHash, Parallel: messages.Parallel{TP: int32(topo.Parallel.TP), PP: int32(topo.Parallel.PP), Stages: topo.Parallel.Stages},
		TP: int32(topo.Rank.TP), PP: int32(topo.Rank.PP), Pools: pools, Model: modelName(topo.Layout),
		Memory: helloMemory(topo.Memory)}
	e.hello.Incarnation = cfg.Incarnation
	// Its writers honour RequestData.Remap (resolve.go); its receivers
	// take Result payloads up to messages.MaxPayload.
	e.hello.Features = messages.FeatureRemap | messages.FeatureLargePayload | messages.FeatureMisaddressed
	if cfg.SendOnly {
		// No peer may write into it, whether the agent gave the region a
		// key (a backend without source registrations) or not: the
		// placeholder keeps the Hello one that earlier versions take.
		e.hello.Features |= messages.FeatureSendOnly
		e.hello.Region.Key = slices.Clone(messages.SendOnlyKey)
	}
	// The process, so that a peer of this host can watch it exit (a
	// pidfd: proof that its writes are over, docs/membership.md §4).
	// Without /proc the Hello names none and peers get no such proof.
	if proc, perr := pidwatch.Self(); perr == nil {
		e.hello.Process = proc
	}
	if e.lis, err = cfg.Link.Listen(e.hello, e.deliver); err != nil {
		return nil, err
	}
	return e, nil
}

// deliver takes a frame from the control link: routed by the listener
// step into its parent's mailbox while its peer has credits, else refused
// at once (never a terminal frame); a refused RequestData is answered
// FAILED while the peer has answer credits (frameCredits). A panic while
// it routes (a bug: frames are validated before anything acts on them)
// must not take the serving process down from a peer's bytes: the frame is
// dropped and the engine fails, as when a parent panics (parentStrategy).
func (e *Engine) deliver(f messages.Frame) {
	defer func() {
		if r := recover(); r != nil {
			e.stats.ParentPanics.Add(1)
			from := messages.TruncateText(f.Sender().String(), 64)
			e.env.fail(fmt.Sprintf("its listener panicked (%v) on a %T frame from %s", r, f, from))
			e.env.log.Error().Str("panic", fmt.Sprint(r)).Str("peer", from).Str("frame", fmt.Sprintf("%T", f)).
				Msg("listener panicked routing a control frame: frame dropped; the engine refuses new requests, live ones drain")
		}
	}()
	if panicOnRoute(f) {
		panic("listener: panic injected")
	}
	if !e.env.credits.take(f) {
		e.stats.FramesShed.Add(1)
		e.env.meters.reject(rejectShed)
		from := f.Sender()
		if ev := e.env.warn(from.String(), "shed"); ev != nil {
			ev.Str("peer", from.String()).Str("request", f.Request()).Msg("control frame refused: the peer's frame credits are spent")
		}
		if rd, ok := f.(*messages.RequestData); ok && e.env.credits.takeAnswer(from) && !e.listener.shed(rd) {
			e.env.credits.giveAnswer(from)
		}
		return
	}
	e.listener.route(f)
}

// Hello is what this engine tells its peers about itself.
func (e *Engine) Hello() *messages.Hello { return e.hello }

// PeerMapFrom is the peer map from a context instance of parallelism ctx
// to this engine's instance as the generation side, from the topology's
// plan cache (computed once per parallelism).
func (e *Engine) PeerMapFrom(ctx kvcache.Parallel) (*kvcache.PeerMap, error) {
	topo := e.cfg.Topology
	return topo.Plans.peerMap(topo.Layout, topo.LayoutHash, ctx, topo.Parallel)
}

// Stats returns the engine's counters.
func (e *Engine) Stats() *Counters { return e.stats }

// WaitingForBlocks is how many receive requests wait now for destination
// blocks (the rx supervisor's allocation queue, as it last published it).
func (e *Engine) WaitingForBlocks() int { return int(e.env.allocWaiting.Load()) }

// TxHandle is the context side's handle on one request.
type TxHandle struct {
	*Handle
	e       *Engine
	pid     *actor.PID
	request string
}

// Chunk hands one prefill chunk to the session. fence fires when the
// chunk's KV is written; nil means it already is.
func (h *TxHandle) Chunk(c kvcache.Chunk, src []kvcache.BlockRun, fence Fence) error {
	return h.ChunkPayload(c, src, fence, nil)
}

// ChunkPayload is Chunk with the payload that replaces the request's
// (TxChunk.Payload; nil: none, an empty non-nil one: an empty payload):
// the caller passes it with the last chunk only.
//
// It pins src's blocks before it returns, all or nothing (an error
// wrapping ErrPin names what the pool refused; nothing is handed over),
// so that a caller that frees them before Done — too early — is refused
// by the pool from the moment Chunk returns, not from whenever the
// session gets to the chunk. Once the session has stopped it pins nothing
// and hands nothing over (the outcome, decided, is the handle's error).
func (h *TxHandle) ChunkPayload(c kvcache.Chunk, src []kvcache.BlockRun, fence Fence, payload []byte) error {
	if h.pid == nil {
		return nil // a rank with nothing to write (Send finished it DONE)
	}
	if fence == nil {
		fence = FiredFence{}
	}
	m := txChunkMsg{TxChunk: TxChunk{Chunk: c, Src: src, Pinned: true}, fence: fence}
	if payload != nil {
		p := payload // (its own variable: &payload put every call's on the heap)
		m.Payload = &p
	}
	l := &h.pins
	l.mu.Lock()
	defer l.mu.Unlock()
	seq, err, open := l.take(func() error { return h.e.env.pools.PinRuns(src) }, src)
	if !open {
		return fmt.Errorf("%w: request %s: %v: its session has stopped (its outcome is decided)", ErrBadRequest, h.request, c)
	}
	if err != nil {
		return fmt.Errorf("%w: request %s %v: %w", ErrPin, h.request, c, err)
	}
	m.seq = seq
	h.e.sys.Root.Send(h.pid, m)
	return nil
}

// Cancel cancels the request; Done still fires only after the session has
// drained and released its pins.
func (h *TxHandle) Cancel() {
	if h.pid != nil {
		h.e.sys.Root.Send(h.pid, TxCancel{})
	}
}

// TxRequest is what the context side asks Send for.
type TxRequest struct {
	ID        string
	PromptLen int
	Deadline  time.Time
	Payload   []byte
	// Generation, when not empty, names the generation instance the
	// request is for (a disaggregated router knows it); RequestData from
	// any other instance is then refused. Empty: the first RequestData that
	// validates binds the request to its instance, and a Cancel that comes
	// before any RequestData, from whichever instance, cancels it.
	Generation string
	// GenerationParallel, when set (TP > 0), is the generation instance's
	// parallelism. A context rank that writes to none of its ranks (MLA
	// with a context TP larger than the generation TP: only TP ranks below
	// the generation TP write) finishes DONE at once, pinning nothing.
	GenerationParallel kvcache.Parallel
}

// Send opens the context side of a request. Done fires after the session
// released every pin: the serving process may then free its source blocks.
// A request its generation instance (the one req names, or any when it
// names none) cancelled before Send is refused with ErrPeerCancelled, so
// that prefill can stop at once: that instance has freed its blocks.
func (e *Engine) Send(req TxRequest) (*TxHandle, error) {
	if hoptrace.On {
		hoptrace.Mark("ctx.Send", req.ID)
	}
	if req.ID == "" || len(req.ID) > messages.MaxRequestIDLen {
		return nil, fmt.Errorf("%w: request id length %d, want 1..%d", ErrBadRequest, len(req.ID), messages.MaxRequestIDLen)
	}
	if len(req.Payload) > messages.MaxPayload {
		return nil, fmt.Errorf("%w: request %s payload %d bytes > %d", ErrBadRequest, req.ID, len(req.Payload), messages.MaxPayload)
	}
	// The session sends the payload in its SUCCESS Result, long after Send
	// returns: a caller may reuse its buffer at once.
	req.Payload = bytes.Clone(req.Payload)
	if e.env.closing.Load() {
		return nil, fmt.Errorf("%w: send %s: the engine is closed", ErrClosed, req.ID)
	}
	if e.env.failed.Load() {
		return nil, e.env.failedErr(req.ID)
	}
	if gp := req.GenerationParallel; gp.TP > 0 {
		topo := e.cfg.Topology
		pm, err := topo.Plans.peerMap(topo.Layout, topo.LayoutHash, topo.Parallel, gp)
		if err != nil {
			return nil, fmt.Errorf("%w: request %s: generation parallelism %v: %w", ErrBadRequest, req.ID, gp, err)
		}
		if len(pm.From(topo.Rank)) == 0 {
			// Nothing of this rank's KV goes anywhere: done, nothing held.
			h := NewHandle()
			h.finish(Outcome{Request: req.ID, Status: StatusDone, OK: true})
			return &TxHandle{Handle: h, e: e, request: req.ID}, nil
		}
	}
	// The TxHandle and its Handle in one allocation (each as NewHandle
	// and the literal below made them); the TxHandle is filled in once
	// the session is open.
	b := &struct {
		tx TxHandle
		h  Handle
	}{h: Handle{done: make(chan Outcome, 1)}}
	h := &b.h
	open := &txOpenReq{request: req.ID, start: TxStart{PromptLen: req.PromptLen, Deadline: req.Deadline, Payload: req.Payload},
		generation: req.Generation, handle: h, reply: newOpenReply[txOpenReply]()}
	e.sys.Root.Send(e.tx, open)
	r, ok := awaitOpen(e, &open.reply)
	if !ok {
		r.err = fmt.Errorf("%w: send %s: the engine closed", ErrClosed, req.ID)
	}
	if r.err != nil {
		return nil, r.err
	}
	b.tx = TxHandle{Handle: h, e: e, pid: r.pid, request: req.ID}
	return &b.tx, nil
}

// RxHandle is the generation side's handle on one request.
type RxHandle struct {
	*Handle
	e       *Engine
	request string
	// done and finished are Done's and Finished's: the outcome passes
	// through handOver, which makes a READY outcome's blocks the
	// caller's before the caller can see them.
	done     chan Outcome
	finished lazyDone
	owned    bool  // the destination blocks are the caller's (RxRequest.Blocks)
	lent     *lend // those of them lent from the pool; nil: none
}

// awaitOpen returns a supervisor's answer to an open request, or false once
// the engine stopped without one: a Close raced the caller's check and
// stopped the supervisor (one that took the request answered before it
// stopped; none will now).
func awaitOpen[T any](e *Engine, reply *openReply[T]) (T, bool) {
	select {
	case <-reply.done:
		return reply.r, true
	case <-e.env.dispatch.done:
		select {
		case <-reply.done:
			return reply.r, true
		default:
			var zero T
			return zero, false
		}
	}
}

// Receive opens the generation side of a request: it allocates destination
// blocks (waiting while the pool is full) and asks the context ranks to
// write. Done fires at the logical outcome; a READY outcome's blocks belong
// to the caller, who frees them with Engine.FreeBlocks. Until then (or
// until the request gives them up itself) they are the live request's:
// FreeBlocks refuses them, and so it does the caller's own blocks
// (req.Blocks) until the handle says Released.
func (e *Engine) Receive(req RxRequest) (*RxHandle, error) {
	// A closed engine refuses before lending: the caller's blocks stay
	// its own (a lend no session ends would strand them).
	if e.env.closing.Load() {
		return nil, fmt.Errorf("%w: receive %s: the engine is closed", ErrClosed, req.ID)
	}
	if e.env.failed.Load() {
		return nil, e.env.failedErr(req.ID)
	}
	if hoptrace.On {
		hoptrace.Mark("gen.Receive", req.ID)
	}
	// The request is read after Receive returns (the allocation queue,
	// the session): a caller may reuse its buffers at once.
	req.Blocks = kvcache.CloneBlockTable(req.Blocks)
	req.PrefixHitBlocks = slices.Clone(req.PrefixHitBlocks)
	// The RxHandle and its Handle in one allocation (each as NewHandle
	// and the literal below made them).
	b := &struct {
		rx RxHandle
		h  Handle
	}{h: Handle{done: make(chan Outcome, 1)}}
	h := &b.h
	rx := &b.rx
	*rx = RxHandle{Handle: h, e: e, request: req.ID, done: make(chan Outcome, 1), owned: req.Blocks != nil}
	if req.Blocks != nil {
		var err error
		if rx.lent, err = e.cfg.Pools.lend(req.ID, req.Blocks, h.Released()); err != nil {
			return nil, err
		}
	}
	h.AfterFinish(rx.handOver)
	open := &rxOpenReq{req: req, handle: h, reply: newOpenReply[rxOpenReply](), at: e.cfg.Clock.Now()}
	e.sys.Root.Send(e.rx, open)
	r, ok := awaitOpen(e, &open.reply)
	if !ok { // no session holds the lend
		r.err = fmt.Errorf("%w: receive %s: the engine closed", ErrClosed, req.ID)
	}
	if r.err != nil {
		e.cfg.Pools.endLend(rx.lent)
		return nil, r.err
	}
	return rx, nil
}

// handOver passes the outcome on to Done once a READY outcome's blocks are
// the caller's: kvxfer's allocated to the caller, the caller's lent ones
// its own again. It runs once the session's Handle delivered the outcome,
// which no one but handOver takes.
func (h *RxHandle) handOver() bool {
	o := <-h.Handle.Done()
	if o.OK && h.owned {
		h.e.cfg.Pools.endLend(h.lent)
	} else if o.OK {
		if err := h.e.cfg.Pools.handOver(o.Blocks); err != nil {
			// The session's blocks are receiving until this hand-over:
			// anything else is a bug, counted as such.
			h.e.env.violation(fmt.Sprintf("request %s: hand READY destination blocks to the caller: %v", o.Request, err))
		}
	}
	h.done <- o
	close(h.done)
	h.finished.close()
	return true
}

// Done delivers the outcome once; a READY outcome's blocks are the
// caller's by then.
func (h *RxHandle) Done() <-chan Outcome { return h.done }

// Finished is closed once the outcome has been delivered on Done.
func (h *RxHandle) Finished() <-chan struct{} { return h.finished.wait() }

// Cancel cancels the request. Destination blocks are freed once every
// writer is quiescent.
func (h *RxHandle) Cancel() {
	h.e.sys.Root.Send(h.e.rx, &rxCancelReq{request: h.request, handle: h.Handle})
}

// rxCancelReq cancels request, if it is still handle's: the id may be
// reused once that request ended, and a stale handle's Cancel (a deferred
// one) must not cancel the request that reuses it.
type rxCancelReq struct {
	request string
	handle  *Handle
}

// rxCrashReq asks the rx parent to make a session panic (crash injection,
// sent only by kvxfer_invariants builds: RxHandle.Crash).
type rxCrashReq struct{ request string }

// FreeBlocks frees blocks handed over by a READY outcome, all or nothing.
// A block a live request owns (not yet READY, or lent to it and not yet
// Released) is refused with kvcache.ErrBlockReceiving, nothing freed.
func (e *Engine) FreeBlocks(blocks [][]kvcache.BlockID) error { return e.cfg.Pools.Free(blocks) }

// Pools is the engine's block pools.
func (e *Engine) Pools() *Pools { return e.cfg.Pools }

// PeerDown tells the engine that the control plane declared a peer dead
// (why: how it knows, as a predicate of the peer — "missed its
// heartbeats"): every session with a stream to it or a writer from it
// fails, naming why, its ops in flight are retired by closing their
// endpoints, and pages are released as each session drains. Each worker
// closes its control connection to the peer (the next frame to it dials
// afresh).
func (e *Engine) PeerDown(peer messages.PeerID, why string) {
	e.PeerIncarnationDown(peer, 0, why)
}

// PeerIncarnationDown is PeerDown for incarnation inc of peer (0: any):
// the sessions of its requests fail (those of a later incarnation go on:
// a restarted peer whose Hello came before the Down of the incarnation it
// replaced), and new requests from the peer fail while no later
// incarnation of it is known. While the link knows a later incarnation,
// the workers keep their control connection and data endpoint to the
// peer: they serve that incarnation, whose flushes may be pending there.
// The failed sessions close the endpoints of their own ops in doubt
// (CloseEndpoint); an endpoint to the old incarnation's address, if
// another, closes as stale when the next op to the peer finds its address
// changed (or at the later incarnation's own Down, or Close).
func (e *Engine) PeerIncarnationDown(peer messages.PeerID, inc uint64, why string) {
	e.sys.Root.Send(e.tx, &peerDown{peer: peer, why: why, inc: inc})
	e.sys.Root.Send(e.rx, &peerDown{peer: peer, why: why, inc: inc})
	if inc != 0 && e.cfg.Link != nil {
		if h, err := e.cfg.Link.Hello(peer); err == nil && h.Incarnation > inc {
			return
		}
	}
	e.warmed.Delete(peer)
	for i := range e.env.workers {
		if w := e.env.opWorker(i); w != nil {
			e.sys.Root.Send(w, workerPeerDown{peer: peer})
		}
	}
}

// HeartbeatMissed counts peer in kvxfer_heartbeat_misses_total: the
// control plane declared it down because its heartbeats stopped (not
// because it left a registry, nor because this rank lost its own).
func (e *Engine) HeartbeatMissed(peer messages.PeerID) { e.env.meters.peerDown(peer) }

// PeerAlive tells the engine that peer is alive now (its heartbeat
// arrived): the writer's lease on it is renewed (EngineConfig.WriterLease).
func (e *Engine) PeerAlive(peer messages.PeerID) {
	e.sys.Root.Send(e.tx, &peerAlive{peer: peer})
	e.sys.Root.Send(e.rx, &peerAlive{peer: peer})
	e.warm(peer)
}

// warm has every worker dial its control connection to peer the first
// time the peer is heard, and the first time again after a Down closed
// them (workerWarm): a request's first frame then finds it up.
func (e *Engine) warm(peer messages.PeerID) {
	if _, done := e.warmed.LoadOrStore(peer, struct{}{}); done {
		return
	}
	for i := range e.env.workers {
		if w := e.env.opWorker(i); w != nil {
			e.sys.Root.Send(w, workerWarm{peer: peer})
		}
	}
}

// WriterExited tells the engine that incarnation inc of peer is gone as
// its backend defines death (docs/membership.md §4: shm, a readable pidfd
// opened at that incarnation's Hello; ucx, its queue pairs destroyed):
// proof that none of its writes can land any more. The requests addressed
// to that incarnation fail and their destination blocks leave quarantine;
// inc 0: a peer without incarnations, every request of it. how says what
// proved it (for the error text). Missed heartbeats are not such a proof:
// they go to PeerDown. It returns how many requests the proof concerned:
// those addressed to that incarnation that were live, draining or
// quarantined here (0: none was; the peer's exit touched nothing), or an
// error when the engine did not answer within answerTimeout (closed).
func (e *Engine) WriterExited(peer messages.PeerID, inc uint64, how string) (int, error) {
	return e.ask(&writerExited{peer: peer, inc: inc, how: how})
}

// WriterRequests is how many requests addressed to incarnation inc of
// writer peer are not finished here (live, draining or quarantined);
// inc 0: any incarnation. It changes nothing.
func (e *Engine) WriterRequests(peer messages.PeerID, inc uint64) (int, error) {
	return e.ask(&writerRequests{peer: peer, inc: inc})
}

// answerTimeout bounds the wait for the rx supervisor's answer to a
// question (it answers at once unless the engine is closed).
const answerTimeout = 10 * time.Second

// ask sends m to the rx supervisor and returns its int answer; once Close
// has drained the sessions and stops the actors, it answers ErrClosed at
// once instead of waiting on a supervisor that may be gone.
func (e *Engine) ask(m any) (int, error) {
	if e.env.closing.Load() {
		return 0, fmt.Errorf("actors: %T: %w", m, ErrClosed)
	}
	r, err := e.sys.Root.RequestFuture(e.rx, m, answerTimeout).Result()
	if err != nil {
		return 0, fmt.Errorf("actors: %T: %w", m, err)
	}
	n, ok := r.(int)
	if !ok {
		return 0, fmt.Errorf("actors: %T: answered %T", m, r)
	}
	return n, nil
}

// ErrUndrained is returned by Close when sessions could not drain in time.
var ErrUndrained = errors.New("actors: sessions did not drain")

// ErrWorkerStuck is wrapped, beside ErrUndrained, by a Close that gave up
// on a sender worker: the worker may still be inside a backend call, so
// the agent must not be closed under it either (its owner leaks it, as the
// memory).
var ErrWorkerStuck = errors.New("actors: a sender worker did not stop")

// Close cancels every live session, waits until each has drained and
// released its pages or ctx ends, then stops the workers and the tree. It
// reports the requests that could not drain; their pages stay pinned. An
// engine with nothing live closes cleanly even with ctx already ended.
// Stopping a worker waits, past ctx's end and without bound, for each of
// its endpoint closes that is running (logged every 10 s with the
// endpoint's peers): until it returns, a write of the endpoint may land.
// A worker that has not stopped after 10 s with no such close running
// (stuck elsewhere: a control send, a backend call) is given up: Close
// keeps the memory (no deregistration) and fails with ErrUndrained
// naming it and its endpoints' peers, as their writes are not proven
// over.
func (e *Engine) Close(ctx context.Context) error {
	e.closeOnce.Do(func() { e.closeErr = e.close(ctx) })
	return e.closeErr
}

func (e *Engine) close(ctx context.Context) error {
	txDrained, rxDrained := make(chan struct{}), make(chan struct{})
	e.sys.Root.Send(e.tx, &closeReq{drained: txDrained})
	e.sys.Root.Send(e.rx, &closeReq{drained: rxDrained})
	var err error
	txOver := false // every context session stopped (WritesOver)
	for _, ch := range []chan struct{}{txDrained, rxDrained} {
		select {
		case <-ch:
			txOver = txOver || ch == txDrained
			continue
		case <-ctx.Done():
		}
		// ctx ended (or had ended: Close(ctx) with a deadline already
		// past): each parent answers listSessions after its closeReq, so
		// one with nothing live has closed ch by the time undrained
		// returns, and that is no failure to drain.
		uerr := e.undrained()
		select {
		case <-ch:
			txOver = txOver || ch == txDrained
			continue
		default:
		}
		err = uerr
		break
	}
	if err == nil {
		// Drained, but a session abandoned with its writers suspected and
		// no proof that their writes are over keeps its blocks
		// quarantined: a write may still land in this engine's memory,
		// which must stay allocated (kvxfer.Engine.Close keeps its pool
		// mapped on any error).
		err = e.inDoubt()
	}
	// Stop taking frames, then let each parent handle those the listener
	// already routed to it (a ping, answered after them): their answers (a
	// FAILED Result for a RequestData that came while draining) reach the
	// workers' mailboxes before the PoisonPills below. A frame the link
	// took is answered; one it refused never left its sender.
	e.env.closing.Store(true)
	_ = e.lis.Close()
	for _, pid := range []*actor.PID{e.tx, e.rx} {
		_, _ = e.sys.Root.RequestFuture(pid, &listSessions{}, time.Second).Result()
	}
	// Flush the workers before the tree stops: a drained session's last
	// frame (a FAILED Result, a CancelAck) may still wait in its worker's
	// mailbox. A PoisonPill queues behind it; stopping the supervisor
	// would stop the workers by a system message, ahead of it, and the
	// peer would never learn the outcome (its pages stay pinned until its
	// own deadline and, without proof, its Close reports them undrained).
	var givenUp []error // the workers Close went on without
	for i, w := range e.env.workers {
		e.sys.Root.Poison(w)
		if gerr := e.awaitWorker(i); gerr != nil {
			givenUp = append(givenUp, gerr)
		}
	}
	_ = e.sys.Root.PoisonFuture(e.tx).Wait()
	_ = e.sys.Root.PoisonFuture(e.rx).Wait()
	if givenUp == nil {
		_ = e.sys.Root.PoisonFuture(e.senders).Wait()
		if derr := deregisterBy(ctx, e.cfg.Agent, e.reg); derr != nil && err == nil {
			err = derr
		}
	} else {
		// The senders stop only after each of their workers: no wait.
		// The memory stays registered (and, as Close fails, mapped): a
		// write of a given-up worker's endpoints may still touch it.
		e.sys.Root.Poison(e.senders)
		err = errors.Join(append([]error{err}, givenUp...)...)
	}
	e.sys.Shutdown()
	e.env.dispatch.close()
	// Every context session stopped, none with a stream cut silent, and
	// the engine never failed (a parent's panic dropped a message, a
	// worker stopped for good): each op of this engine was quiescent when
	// its session stopped, and no frame was read after the drain but to
	// be answered FAILED (TxTable.Close) — nothing it started may still
	// write. The failure is excluded on principle, though what it loses
	// leaves sessions undrained or ops cut: such an engine is broken.
	e.writesOver.Store(txOver && !e.env.writesCut.Load() && !e.env.failed.Load() && givenUp == nil)
	return err
}

// workerStopLog is how long Close waits for a worker to stop before it
// says which endpoint closes it waits for (and, each time again, while
// they run).
var workerStopLog = 10 * time.Second

// awaitWorker waits for worker i, poisoned, to stop. Its Stopping waits
// for every endpoint close it started, and only a close that returned
// proves that no write of the endpoint lands: Close must not deregister
// the memory nor hand it back before. So while one runs, the wait has no
// bound (a hang, logged with the endpoints' peers, rather than a write
// into memory freed). With none running, Close gives the worker up after
// workerStopLog (a worker stuck elsewhere: in a control send or a
// connection's close, a backend's Post, a Connect), but not its writes:
// it returns an error naming the worker and its endpoints' peers, and
// Close keeps the memory. The worker posts nothing from then on, and an
// endpoint a Connect of it opens later is closed at once (giveUp).
func (e *Engine) awaitWorker(i int) error {
	s := e.slots[i]
	t := time.NewTimer(workerStopLog)
	defer t.Stop()
	for waited := workerStopLog; ; waited += workerStopLog {
		select {
		case <-s.stopped:
			return nil
		case <-t.C:
		}
		closing := s.closesRunning()
		if len(closing) == 0 {
			endpoints, connects := s.giveUp()
			select {
			case <-s.stopped: // it stopped meanwhile: its closes returned
				return nil
			default:
			}
			e.cfg.Log.Error().Int("worker", i).Dur("waited", waited).Strs("endpoints", endpoints).Strs("connecting", connects).
				Msg("engine close: sender worker has not stopped, and no endpoint close of it is running: going on without it, but its endpoints' writes are not proven over, so the memory stays registered and mapped (Close fails); it posts nothing more, and a Connect of it that returns later closes its endpoint at once")
			return fmt.Errorf("%w: %w: sender worker %d did not stop within %v of Close (stuck outside its endpoint closes: a control send, a backend call), so the writes of its endpoints to %v (connecting to %v) are not proven over: the pool memory stays registered and must stay mapped until the process exits",
				ErrUndrained, ErrWorkerStuck, i, waited, endpoints, connects)
		}
		e.cfg.Log.Error().Int("worker", i).Dur("waited", waited).Strs("closing", closing).
			Msg("engine close: sender worker has not stopped: its endpoint closes to these peers have not returned, so their writes are not proven over and Close waits for them before it deregisters or frees any memory; if this lasts, the data-plane backend's Endpoint.Close is stuck for those peers")
		t.Reset(workerStopLog)
	}
}

// WritesOver reports whether Close has returned having drained every
// write this engine (this incarnation) ever started: every context
// session stopped within Close's ctx, each with its ops quiescent
// (completed, never submitted, or retired by a close that proved them
// over: none SOURCES_RELEASED, no stream ended silent), and the engine
// never failed. From Close on it takes no frame that could start a write
// (RequestData is answered FAILED while it drains, not read after), so
// it is then the statement a Result makes for one request, made for
// every request: this incarnation writes no more. It says nothing about
// the generation side (a request Close abandoned with blocks quarantined
// makes Close fail, not this). False before Close, during it, and after
// a Close that did not drain the context side.
func (e *Engine) WritesOver() bool { return e.writesOver.Load() }

// deregisterBy deregisters reg, within ctx's deadline where the agent
// waits for its peers (rdma/ucx's DeregisterBy), and no sooner than a
// second from now: a Close whose drain took ctx's whole time still gives
// live peers the moment they need to answer (an unanswered revoke leaves
// the region busy and mapped).
func deregisterBy(ctx context.Context, a rdma.Agent, reg rdma.Registration) error {
	type byer interface {
		DeregisterBy(rdma.Registration, time.Time) error
	}
	d, ok := ctx.Deadline()
	b, can := a.(byer)
	if !ok || !can {
		return a.Deregister(reg)
	}
	return b.DeregisterBy(reg, later(d, time.Now().Add(time.Second)))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// inDoubt reports the requests Close abandoned with destination blocks
// quarantined (nil: none).
func (e *Engine) inDoubt() error {
	r, ferr := e.sys.Root.RequestFuture(e.rx, &listInDoubt{}, answerTimeout).Result()
	if ferr != nil {
		return fmt.Errorf("%w: the generation side did not say whether blocks stay quarantined: %w", ErrUndrained, ferr)
	}
	ids := r.([]string)
	if len(ids) == 0 {
		return nil
	}
	sort.Strings(ids)
	return fmt.Errorf("%w: %d requests keep destination blocks quarantined, their writers suspected with no proof that their writes are over: %v",
		ErrUndrained, len(ids), ids)
}

func (e *Engine) undrained() error {
	reply := make(chan []string, 2)
	for _, pid := range []*actor.PID{e.tx, e.rx} {
		f := e.sys.Root.RequestFuture(pid, &listSessions{}, time.Second)
		r, ferr := f.Result()
		if ferr != nil {
			reply <- nil
			continue
		}
		reply <- r.([]string)
	}
	var ids []string
	ids = append(ids, <-reply...)
	ids = append(ids, <-reply...)
	sort.Strings(ids)
	return fmt.Errorf("%w: %d sessions still draining: %v", ErrUndrained, len(ids), ids)
}

type listSessions struct{}

// listInDoubt asks the rx parent for the requests whose sessions Close
// abandoned with destination blocks a writer may still write.
type listInDoubt struct{}
