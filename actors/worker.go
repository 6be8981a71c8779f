package actors

import (
	"errors"
	"fmt"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// Messages a worker receives.
type (
	workerSubmit struct {
		Submit
		session *actor.PID
	}
	workerFlush struct {
		Flush
		session *actor.PID
	}
	workerClose struct {
		CloseEndpoint
		session *actor.PID
	}
	workerSend struct {
		SendFrame
		// report, when set, gets RxSent{Writer: writer} with the outcome.
		report *actor.PID
		writer int
	}
	// batchDone comes back from the backend's completion callback.
	batchDone struct {
		op      OpRef
		session *actor.PID
		err     error
	}
	// endpointClosed comes back from a closer goroutine once Close has
	// returned: the ops that were in flight on the endpoint are retired.
	endpointClosed struct {
		retired map[*actor.PID][]OpRef
		err     error
	}
	// endpointOpened comes back from a connector goroutine once Connect
	// has returned: its result waits in the slot's opened table.
	endpointOpened struct{ key string }
	flushDone      struct {
		peer    int
		session *actor.PID
		err     error
	}
	// workerCrash makes a worker panic: crash injection, sent only by
	// builds with the kvxfer_invariants tag (Engine.CrashWorker).
	workerCrash struct{}
)

type inflight struct {
	session *actor.PID
	peer    string
}

// workerSlot is a worker's state that survives restarts: its endpoints, its
// control connections and the ops it has in flight. Only the worker actor
// touches it, but for opened, which connector goroutines fill.
type workerSlot struct {
	idx      int
	agent    rdma.Agent
	reg      rdma.Registration
	link     control.Link
	eps      map[string]rdma.Endpoint
	conns    map[messages.PeerID]control.Conn
	inflight map[OpRef]inflight
	log      zerolog.Logger
	env      *shellEnv // its warning throttle and clock
	stats    *Counters
	// connecting holds, per peer whose Connect is running, the submits,
	// flushes and closes for it that came meanwhile, in arrival order.
	connecting map[string][]any
	openedMu   sync.Mutex
	opened     map[string]connectResult // Connect results not yet taken
	background sync.WaitGroup           // closer and connector goroutines still running
}

type connectResult struct {
	ep  rdma.Endpoint
	err error
}

// workerActor is the protoactor shell of one sender worker. It never
// blocks on the network: posts return at once and completions come back as
// messages, and endpoints are opened on connector goroutines and closed on
// closer goroutines.
type workerActor struct {
	slot *workerSlot
}

func newWorkerSlot(idx int, agent rdma.Agent, reg rdma.Registration, link control.Link, log zerolog.Logger, stats *Counters, env *shellEnv) *workerSlot {
	return &workerSlot{idx: idx, agent: agent, reg: reg, link: link, env: env,
		eps: map[string]rdma.Endpoint{}, conns: map[messages.PeerID]control.Conn{},
		inflight: map[OpRef]inflight{}, log: log.With().Int("worker", idx).Logger(), stats: stats,
		connecting: map[string][]any{}, opened: map[string]connectResult{}}
}

func (w *workerActor) Receive(ctx actor.Context) {
	s := w.slot
	switch m := ctx.Message().(type) {
	case *workerSubmit:
		// Record first: if anything below panics, the restart knows the op.
		s.inflight[m.Op] = inflight{session: m.session, peer: string(m.Route.AgentAddr)}
		s.submit(ctx, m)
	case *batchDone:
		delete(s.inflight, m.op)
		ctx.Send(m.session, TxCompleted{Op: m.op, Err: m.err})
	case *workerFlush:
		s.flush(ctx, m)
	case *flushDone:
		ctx.Send(m.session, TxFlushed{Peer: m.peer, Err: m.err})
	case *workerClose:
		s.close(ctx, m)
	case *endpointOpened:
		s.connected(ctx, m.key)
	case *endpointClosed:
		if m.err != nil {
			s.log.Warn().Err(m.err).Msg("endpoint close")
		}
		for pid, ops := range m.retired {
			ctx.Send(pid, TxRetired{Ops: ops})
		}
	case *workerSend:
		err := s.send(m.To, m.Frame)
		if m.report != nil {
			ctx.Send(m.report, RxSent{Writer: m.writer, Err: err})
		}
	case workerCrash:
		panic(fmt.Sprintf("worker %d: crash requested", s.idx))
	case *actor.Restarting:
		s.stats.WorkerRestarts.Add(1)
		s.log.Warn().Int("in_flight", len(s.inflight)).Msg("worker restarting: ops in doubt, closing endpoints")
		s.restart(ctx)
	case *actor.Stopping:
		// Shutting down: wait for every closer, so that once the worker has
		// stopped no write of its endpoints can land and no goroutine of it
		// is left. (The only wait a worker does, at the end of its life.)
		for key := range s.eps {
			s.closeEndpoint(ctx, key)
		}
		s.background.Wait()
		// What connectors opened after the actor last looked: nothing
		// will post through it.
		for key, r := range s.opened {
			if r.ep != nil {
				_ = r.ep.Close()
			}
			delete(s.opened, key)
		}
		for id, c := range s.conns {
			_ = c.Close()
			delete(s.conns, id)
		}
	}
}

// submit posts an op's batch through its peer's endpoint, once there is
// one; the op is refused if the endpoint cannot be opened or the post is
// refused.
func (s *workerSlot) submit(ctx actor.Context, m *workerSubmit) {
	key := string(m.Route.AgentAddr)
	if s.wait(key, m) {
		return
	}
	ep := s.eps[key]
	if ep == nil {
		s.connect(ctx, m.Route, m)
		return
	}
	sys, self := ctx.ActorSystem(), ctx.Self()
	ref, sess := m.Op, m.session
	err := ep.Post(rdma.Batch{Src: s.reg, Dst: rdma.RemoteRegion{Key: m.Route.RegionKey, Len: m.Route.RegionLen},
		Segments: m.Segments, Done: func(err error) {
			sys.Root.Send(self, &batchDone{op: ref, session: sess, err: err})
		}})
	if err != nil {
		s.refuse(ctx, m, err)
		return
	}
	s.stats.OpsPosted.Add(1)
	ctx.Send(m.session, TxSubmitted{Op: m.Op})
}

// refuse answers an op that was never posted.
func (s *workerSlot) refuse(ctx actor.Context, m *workerSubmit, err error) {
	delete(s.inflight, m.Op)
	ctx.Send(m.session, TxCompleted{Op: m.Op, Err: err, Refused: true})
}

// flush flushes the peer's endpoint behind everything posted to it; with
// no endpoint there is nothing to flush.
func (s *workerSlot) flush(ctx actor.Context, m *workerFlush) {
	key := string(m.Route.AgentAddr)
	if s.wait(key, m) {
		return
	}
	ep := s.eps[key]
	if ep == nil {
		ctx.Send(m.session, TxFlushed{Peer: m.Peer})
		return
	}
	sys, self, peer, sess := ctx.ActorSystem(), ctx.Self(), m.Peer, m.session
	ep.Flush(func(err error) { sys.Root.Send(self, &flushDone{peer: peer, session: sess, err: err}) })
}

func (s *workerSlot) close(ctx actor.Context, m *workerClose) {
	key := string(m.Route.AgentAddr)
	if s.wait(key, m) {
		return
	}
	s.closeEndpoint(ctx, key)
}

// wait queues m behind the Connect running for key, if there is one.
func (s *workerSlot) wait(key string, m any) bool {
	q, ok := s.connecting[key]
	if ok {
		s.connecting[key] = append(q, m)
	}
	return ok
}

// connect opens an endpoint to r's peer without blocking the worker: a
// connector goroutine calls Connect (which may wait for the peer, a UCX
// handshake for instance), leaves the result in opened and tells the
// worker, which then handles m and whatever came for that peer meanwhile,
// in order.
func (s *workerSlot) connect(ctx actor.Context, r *Route, m any) {
	key := string(r.AgentAddr)
	s.connecting[key] = []any{m}
	sys, self := ctx.ActorSystem(), ctx.Self()
	agent, addr, idx, peer := s.agent, r.AgentAddr, s.idx, r.Peer
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		ep, err := agent.Connect(addr)
		if err != nil {
			err = fmt.Errorf("worker %d: connect to %s: %w", idx, peer, err)
		}
		s.openedMu.Lock()
		s.opened[key] = connectResult{ep: ep, err: err}
		s.openedMu.Unlock()
		sys.Root.Send(self, &endpointOpened{key: key})
	}()
}

