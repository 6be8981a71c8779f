package actors

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// Messages a worker receives.
type (
	// A stream's messages name the stream actor that sent them (stream)
	// and the session its reports go to (session).
	workerSubmit struct {
		Submit
		session, stream *actor.PID
	}
	workerFlush struct {
		Flush
		session, stream *actor.PID
	}
	workerClose struct {
		CloseEndpoint
		session, stream *actor.PID
	}
	workerSend struct {
		SendFrame
		// report, when set, gets the outcome: TxSent{Peer} for a peer
		// stream's terminal frame (FromStream), else RxSent{Writer: writer}.
		report *actor.PID
		writer int
		// stream is the peer stream whose terminal frame this is (nil for
		// frames of no stream).
		stream *actor.PID
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
		retired []core.SessionOps[*actor.PID]
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
	// workerPeerDown: the control plane declared peer down
	// (Engine.PeerDown). The worker closes its connection to it: a peer
	// that never comes back (an instance scaled away, a name not seen
	// again) would otherwise keep a connection per worker — over zmq a
	// DEALER socket redialling a dead endpoint — for the engine's life.
	// One that comes back is dialled afresh by the next frame to it.
	workerPeerDown struct{ peer messages.PeerID }
	// workerWarm: peer was heard (Engine.PeerAlive): the worker dials its
	// connection to it now, unless it has one, so that its first frame
	// to the peer finds the connection up. Dialled by that frame instead,
	// the connection was not up yet: a RequestData was refused (counted
	// unsent) and re-sent 20 ms later (core's resendFirst), a terminal
	// frame waited in the backlog.
	workerWarm struct{ peer messages.PeerID }
	// connRetired comes back from the goroutine that closed a down
	// peer's connection: the frames that waited for it go out.
	connRetired struct{ peer messages.PeerID }
)

// workerSlot is a worker's state that survives restarts: its endpoints, its
// control connections and the ops it has in flight. Only the worker actor
// touches it, but for opened, which connector goroutines fill.
type workerSlot struct {
	idx   int
	agent rdma.Agent
	reg   rdma.Registration
	link  control.Link
	// table holds the endpoints, the Connects running with what waits for
	// them, and the ops in flight (core.WorkerTable).
	table      workerTable
	conns      map[messages.PeerID]control.Conn
	log        zerolog.Logger
	env        *shellEnv // its warning throttle and clock
	stats      *Counters
	openedMu   sync.Mutex
	opened     map[string]connectResult // Connect results not yet taken
	background sync.WaitGroup           // closer and connector goroutines still running
	// retiring holds, per peer whose connection a goroutine is closing
	// (workerPeerDown), the frames to it that wait until it is closed.
	retiring map[messages.PeerID][]*workerSend
	// rewarm: peers heard (workerWarm) while their connection was
	// retiring: dialled once it has closed (connRetired).
	rewarm map[messages.PeerID]bool
	// sending is the frame being handed to the control plane (nil
	// between sends): a crash inside the send reports it (restart).
	sending *workerSend
	// peerKey is the address each peer's ops last went to; stale holds
	// the addresses a peer left for another (a restarted rank's new
	// agent): their endpoints are closed once no op is in flight on them
	// (retireStale), instead of staying open — a copier goroutine, and
	// for shm a mapping of the gone peer's pool — until the engine closes.
	peerKey map[messages.PeerID]string
	stale   map[string]bool
	// unproven are the ops of endpoints whose Close could not prove them
	// over (rdma.ErrCloseUnproven), with their sessions: they stay in
	// doubt for good, also when the worker stops (workerDead carries
	// them, and the tx parent gives each session only its own: a later
	// session may reuse a request id, and so an op's ref). Closer
	// goroutines append to it; a session's entries go once it has
	// stopped (the worker watches it from its endpointClosed on: its
	// Terminated), as nothing can tell it of its ops any more.
	unprovenMu sync.Mutex
	unproven   []core.SessionOps[*actor.PID]
	// closed are the closers' reports (endpointClosed) the worker has not
	// handled yet, under unprovenMu: one that comes after the worker
	// stopped for good is lost with its mailbox, so its stop carries what
	// those reports proved (releasedOps).
	closed []*endpointClosed
	// closing names the endpoints whose Close a closer goroutine is
	// running, by endpoint (seq), under unprovenMu: Engine.Close names
	// them while it waits for the worker to stop (awaitWorker). live
	// names, the same way, every endpoint a Connect returned whose Close
	// has not returned (open, not yet taken from opened, or closing), and
	// connects the Connects running: what Engine.Close names when it
	// gives up on the worker (giveUp).
	seq      uint64
	closing  map[uint64]string
	live     map[uint64]string
	connects map[uint64]string
	// liveSeq is the seq of each open endpoint of the table, by key.
	liveSeq map[string]uint64
	// givenUp: Engine.Close gave up waiting for the worker to stop
	// (giveUp). It keeps the memory for what the worker started, so from
	// then on the worker starts nothing: it posts no op (refused), and an
	// endpoint a Connect opens is closed at once, unused.
	givenUp atomic.Bool
	// stopped is closed once the worker's Stopping has returned: every
	// close it started has returned, so no write of its endpoints lands.
	stopped chan struct{}
}

// closesRunning names the endpoints whose Close has not returned yet.
func (s *workerSlot) closesRunning() []string {
	s.unprovenMu.Lock()
	defer s.unprovenMu.Unlock()
	names := make([]string, 0, len(s.closing))
	for _, n := range s.closing {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// giveUp marks the worker given up (givenUp) and names its endpoints
// whose writes are not proven over, and its Connects running (one whose
// endpoint returns from now on closes it at once).
func (s *workerSlot) giveUp() (endpoints, connects []string) {
	s.unprovenMu.Lock()
	defer s.unprovenMu.Unlock()
	s.givenUp.Store(true)
	for _, n := range s.live {
		endpoints = append(endpoints, n)
	}
	for _, n := range s.connects {
		connects = append(connects, n)
	}
	slices.Sort(endpoints)
	slices.Sort(connects)
	return slices.Compact(endpoints), slices.Compact(connects)
}

// endpointName names key's endpoint for a log: the peers whose ops go to
// it, else the peer its agent says it serves, else its address.
func (s *workerSlot) endpointName(key string, ep rdma.Endpoint) string {
	var peers []string
	for p, k := range s.peerKey {
		if k == key {
			peers = append(peers, p.String())
		}
	}
	if len(peers) > 0 {
		slices.Sort(peers)
		return strings.Join(peers, ",")
	}
	if id, ok := ep.(rdma.IdentifiedEndpoint); ok && id.PeerIdentity() != "" {
		return id.PeerIdentity()
	}
	return fmt.Sprintf("agent address %x", key)
}

// unprovenOps returns the ops whose endpoint's close proved nothing, of
// the sessions not known to have stopped.
func (s *workerSlot) unprovenOps() []core.SessionOps[*actor.PID] {
	s.unprovenMu.Lock()
	defer s.unprovenMu.Unlock()
	return slices.Clone(s.unproven)
}

// sessionStopped forgets the unproven ops of a session that has stopped:
// nothing can tell it of them any more, and its request id (so its ops'
// refs) may come back with a later session.
func (s *workerSlot) sessionStopped(session *actor.PID) {
	s.unprovenMu.Lock()
	defer s.unprovenMu.Unlock()
	s.unproven = slices.DeleteFunc(s.unproven, func(so core.SessionOps[*actor.PID]) bool { return so.Session.Equal(session) })
}

// tx is what session hears of the stop: the ops of its own in doubt and
// released (those of a stopped session with the same request id, so the
// same refs, are not its).
func (m *workerDead) tx(session *actor.PID) TxWorkerDead {
	return TxWorkerDead{Worker: m.worker, InDoubt: opsOf(m.inDoubt, session), Released: opsOf(m.released, session)}
}

// opsOf returns the ops of sos that belong to session.
func opsOf(sos []core.SessionOps[*actor.PID], session *actor.PID) []core.OpRef {
	var out []core.OpRef
	for _, so := range sos {
		if so.Session.Equal(session) {
			out = append(out, so.Ops...)
		}
	}
	return out
}

// releasedOps returns the ops of the close reports the worker never
// handled (it stopped first) whose close proved their sources released
// but not their writes over (rdma.ErrCloseUnproven with
// rdma.ErrSourcesReleased, as endpointClosed reads it). Read once the
// worker has stopped.
func (s *workerSlot) releasedOps() []core.SessionOps[*actor.PID] {
	s.unprovenMu.Lock()
	defer s.unprovenMu.Unlock()
	var out []core.SessionOps[*actor.PID]
	for _, m := range s.closed {
		if errors.Is(m.err, rdma.ErrCloseUnproven) && errors.Is(m.err, rdma.ErrSourcesReleased) {
			out = append(out, m.retired...)
		}
	}
	return out
}

// takeClosed marks a closer's report handled.
func (s *workerSlot) takeClosed(m *endpointClosed) {
	s.unprovenMu.Lock()
	defer s.unprovenMu.Unlock()
	if i := slices.Index(s.closed, m); i >= 0 {
		s.closed = slices.Delete(s.closed, i, i+1)
	}
}

type connectResult struct {
	ep  rdma.Endpoint
	err error
	seq uint64 // the endpoint's, in live
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
		table: env.workerTable(idx), conns: map[messages.PeerID]control.Conn{}, retiring: map[messages.PeerID][]*workerSend{},
		log: log.With().Int("worker", idx).Logger(), stats: stats, opened: map[string]connectResult{},
		peerKey: map[messages.PeerID]string{}, stale: map[string]bool{},
		closing: map[uint64]string{}, live: map[uint64]string{}, connects: map[uint64]string{}, liveSeq: map[string]uint64{},
		stopped: make(chan struct{})}
}

func (w *workerActor) Receive(ctx actor.Context) {
	s := w.slot
	observeWorker(s.idx, ctx.Message())
	switch m := ctx.Message().(type) {
	case *workerSubmit:
		if hoptrace.On {
			hoptrace.Mark("worker.submit", m.Op.Request)
		}
		// Record first: if anything below panics, the restart knows the op.
		key := s.addrKey(m.Route)
		s.table.Admit(m.Op, m.session, key)
		s.submit(ctx, m, key)
	case *batchDone:
		if hoptrace.On {
			hoptrace.Mark("worker.batchDone", m.op.Request)
		}
		unproven := m.err != nil && errors.Is(m.err, rdma.ErrCloseUnproven)
		if k, ok := s.unprovenKey(m.op, unproven); ok {
			// The backend cut the batch on the wire with its endpoint
			// before we closed it (UCX's endpoint error, a failed link):
			// its writes may still land. The op stays in flight on the
			// endpoint, which is closed now: only its Close can say
			// whether the backend still reads the op's source
			// (endpointClosed), and nothing more can be posted through it
			// anyway. Later ops to the peer connect afresh.
			ctx.Send(m.session, TxCompleted{Op: m.op, Err: m.err, Unproven: true})
			delete(s.stale, k)
			s.closeEndpoint(ctx, k)
			break
		}
		var key string // a stale address's, whose last op may be this one
		if len(s.stale) > 0 {
			if k, ok := s.table.KeyOf(m.op); ok && s.stale[k] {
				key = k
			}
		}
		s.table.Settle(m.op)
		ctx.Send(m.session, TxCompleted{Op: m.op, Err: m.err, Unproven: unproven})
		if key != "" {
			s.retireStale(ctx, key)
		}
	case *workerFlush:
		s.flush(ctx, m)
	case *flushDone:
		ctx.Send(m.session, TxFlushed{Peer: m.peer, Err: m.err})
	case *workerClose:
		s.close(ctx, m)
	case *endpointOpened:
		s.connected(ctx, m.key)
	case *endpointClosed:
		s.takeClosed(m)
		if errors.Is(m.err, rdma.ErrCloseUnproven) {
			n := 0
			for _, so := range m.retired {
				n += len(so.Ops)
				// Its ops stay in unproven until it has stopped (its
				// Terminated; at once if it already has).
				if so.Session != nil {
					ctx.Watch(so.Session)
				}
			}
			if errors.Is(m.err, rdma.ErrSourcesReleased) {
				// No proof that the writes are over, but the backend reads
				// none of their sources any more: their sessions may
				// unpin the source pages, and end those streams without a
				// terminal frame (the peer's pages wait for its own proof
				// or quarantine).
				s.log.Warn().Err(m.err).Int("ops_in_doubt", n).
					Msg("endpoint closed without proof that its writes are over, but with their sources released: their requests release their source pages and tell the peer nothing")
				for _, so := range m.retired {
					ctx.Send(so.Session, TxRetired{Ops: so.Ops, Unproven: true})
				}
				break
			}
			// No proof: the ops stay in doubt, so their sessions keep
			// their pins and send no terminal frame (the peer's pages
			// wait for its own proof or quarantine).
			s.log.Error().Err(m.err).Int("ops_in_doubt", n).
				Msg("endpoint closed without proof that its writes are over: its ops stay in doubt and their requests keep their pages")
			break
		}
		if m.err != nil {
			s.log.Warn().Err(m.err).Msg("endpoint close")
		}
		for _, so := range m.retired {
			ctx.Send(so.Session, TxRetired{Ops: so.Ops})
		}
	case *workerSend:
		if q, ok := s.retiring[m.To]; ok {
			s.retiring[m.To] = append(q, m)
			break
		}
		s.deliver(ctx, m)
	case workerPeerDown:
		if c := s.conns[m.peer]; c != nil {
			// Closed on a goroutine of its own: Close waits up to
			// closeLinger for what it queued to leave (zmq). Frames to the
			// peer wait in retiring until it returns, so that none, on a
			// new connection, overtakes one queued on the old.
			delete(s.conns, m.peer)
			s.retiring[m.peer] = nil
			sys, self, peer := ctx.ActorSystem(), ctx.Self(), m.peer
			s.background.Add(1)
			go func() {
				defer s.background.Done()
				s.closeConn(peer, c)
				sys.Root.Send(self, &connRetired{peer: peer})
			}()
		}
		s.forgetPeerKey(ctx, m.peer)
	case workerWarm:
		// Not while an old connection to it closes: frames wait for that
		// (retiring), and it is dialled once that one has closed.
		if _, retiring := s.retiring[m.peer]; retiring {
			if s.rewarm == nil {
				s.rewarm = map[messages.PeerID]bool{}
			}
			s.rewarm[m.peer] = true
			break
		}
		s.warm(m.peer)
	case *connRetired:
		q := s.retiring[m.peer]
		delete(s.retiring, m.peer)
		for _, w := range q {
			s.deliver(ctx, w)
		}
		if s.rewarm[m.peer] {
			delete(s.rewarm, m.peer)
			s.warm(m.peer)
		}
	case *actor.Terminated:
		// A session watched for its unproven ops (endpointClosed).
		s.sessionStopped(m.Who)
	case workerCrash:
		panic(fmt.Sprintf("worker %d: crash requested", s.idx))
	case *actor.Restarting:
		s.stats.WorkerRestarts.Add(1)
		s.log.Warn().Int("in_flight", s.table.InFlight()).Msg("worker restarting: ops in doubt, closing endpoints")
		s.restart(ctx)
	case *actor.Stopping:
		// Shutting down: wait for every closer, so that once the worker has
		// stopped no write of its endpoints can land and no goroutine of it
		// is left. (The only wait a worker does, at the end of its life.)
		for _, key := range s.table.Keys() {
			s.closeEndpoint(ctx, key)
		}
		s.background.Wait()
		// Frames that waited for a down peer's old connection to close
		// (workerPeerDown): it has closed, but its connRetired comes
		// after this stop and would never be handled. They go out now,
		// in order, on a new connection — a terminal frame among them
		// may be the only proof its peer gets that our writes are over.
		for peer, q := range s.retiring {
			delete(s.retiring, peer)
			for _, w := range q {
				s.deliver(ctx, w)
			}
		}
		// What connectors opened after the actor last looked: nothing
		// will post through it.
		for key, r := range s.opened {
			if r.ep != nil {
				_ = r.ep.Close()
				s.unprovenMu.Lock()
				delete(s.live, r.seq)
				s.unprovenMu.Unlock()
			}
			delete(s.opened, key)
		}
		for id, c := range s.conns {
			s.closeConn(id, c)
			delete(s.conns, id)
		}
		close(s.stopped)
	}
}

// submit posts an op's batch through its peer's endpoint, once there is
// one; the op is refused if the endpoint cannot be opened or the post is
// refused. key is m.Route.AgentAddr's string (the table's key of the op).
func (s *workerSlot) submit(ctx actor.Context, m *workerSubmit, key string) {
	if s.givenUp.Load() {
		s.refuse(ctx, m, fmt.Errorf("worker %d: %w: the engine's Close gave up waiting for this worker to stop, so it posts nothing more", s.idx, ErrClosed))
		return
	}
	ep, open, queued := s.table.Endpoint(key, m)
	if queued {
		return
	}
	if !open {
		s.connect(ctx, m.Route, m)
		return
	}
	if id, ok := ep.(rdma.IdentifiedEndpoint); ok {
		// The agent at the address the peer's Hello named must serve that
		// peer: a peer may name another instance's agent (and pass on a
		// key of its), which would land this op in that instance's pool.
		if got := id.PeerIdentity(); got != "" && got != m.Route.Peer.String() {
			s.refuse(ctx, m, fmt.Errorf("worker %d: %w: the agent at the address %s's Hello named serves %s, not %s",
				s.idx, rdma.ErrBadAddress, m.Route.Peer, got, m.Route.Peer))
			return
		}
	}
	s.usePeerKey(ctx, m.Route.Peer, key)
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

// addrKey is r's agent address as the worker's table key: the string
// the peer's ops last went to (peerKey) when the address is that one, so
// that an op to a known address converts nothing, else a new string.
func (s *workerSlot) addrKey(r *Route) string {
	if k, ok := s.peerKey[r.Peer]; ok && k == string(r.AgentAddr) {
		return k
	}
	return string(r.AgentAddr)
}

// usePeerKey notes that peer's ops now go to key. An address the peer
// used before is stale (the peer came back with a new agent: a restarted
// rank): its endpoint is closed once nothing is in flight on it.
func (s *workerSlot) usePeerKey(ctx actor.Context, peer messages.PeerID, key string) {
	prev, ok := s.peerKey[peer]
	if ok && prev == key {
		return
	}
	s.peerKey[peer] = key
	delete(s.stale, key)
	if ok {
		s.stale[prev] = true
		s.retireStale(ctx, prev)
	}
}

// forgetPeerKey: peer is down. Its address's endpoint is closed once
// nothing is in flight on it (retireStale), as a restarted peer's old
// address is: a peer that never comes back (an instance scaled away)
// would otherwise keep it for the engine's life — over shm a mapping of
// its whole pool file, whose pages stay allocated after the file is
// unlinked, and a copier goroutine. One that comes back connects afresh.
func (s *workerSlot) forgetPeerKey(ctx actor.Context, peer messages.PeerID) {
	key, ok := s.peerKey[peer]
	if !ok {
		return
	}
	delete(s.peerKey, peer)
	for _, k := range s.peerKey {
		if k == key {
			return // another peer's address too
		}
	}
	s.stale[key] = true
	s.retireStale(ctx, key)
}

// retireStale closes a stale address's endpoint if no op is in flight on
// it (the last one's completion calls it again): closing an idle endpoint
// retires nothing, and a later op to that address connects afresh.
func (s *workerSlot) retireStale(ctx actor.Context, key string) {
	if s.table.InFlightOn(key) > 0 {
		return
	}
	delete(s.stale, key)
	if _, open := s.table.Lookup(key); open {
		s.closeEndpoint(ctx, key)
	}
}

// refuse answers an op that was never posted.
func (s *workerSlot) refuse(ctx actor.Context, m *workerSubmit, err error) {
	s.table.Settle(m.Op)
	ctx.Send(m.session, TxCompleted{Op: m.Op, Err: err, Refused: true})
}

// flush flushes the peer's endpoint behind everything posted to it; with
// no endpoint there is nothing to flush.
func (s *workerSlot) flush(ctx actor.Context, m *workerFlush) {
	ep, open, queued := s.table.Endpoint(s.addrKey(m.Route), m)
	if queued {
		return
	}
	if !open {
		ctx.Send(m.session, TxFlushed{Peer: m.Peer})
		return
	}
	sys, self, peer, sess := ctx.ActorSystem(), ctx.Self(), m.Peer, m.session
	ep.Flush(func(err error) { sys.Root.Send(self, &flushDone{peer: peer, session: sess, err: err}) })
}

// close closes the peer's endpoint for a stream whose ops on it are in
// doubt: the close is what proves them over. It is the stream's, not the
// peer's: when none of the stream's ops is on the endpoint open now (the
// endpoint they were posted on was closed already — by another request's
// close, or by a restart — and its close retires them when it returns,
// or proved nothing), closing this one proves nothing for the stream and
// would only cut the writes of the requests posted on it since, failing
// them.
func (s *workerSlot) close(ctx actor.Context, m *workerClose) {
	key := s.addrKey(m.Route)
	if _, _, queued := s.table.Endpoint(key, m); queued {
		return
	}
	if !s.table.Carries(key, m.session, m.Peer) {
		return
	}
	s.closeEndpoint(ctx, key)
}

// connect opens an endpoint to r's peer without blocking the worker: a
// connector goroutine calls Connect (which may wait for the peer, a UCX
// handshake for instance), leaves the result in opened and tells the
// worker, which then handles m and whatever came for that peer meanwhile,
// in order.
func (s *workerSlot) connect(ctx actor.Context, r *Route, m any) {
	key := string(r.AgentAddr)
	s.table.Connecting(key, m)
	sys, self := ctx.ActorSystem(), ctx.Self()
	agent, addr, idx, peer := s.agent, r.AgentAddr, s.idx, r.Peer
	s.unprovenMu.Lock()
	s.seq++
	seq := s.seq
	s.connects[seq] = peer.String()
	s.unprovenMu.Unlock()
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		ep, err := agent.Connect(addr)
		if err != nil {
			err = fmt.Errorf("worker %d: connect to %s: %w", idx, peer, err)
		}
		// Named live, or found given up, in the lock section giveUp
		// takes: each endpoint is either named by Engine.Close or closed
		// here.
		s.unprovenMu.Lock()
		delete(s.connects, seq)
		late := s.givenUp.Load()
		if err == nil && !late {
			s.live[seq] = peer.String()
		}
		s.unprovenMu.Unlock()
		if late && err == nil {
			cerr := ep.Close()
			ep = nil
			err = fmt.Errorf("worker %d: connect to %s: %w: it returned after the engine's Close gave up waiting for the worker; its endpoint was closed unused", idx, peer, ErrClosed)
			s.log.Warn().AnErr("close", cerr).Str("peer", peer.String()).
				Msg("connect returned after engine close gave up on the worker: endpoint closed at once, nothing posted through it")
		}
		s.openedMu.Lock()
		s.opened[key] = connectResult{ep: ep, err: err, seq: seq}
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
	if r.err == nil {
		s.liveSeq[key] = r.seq
	}
	waiting := s.table.Connected(key, r.ep, r.err)
	if r.err == nil && s.givenUp.Load() {
		// Engine.Close gave up on the worker after this Connect returned:
		// nothing is posted through it (its submits are refused).
		s.closeEndpoint(ctx, key)
	}
	for _, m := range waiting {
		switch m := m.(type) {
		case *workerSubmit:
			if r.err != nil {
				s.refuse(ctx, m, r.err)
				continue
			}
			s.submit(ctx, m, key)
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
// were in flight on it — unless Close says it could not prove that
// (rdma.ErrCloseUnproven): then they stay in doubt, towards the peer and,
// unless Close also says the backend reads none of their sources any more
// (rdma.ErrSourcesReleased: TxRetired{Unproven}), towards their sources.
func (s *workerSlot) closeEndpoint(ctx actor.Context, key string) {
	ep, retired, ok := s.table.Close(key)
	if !ok {
		return
	}
	sys, self := ctx.ActorSystem(), ctx.Self()
	seq, known := s.liveSeq[key]
	delete(s.liveSeq, key)
	s.unprovenMu.Lock()
	if !known { // every endpoint of the table came from connected
		s.seq++
		seq = s.seq
	}
	s.closing[seq] = s.endpointName(key, ep)
	s.unprovenMu.Unlock()
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		err := ep.Close()
		m := &endpointClosed{retired: retired, err: err}
		s.unprovenMu.Lock()
		delete(s.closing, seq)
		delete(s.live, seq)
		if errors.Is(err, rdma.ErrCloseUnproven) {
			s.stats.ClosesUnproven.Add(1)
			s.unproven = append(s.unproven, retired...)
		}
		s.closed = append(s.closed, m)
		s.unprovenMu.Unlock()
		sys.Root.Send(self, m)
	}()
}

// unprovenKey is the key of the endpoint still open that op's batch was
// cut on without proof (unproven), for batchDone to close; false for a
// batch that completed otherwise (the common case: no table lookup).
func (s *workerSlot) unprovenKey(op core.OpRef, unproven bool) (string, bool) {
	if !unproven {
		return "", false
	}
	k, ok := s.table.KeyOf(op)
	if !ok {
		return "", false
	}
	_, open := s.table.Lookup(k)
	return k, open
}

// sent is the report of a send's outcome.
func (m *workerSend) sent(err error) any {
	if m.FromStream {
		return TxSent{Peer: m.Peer, Err: err}
	}
	return RxSent{Writer: m.writer, Err: err}
}

// restart handles a crash: every op posted on an endpoint is in doubt
// until the endpoint is closed, which retires it; ops never posted are
// refused.
func (s *workerSlot) restart(ctx actor.Context) {
	crashed := fmt.Errorf("%w: worker %d", ErrWorkerCrashed, s.idx)
	if m := s.sending; m != nil {
		// The crash came inside a send: whether the frame left is not
		// known. A stream's terminal frame counts as not sent (its
		// session fails rather than claim DONE; its ops are quiescent
		// either way). A RequestData gets no report: "not sent" would
		// tell the generation side that writer never learnt of the
		// request, which is not proven; its deadline covers it.
		s.sending = nil
		if m.report != nil && m.FromStream {
			ctx.Send(m.report, m.sent(crashed))
		}
	}
	refused, doubt, keys := s.table.Restart(func(m any) bool { _, ok := m.(*workerSubmit); return ok })
	for _, so := range refused {
		for _, ref := range so.Ops {
			ctx.Send(so.Session, TxCompleted{Op: ref, Err: crashed, Refused: true})
		}
	}
	for _, so := range doubt {
		ctx.Send(so.Session, TxInDoubt{Ops: so.Ops, Reason: crashed})
	}
	for _, key := range keys {
		s.closeEndpoint(ctx, key)
	}
	clear(s.stale) // every endpoint is closing
	for id, c := range s.conns {
		s.closeConn(id, c)
		delete(s.conns, id)
	}
}

// deliver hands a frame to the control plane and reports to its sender
// whether it left.
func (s *workerSlot) deliver(ctx actor.Context, m *workerSend) {
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("worker.send.%T", m.Frame), m.Frame.Request())
	}
	s.sending = m
	err := s.send(m.To, m.Frame)
	s.sending = nil
	if m.report != nil {
		ctx.Send(m.report, m.sent(err))
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

// warm dials the connection to peer unless there is one (workerWarm). A
// dial that fails is left to the first frame to the peer, which dials
// again and reports it.
func (s *workerSlot) warm(peer messages.PeerID) {
	if s.conns[peer] != nil {
		return
	}
	if c, err := s.link.Dial(peer); err == nil {
		s.conns[peer] = c
	}
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
		switch {
		case errors.Is(err, control.ErrQueueFull) && messages.Terminal(f):
			// A terminal frame refused for space (zmq's
			// ErrTerminalBacklogFull: its Conn's terminal backlog is full
			// too): nothing sends it later. The Conn is kept (its backlog
			// still holds earlier frames, other requests' answers); the
			// frame's sender has what it needs to act (a stream's Result
			// fails its session, an rx session resends its Cancel), the
			// rest is said here, naming the request.
			if ev := s.sampled(to, "terminal refused"); ev != nil {
				ev.Err(err).Str("peer", to.String()).Str("frame", fmt.Sprintf("%T", f)).Str("request", f.Request()).
					Msg("terminal frame NOT sent: its connection's backlog is full, nothing will send it")
			}
			return err
		case errors.Is(err, control.ErrQueueFull):
			// The connection is not up yet or its queue is full: what it
			// queued stays queued (terminal frames wait in its backlog), so
			// it is kept; the caller may try again.
			// Debug, not a warning: the caller retries with backoff (a
			// RequestData), and a refusal that lasts ends the request
			// with an error naming it ("RequestData never reached
			// writer …"). At startup, before the connection is up, every
			// first RequestData lands here.
			s.log.Debug().Err(err).Int("worker", s.idx).Str("peer", to.String()).Msg("send refused, will retry")
			return err
		case frameError(err):
			// About this frame alone (invalid, too large): the connection
			// is fine, and closing it would drop what it still queues for
			// other requests.
			if ev := s.sampled(to, "frame refused"); ev != nil {
				ev.Err(err).Str("peer", to.String()).Str("frame", fmt.Sprintf("%T", f)).Str("request", f.Request()).
					Msg("frame refused, connection kept")
			}
			return err
		}
		if !errors.Is(err, control.ErrPeerGone) {
			s.sampled(to, "send").Err(err).Str("peer", to.String()).Msg("send failed")
		}
		delete(s.conns, to)
		s.closeConn(to, c)
		return err
	}
	return nil
}

// closeConn closes c, the connection to peer. Terminal frames it had
// accepted and dropped unsent (zmq's ErrTerminalDropped: its linger ran
// out, the link closed, its socket failed) are counted unsent and said,
// with the peer and the count: the requests they answer get no answer
// from us. Safe on a closer goroutine (atomics and the throttle only).
func (s *workerSlot) closeConn(peer messages.PeerID, c control.Conn) {
	err := c.Close()
	if err == nil {
		return
	}
	if n, ok := terminalDropped(err); ok {
		s.stats.FramesUnsent.Add(int64(n))
		s.sampled(peer, "terminal dropped").Err(err).Str("peer", peer.String()).Int("dropped", n).
			Msg("connection closed with terminal frames it had accepted dropped unsent: their requests get no answer from us")
		return
	}
	s.log.Debug().Err(err).Str("peer", peer.String()).Msg("connection close")
}

// frameError reports whether err, from a Conn's Send, is about the frame
// alone (invalid, or refused: too large), not the connection.
func frameError(err error) bool {
	return errors.Is(err, messages.ErrInvalid) || errors.Is(err, control.ErrFrameRefused)
}

// terminalDropped reports whether err, from a Conn's Close, says it dropped
// frames it had accepted, and how many (at least 1).
func terminalDropped(err error) (int, bool) {
	if !errors.Is(err, control.ErrFramesDropped) {
		return 0, false
	}
	var d *control.FramesDropped
	if errors.As(err, &d) && d.N > 0 {
		return d.N, true
	}
	return 1, true
}
