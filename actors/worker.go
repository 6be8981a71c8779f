package actors

import (
	"errors"
	"fmt"
	"github.com/kvxfer/kvxfer/control"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

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
	workerSend struct{ SendFrame }
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
	flushDone struct {
		peer    int
		session *actor.PID
		err     error
	}
	// WorkerCrash makes a worker panic (tests and chaos only).
	WorkerCrash struct{}
)

type inflight struct {
	session *actor.PID
	peer    string
}

// workerSlot is a worker's state that survives restarts: its endpoints, its
// control connections and the ops it has in flight. Only the worker actor
// touches it.
type workerSlot struct {
	idx      int
	agent    rdma.Agent
	reg      rdma.Registration
	link     control.Link
	eps      map[string]rdma.Endpoint
	conns    map[messages.PeerID]control.Conn
	inflight map[OpRef]inflight
	log      zerolog.Logger
	stats    *Counters
	closing  sync.WaitGroup // closer goroutines still running
}

// workerActor is the protoactor shell of one sender worker. It never
// blocks on the network: posts return at once and completions come back as
// messages, and endpoints are closed on closer goroutines.
type workerActor struct {
	slot *workerSlot
}

func newWorkerSlot(idx int, agent rdma.Agent, reg rdma.Registration, link control.Link, log zerolog.Logger, stats *Counters) *workerSlot {
	return &workerSlot{idx: idx, agent: agent, reg: reg, link: link,
		eps: map[string]rdma.Endpoint{}, conns: map[messages.PeerID]control.Conn{},
		inflight: map[OpRef]inflight{}, log: log.With().Int("worker", idx).Logger(), stats: stats}
}

func (w *workerActor) Receive(ctx actor.Context) {
	s := w.slot
	switch m := ctx.Message().(type) {
	case *workerSubmit:
		// Record first: if anything below panics, the restart knows the op.
		s.inflight[m.Op] = inflight{session: m.session, peer: string(m.Route.AgentAddr)}
		ep, err := s.endpoint(m.Route)
		if err == nil {
			sys := ctx.ActorSystem()
			self := ctx.Self()
			ref, sess := m.Op, m.session
			err = ep.Post(rdma.Batch{Src: s.reg, Dst: rdma.RemoteRegion{Key: m.Route.RegionKey, Len: m.Route.RegionLen},
				Segments: m.Segments, Done: func(err error) {
					sys.Root.Send(self, &batchDone{op: ref, session: sess, err: err})
				}})
		}
		if err != nil {
			delete(s.inflight, m.Op)
			ctx.Send(m.session, TxCompleted{Op: m.Op, Err: err, Refused: true})
			return
		}
		s.stats.OpsPosted.Add(1)
	case *batchDone:
		delete(s.inflight, m.op)
		ctx.Send(m.session, TxCompleted{Op: m.op, Err: m.err})
	case *workerFlush:
		ep := s.eps[string(m.Route.AgentAddr)]
		if ep == nil {
			ctx.Send(m.session, TxFlushed{Peer: m.Peer})
			return
		}
		sys, self, peer, sess := ctx.ActorSystem(), ctx.Self(), m.Peer, m.session
		ep.Flush(func(err error) { sys.Root.Send(self, &flushDone{peer: peer, session: sess, err: err}) })
	case *flushDone:
		ctx.Send(m.session, TxFlushed{Peer: m.peer, Err: m.err})
	case *workerClose:
		key := string(m.Route.AgentAddr)
		s.closeEndpoint(ctx, key)
	case *endpointClosed:
		if m.err != nil {
			s.log.Warn().Err(m.err).Msg("endpoint close")
		}
		for pid, ops := range m.retired {
			ctx.Send(pid, TxRetired{Ops: ops})
		}
	case *workerSend:
		s.send(m.To, m.Frame)
	case WorkerCrash:
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
		s.closing.Wait()
		for id, c := range s.conns {
			_ = c.Close()
			delete(s.conns, id)
		}
	}
}

func (s *workerSlot) endpoint(r *Route) (rdma.Endpoint, error) {
	key := string(r.AgentAddr)
	if ep := s.eps[key]; ep != nil {
		return ep, nil
	}
	ep, err := s.agent.Connect(r.AgentAddr)
	if err != nil {
		return nil, fmt.Errorf("worker %d: connect to %s: %w", s.idx, r.Peer, err)
	}
	s.eps[key] = ep
	return ep, nil
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
	s.closing.Add(1)
	go func() {
		defer s.closing.Done()
		err := ep.Close()
		sys.Root.Send(self, &endpointClosed{retired: retired, err: err})
	}()
}

// restart handles a crash: every op in flight is in doubt until its
// endpoint is closed, which retires it.
func (s *workerSlot) restart(ctx actor.Context) {
	doubt := map[*actor.PID][]OpRef{}
	for ref, in := range s.inflight {
		doubt[in.session] = append(doubt[in.session], ref)
	}
	for pid, ops := range doubt {
		ctx.Send(pid, TxInDoubt{Ops: ops, Reason: fmt.Errorf("%w: worker %d", ErrWorkerCrashed, s.idx)})
	}
	for key := range s.eps {
		s.closeEndpoint(ctx, key)
	}
	for id, c := range s.conns {
		_ = c.Close()
		delete(s.conns, id)
	}
}

func (s *workerSlot) send(to messages.PeerID, f messages.Frame) {
	c := s.conns[to]
	if c == nil {
		var err error
		if c, err = s.link.Dial(to); err != nil {
			s.stats.FramesUnsent.Add(1)
			s.log.Warn().Err(err).Str("peer", to.String()).Msg("dial failed")
			return
		}
		s.conns[to] = c
	}
	if err := c.Send(f); err != nil {
		s.stats.FramesUnsent.Add(1)
		if !errors.Is(err, control.ErrPeerGone) {
			s.log.Warn().Err(err).Str("peer", to.String()).Msg("send failed")
		}
		_ = c.Close()
		delete(s.conns, to)
	}
}