// connected takes a connector's result and handles what waited for it.
func (s *workerSlot) connected(ctx actor.Context, key string) {
	s.openedMu.Lock()
	r, ok := s.opened[key]
	delete(s.opened, key)
	s.openedMu.Unlock()
	if !ok {
		return
	}
	queue := s.connecting[key]
	delete(s.connecting, key)
	if r.err == nil {
		s.eps[key] = r.ep
	}
	for _, m := range queue {
		switch m := m.(type) {
		case *workerSubmit:
			if r.err != nil {
				s.refuse(ctx, m, r.err)
				continue
			}
			s.submit(ctx, m)
		case *workerFlush:
			s.flush(ctx, m)
		case *workerClose:
			s.close(ctx, m)
		}
	}
}

// closeEndpoint retires one endpoint without blocking the worker: it leaves
// the endpoint table at once (later ops to that peer connect afresh), and a
// closer goroutine calls Close, which may wait for the backend (a copier to
// stop, a UCX forced close). Only when Close has returned can no write of
// the endpoint land, so only then does endpointClosed retire the ops that
// were in flight on it.
func (s *workerSlot) closeEndpoint(ctx actor.Context, key string) {
	ep := s.eps[key]
	if ep == nil {
		return
	}
	delete(s.eps, key)
	retired := map[*actor.PID][]OpRef{}
	for ref, in := range s.inflight {
		if in.peer == key {
			retired[in.session] = append(retired[in.session], ref)
			delete(s.inflight, ref)
		}
	}
	sys, self := ctx.ActorSystem(), ctx.Self()
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		err := ep.Close()
		sys.Root.Send(self, &endpointClosed{retired: retired, err: err})
	}()
}

// restart handles a crash: every op posted on an endpoint is in doubt
// until the endpoint is closed, which retires it; ops never posted are
// refused.
func (s *workerSlot) restart(ctx actor.Context) {
	crashed := fmt.Errorf("%w: worker %d", ErrWorkerCrashed, s.idx)
	// Submits waiting for a Connect are not posted after all; flushes and
	// closes keep waiting.
	for key, q := range s.connecting {
		kept := q[:0]
		for _, m := range q {
			if _, ok := m.(*workerSubmit); !ok {
				kept = append(kept, m)
			}
		}
		s.connecting[key] = kept
	}
	doubt := map[*actor.PID][]OpRef{}
	for ref, in := range s.inflight {
		if s.eps[in.peer] == nil {
			// No endpoint to its peer (ops posted on one are retired when
			// it closes): the op was never posted.
			delete(s.inflight, ref)
			ctx.Send(in.session, TxCompleted{Op: ref, Err: crashed, Refused: true})
			continue
		}
		doubt[in.session] = append(doubt[in.session], ref)
	}
	for pid, ops := range doubt {
		ctx.Send(pid, TxInDoubt{Ops: ops, Reason: crashed})
	}
	for key := range s.eps {
		s.closeEndpoint(ctx, key)
	}
	for id, c := range s.conns {
		_ = c.Close()
		delete(s.conns, id)
	}
}

// sampled is a warning about peer of a kind, rate-limited per (peer, kind).
func (s *workerSlot) sampled(peer messages.PeerID, kind string) *zerolog.Event {
	ev := s.env.warn(peer.String(), kind)
	if ev != nil {
		ev = ev.Int("worker", s.idx)
	}
	return ev
}

// send hands f to the control plane's connection to peer to; an error
// means the frame did not leave this process.
func (s *workerSlot) send(to messages.PeerID, f messages.Frame) error {
	c := s.conns[to]
	if c == nil {
		var err error
		if c, err = s.link.Dial(to); err != nil {
			s.stats.FramesUnsent.Add(1)
			s.sampled(to, "dial").Err(err).Str("peer", to.String()).Msg("dial failed")
			return err
		}
		s.conns[to] = c
	}
	if err := c.Send(f); err != nil {
		s.stats.FramesUnsent.Add(1)
		if errors.Is(err, control.ErrQueueFull) {
			// The connection is not up yet or its queue is full: what it
			// queued stays queued (terminal frames wait in its backlog), so
			// it is kept; the caller may try again.
			s.sampled(to, "queue full").Err(err).Str("peer", to.String()).Msg("send refused")
			return err
		}
		if !errors.Is(err, control.ErrPeerGone) {
			s.sampled(to, "send").Err(err).Str("peer", to.String()).Msg("send failed")
		}
		_ = c.Close()
		delete(s.conns, to)
		return err
	}
	return nil
}
