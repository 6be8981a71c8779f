package sim

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// ctxRank is one context rank: its pools, workers, the tx parent's table
// and its TxSessions. A death discards it all; a return boots a fresh
// incarnation.
type ctxRank struct {
	s          *Sim
	idx        int
	rank       kvcache.Rank
	inc        int
	alive      bool
	self       messages.PeerID
	poolBlocks int
	pad        uint64
	skew       time.Duration

	shape   kvcache.Shape
	topo    actors.Topology
	region  *kvcache.Region
	pools   []*kvcache.Pool
	guard   *actors.Pools
	workers []*worker

	sessions map[string]*txSess
	// table is the real tx parent's table (core.TxTable): which requests
	// have a session, Send's adoptions, bound instances, tombstones.
	table  *core.TxTable
	routes map[*actors.Route]routeMeta
	apps   []*ctxApp
	// written holds, per source block, the layers (bit i: the rank's i-th
	// layer of the block's group) the serving process wrote for the
	// request that holds the block, before their fence fired.
	written map[blockKey]uint64
	// srcOwner holds, per source block, the serving process (one request)
	// that allocated it and has not freed it: the framework's kernels
	// write a chunk's KV into its blocks until the chunk's fence fires,
	// whatever the session did meanwhile.
	srcOwner map[blockKey]*ctxApp
	posted   int    // batches ever posted by this incarnation
	maxFrame uint64 // highest frame number delivered (reorder detection)
	nm       string

	// incs is the real listener's incarnation table (issue 17); this
	// incarnation is inc+1. answering is the sender's incarnation of the
	// frame being handled (the parent's replies are addressed to it).
	incs      *core.IncarnationTable
	answering uint64
	// leases are the real tx parent's writer leases (FaultWriterLease);
	// leaseArmed: a lease check is scheduled.
	leases     *core.PeerLeases
	leaseArmed bool
	// failed: a sender worker stopped for good (FaultWorkerDead); the
	// engine refuses new work (ErrEngineFailed).
	failed bool
	// exitDue: an endpoint close of this incarnation proved nothing
	// (FaultCloseUnproven): its process exit is scheduled, at exitAt.
	exitDue bool
	exitAt  time.Duration
	// backAt: the rank is down and its next incarnation boots then (0:
	// up, or down for good); frames sent to it meanwhile wait for it
	// (linkSend).
	backAt time.Duration
	// cancelReasons: the reason of the first Cancel of each request that
	// was not held: a Send refused after it (ErrPeerCancelled: it came
	// before Send) must name it — the refusal for good of a RequestData
	// (FaultFrameRefused) the writer never got, say.
	cancelReasons map[string]string
}

// renewLease is txParent.renewLease: a sign of peer's life renews the
// writer's lease on it, and a check is armed for the earliest lapse.
func (c *ctxRank) renewLease(peer messages.PeerID) {
	if c.leases.TTL() <= 0 {
		return
	}
	c.leases.Renew(peer, c.now())
	c.armLease()
}

func (c *ctxRank) armLease() {
	next := c.leases.Next(c.now())
	if c.leaseArmed || next.IsZero() {
		return
	}
	c.leaseArmed = true
	inc := c.inc
	c.s.after(max(next.Sub(c.now()), 0), c.parentName(), "leaseTick", func() {
		if c.live(inc) {
			c.leaseLapsed()
		}
	})
}

// leaseLapsed is txParent.leaseLapsed: the writer fences itself from each
// peer whose lease lapsed (TxPeerGone to every session).
func (c *ctxRank) leaseLapsed() {
	c.leaseArmed = false
	for _, peer := range c.leases.Expired(c.now()) {
		c.s.fired(FaultWriterLease)
		c.peerDown(peer, 0, "")
	}
	c.armLease()
}

// incarnation is the rank's current incarnation number (Hello.Incarnation).
func (c *ctxRank) incarnation() uint64 { return uint64(c.inc + 1) }

// routeMeta is what the simulator knows about a route it resolved.
type routeMeta struct {
	gen, genInc int
	epoch       uint64
	request     string
}

func (c *ctxRank) name() string { return c.nm }

func (c *ctxRank) now() time.Time { return epoch0.Add(c.s.vt + c.skew + c.s.drift(c.idx)) }

// live reports whether incarnation inc of the rank is the one running.
func (c *ctxRank) live(inc int) bool { return c.alive && c.inc == inc }

func (c *ctxRank) boot() {
	s := c.s
	c.nm = fmt.Sprintf("ctx%d.%d", c.idx, c.inc)
	shape, err := s.layout.Shape(s.ctxPar, c.rank)
	if err != nil {
		s.failf("ctx shape: %v", err)
		return
	}
	c.shape = shape
	region, pools, geoms, err := rankPools(s.layout, shape, c.poolBlocks, c.pad)
	if err != nil {
		s.failf("ctx pools: %v", err)
		return
	}
	s.regions = append(s.regions, region)
	c.alive, c.backAt = true, 0
	c.region, c.pools, c.guard = region, pools, actorsPools(pools)
	// Half the ranks (by seed) run as over a backend whose completions
	// prove delivery (the simulated backend's do: a batch lands before its
	// completion is mailed), so their streams send Result with no flush.
	c.topo = actors.Topology{Layout: s.layout, LayoutHash: s.layoutHash, Parallel: s.ctxPar, Rank: c.rank, Pools: geoms,
		CompletionsDeliver: (s.cfg.Seed+uint64(c.idx))%2 == 1}
	c.sessions, c.table = map[string]*txSess{}, core.NewTxTable(4096)
	c.incs = core.NewIncarnationTable(c.incarnation())
	c.leases, c.leaseArmed = core.NewPeerLeases(s.faults.leaseTTL), false
	c.routes = map[*actors.Route]routeMeta{}
	c.written, c.srcOwner = map[blockKey]uint64{}, map[blockKey]*ctxApp{}
	c.posted, c.maxFrame, c.apps, c.failed, c.exitDue = 0, 0, nil, false, false
	c.cancelReasons = map[string]string{}
	c.workers = nil
	for i := range s.ctxW {
		c.workers = append(c.workers, &worker{s: s, c: c, inc: c.inc, idx: i,
			tbl: core.NewWorkerTable[*txSess, *endpoint]()})
	}
}

func (c *ctxRank) parentName() string { return c.name() + "/parent" }

// txSess is one TxSession and what the simulator tracks about it.
type txSess struct {
	c     *ctxRank
	inc   int
	id    string
	name  string
	s     *actors.TxSession
	app   *ctxApp
	stop  bool
	first actors.TxState
	// decided: first holds the first terminal state; opsAtDecision is the
	// number of ops then (no op may be admitted after).
	decided       bool
	opsAtDecision int
	violations    int
	deadlineFired bool
	deadlineVT    time.Duration // when its deadline timer fires (virtual time)
	appFinished   bool          // Finish went to the serving process
	handed        []handedPart  // per session chunk index, what was handed
	cur           handedPart    // the request chunk (part) being stepped
	opSegs        map[actors.OpRef][]kvcache.Segment
	opEpoch       map[actors.OpRef]uint64
	lateOps       map[actors.OpRef]bool
	// unsent: the streams whose terminal frame the control plane refused.
	unsent map[int]error
	// refusedTo: the streams whose SUCCESS Result the control plane
	// refused for good (FaultResultRefused), and the peer each was for.
	refusedTo map[int]messages.PeerID
	// decide is the Decide effect seen (at most one, at the terminal
	// transition).
	decide *actors.Decide
	// feedback holds the failures of effects being executed (a refused
	// pin), stepped right after the effects that caused them, before any
	// other message (txActor.exec).
	feedback []any
	// pinFailed holds the (session chunk, group) pairs whose Pin was
	// refused (TxPinFailed): the session holds none of those pages, so it
	// owes no wait for that chunk's fence on them.
	pinFailed map[[2]int]bool
}

// handedPart is one TxChunk a session took: request chunk chunk, the
// layers of it (the zero value: all), and when its fence fires (virtual
// time).
type handedPart struct {
	chunk   int
	layers  kvcache.LayerPart
	fenceAt time.Duration
}

func (c *ctxRank) spawn(id string) *txSess {
	s := c.s
	ts := &txSess{c: c, inc: c.inc, id: id, name: c.name() + "/tx/" + id,
		opSegs: map[actors.OpRef][]kvcache.Segment{}, opEpoch: map[actors.OpRef]uint64{}, lateOps: map[actors.OpRef]bool{}}
	ts.s = actors.NewTxSession(actors.TxConfig{Request: id, Self: c.self, Workers: s.ctxW,
		DrainGrace: s.drainGrace, Timeout: s.orphan, Incarnation: c.incarnation()})
	c.sessions[id] = ts
	ts.deadlineVT = s.vt + s.orphan
	s.execTx(ts, ts.s.Init(c.now()))
	return ts
}

// sendTx mails msg to a session.
func (s *Sim) sendTx(from string, ts *txSess, msg any) {
	s.mail(from, ts.name, s.hop(), msg, func() { s.stepTx(ts, msg) })
}

// stepTx delivers one message to a TxSession and checks the session's
// invariants against the effects it returns.
func (s *Sim) stepTx(ts *txSess, msg any) {
	c := ts.c
	if !c.live(ts.inc) || ts.stop {
		return // dead letter
	}
	before := ts.s.State()
	// OpStates copies every op into a map (one op per chunk or layer part
	// and stream): built only for the messages whose checks read the ops
	// as they were before the step.
	var opsBefore map[actors.OpRef]actors.OpState
	switch msg.(type) {
	case actors.TxCompleted, actors.TxCancel, actors.TxPeerCancel:
		opsBefore = ts.s.OpStates()
	}
	if cm, ok := msg.(actors.TxCompleted); ok && !cm.Refused && opsBefore[cm.Op] == actors.OpSubmitting {
		// The worker reports TxSubmitted when the post returns, before
		// the completion it forwards later (workerSlot.submit).
		s.failf("%s: completion of op %v before its TxSubmitted", ts.name, cm.Op)
		return
	}
	s.txRaces(ts, msg, before, opsBefore)
	effs := ts.s.Step(msg, c.now())
	after := ts.s.State()
	if len(ts.s.Violations()) > ts.violations {
		s.failf("%s: %T: violations %v", ts.name, msg, ts.s.Violations()[ts.violations:])
		return
	}
	if before.Terminal() && after != before {
		s.failf("%s: %T: first terminal outcome %v overwritten by %v", ts.name, msg, before, after)
		return
	}
	nOps := 0
	ts.s.EachOp(func(actors.OpRef, actors.OpState) { nOps++ })
	if after.Terminal() && !ts.decided {
		ts.decided, ts.first, ts.opsAtDecision = true, after, nOps
	}
	if ts.decided && before.Terminal() && nOps > ts.opsAtDecision {
		s.failf("%s: %T: op admitted after the outcome %v (%d ops, %d at the decision)", ts.name, msg, ts.first, nOps, ts.opsAtDecision)
		return
	}
	if tm, ok := msg.(actors.TxTimeout); ok && tm.Kind == actors.TimerDeadline && after.Terminal() {
		ts.deadlineFired = true
	}
	if cm, ok := msg.(actors.TxCompleted); ok && ts.lateOps[cm.Op] && ts.deadlineFired {
		delete(ts.lateOps, cm.Op)
		s.fired(FaultLateCompletion)
	}
	if !s.checkDecide(ts, msg, before, after, effs) {
		return
	}
	if m, ok := msg.(actors.TxPeerCancel); ok {
		if s.checkRefusalCancel(ts, m, before, after); s.fail != nil {
			return
		}
	}
	if m, ok := msg.(actors.TxPeerGone); ok {
		if s.checkIncDown(ts, m, before, after); s.fail != nil {
			return
		}
	}
	if m, ok := msg.(actors.TxSent); ok {
		if s.checkResultRefused(ts, m, before, after, effs); s.fail != nil {
			return
		}
	}
	var ops map[actors.OpRef]actors.OpState
	opsAfter := func() map[actors.OpRef]actors.OpState { // built once, when a check needs it
		if ops == nil {
			ops = ts.s.OpStates()
		}
		return ops
	}
	for i, e := range effs {
		switch e := e.(type) {
		case actors.Pin:
			if before.Terminal() {
				s.failf("%s: %T: Pin after the outcome %v", ts.name, msg, before)
				return
			}
		case actors.Unpin:
			for r, st := range opsAfter() {
				// An op in SOURCES_RELEASED reads no source page any more
				// (its writes may still land at the peer: no terminal
				// frame, checked below).
				if !st.SourceQuiescent() {
					s.failf("%s: %T: Unpin of group %d blocks %v while op %v is %v (DESIGN.md §3)", ts.name, msg, e.Group, e.IDs, r, st)
					return
				}
			}
			s.checkNoReader(c, ts, e.Group, e.IDs, "Unpin")
		case actors.Submit:
			if after.Terminal() {
				s.failf("%s: %T: Submit %v with the session %v", ts.name, msg, e.Op, after)
				return
			}
			if st := opsAfter()[e.Op]; st != actors.OpSubmitting {
				s.failf("%s: %T: Submit %v of an op that is %v", ts.name, msg, e.Op, st)
				return
			}
			ts.opSegs[e.Op] = e.Segments
			ts.opEpoch[e.Op] = c.routes[e.Route].epoch
		case actors.SendFrame:
			if epoch, ok := terminalEpoch(e.Frame); ok {
				// A terminal frame lets the receiver of that epoch free its
				// blocks: every op that wrote them must be quiescent.
				for r, st := range opsAfter() {
					// An op not submitted yet has its stream's epoch.
					ep, ok := ts.opEpoch[r]
					if !ok {
						ep = streamEpoch(ts.s, r.Peer)
					}
					if int32(r.Peer) == e.To.Rank && ep == epoch && !st.Quiescent() {
						s.failf("%s: %T: terminal frame (epoch %d) to %v while op %v is %v", ts.name, msg, epoch, e.To, r, st)
						return
					}
				}
			}
		case actors.Finish:
			if !ts.decided || e.Outcome.Status != ts.first.Status() {
				s.failf("%s: %T: Finish %s, first outcome %v", ts.name, msg, e.Outcome.Status, ts.first)
				return
			}
			if e.Outcome.OK && len(ts.unsent) > 0 {
				s.failf("%s: %T: DONE, yet the Result to generation rank index(es) %v never left (%v)", ts.name, msg, slices.Sorted(maps.Keys(ts.unsent)), ts.unsent)
				return
			}
			if e.Outcome.OK && s.mismatchedFor(c, ts.id) {
				s.failf("%s: %T: DONE, yet a generation rank it writes to planned request %s for another prompt length", ts.name, msg, ts.id)
				return
			}
			if !ts.s.Quiescent() || len(ts.s.PinnedChunks()) > 0 {
				s.failf("%s: %T: Finish while not quiescent (pinned chunks %v)", ts.name, msg, ts.s.PinnedChunks())
				return
			}
			if i+2 != len(effs) {
				s.failf("%s: %T: Finish not followed by Stop at the end", ts.name, msg)
				return
			}
		}
	}
	s.execTx(ts, effs)
	s.checkPools(c.name(), c.pools)
	// What failed among the effects goes back to the session at once, in
	// order, before any other message (txActor.exec).
	for len(ts.feedback) > 0 && s.fail == nil {
		m := ts.feedback[0]
		ts.feedback = ts.feedback[1:]
		if s.cfg.Trace {
			s.record(&event{at: s.vt, actor: ts.name, msg: m})
		}
		s.stepTx(ts, m)
	}
}

// checkDecide checks the Decide effect: exactly one, in the step that
// makes the outcome terminal, naming that outcome.
func (s *Sim) checkDecide(ts *txSess, msg any, before, after actors.TxState, effs []actors.Effect) bool {
	n := 0
	for _, e := range effs {
		d, ok := e.(actors.Decide)
		if !ok {
			continue
		}
		n++
		switch {
		case ts.decide != nil:
			s.failf("%s: %T: second Decide %s (first %s)", ts.name, msg, d.Status, ts.decide.Status)
		case before.Terminal() || !after.Terminal():
			s.failf("%s: %T: Decide %s outside the terminal transition (%v → %v)", ts.name, msg, d.Status, before, after)
		case d.Status != after.String():
			s.failf("%s: %T: Decide %s, outcome %v", ts.name, msg, d.Status, after)
		case (d.Err == nil) != (after == actors.TxDone):
			s.failf("%s: %T: Decide %s with error %v", ts.name, msg, d.Status, d.Err)
		}
		ts.decide = &d
	}
	if n == 0 && !before.Terminal() && after.Terminal() {
		s.failf("%s: %T: outcome %v decided without a Decide effect", ts.name, msg, after)
	}
	return s.fail == nil
}

// mismatchedFor reports whether a generation rank that context rank c
// writes to planned request id for another prompt length than c's Send.
func (s *Sim) mismatchedFor(c *ctxRank, id string) bool {
	for _, q := range s.reqs {
		if q.id != id {
			continue
		}
		for _, link := range s.pm.From(c.rank) {
			if q.genPrompt[s.genPar.Index(link.Gen)] != q.promptLen {
				return true
			}
		}
	}
	return false
}

// terminalEpoch returns the epoch of a frame that lets its receiver free
// its blocks (a Result other than SUCCESS, or a CancelAck).
func terminalEpoch(f messages.Frame) (uint64, bool) {
	switch f := f.(type) {
	case *messages.Result:
		return f.Epoch, f.Status != messages.StatusSuccess
	case *messages.CancelAck:
		return f.Epoch, true
	}
	return 0, false
}

// txRaces counts the DESIGN.md §3 races a message reaches.
func (s *Sim) txRaces(ts *txSess, msg any, before actors.TxState, ops map[actors.OpRef]actors.OpState) {
	switch m := msg.(type) {
	case actors.TxCancel, actors.TxPeerCancel:
		if before.Terminal() {
			return
		}
		for _, st := range ops {
			if st == actors.OpAdmitted {
				s.reached(RaceCancelWhileFence)
				return
			}
		}
	case actors.TxChunk:
		if before.Terminal() {
			s.reached(RaceAdmitAfterDrain)
		}
	case actors.TxCompleted:
		st, ok := ops[m.Op]
		if !ok {
			return
		}
		if (st == actors.OpInDoubt || st == actors.OpRetired) && ts.deadlineFired {
			s.reached(RaceLateCompletion)
		}
		if m.Err == nil || (st != actors.OpSubmitting && st != actors.OpSubmitted) {
			return
		}
		mine := srcBlocks(ts.c, ts.opSegs[m.Op])
		for r, ost := range ops {
			if r.Peer == m.Op.Peer || (ost != actors.OpSubmitting && ost != actors.OpSubmitted) {
				continue
			}
			for k := range srcBlocks(ts.c, ts.opSegs[r]) {
				if mine[k] {
					s.reached(RaceFailWhileReading)
					return
				}
			}
		}
	}
}

type blockKey struct {
	g  int
	id kvcache.BlockID
}

// srcBlocks is the set of source pages (blocks) segments read.
func srcBlocks(c *ctxRank, segs []kvcache.Segment) map[blockKey]bool {
	out := map[blockKey]bool{}
	for _, seg := range segs {
		blocksOf(c.pools, seg.Src, seg.Src+seg.Len, func(g int, id kvcache.BlockID) { out[blockKey{g, id}] = true })
	}
	return out
}

// checkNoReader asserts the physical half of the rule on the source side:
// no posted, unsettled write still reads the blocks being unpinned or freed.
func (s *Sim) checkNoReader(c *ctxRank, ts *txSess, g int, ids []kvcache.BlockID, what string) {
	for _, b := range s.batches {
		if b.src != c || b.srcInc != c.inc || b.snap != nil {
			continue // another's, or reading its source no more
		}
		for _, id := range ids {
			lo, hi := blockRange(c.pools[g], id)
			for _, seg := range b.segs {
				if seg.Src < hi && lo < seg.Src+seg.Len {
					s.failf("%s: %s of group %d block %d while batch of op %v (posted, not landed) still reads it",
						ts.name, what, g, id, b.op)
					return
				}
			}
		}
	}
}

// execTx executes a TxSession's effects the way txActor does.
func (s *Sim) execTx(ts *txSess, effs []actors.Effect) {
	c := ts.c
	for _, e := range effs {
		if s.fail != nil {
			return
		}
		switch e := e.(type) {
		case actors.Pin:
			if err := c.guard.Pin(e.Group, e.IDs); err != nil {
				if a := ts.app; a == nil || !a.freedEarly(e.Group, e.IDs) {
					s.failf("%s: Pin of blocks the serving process holds refused: %v", ts.name, err)
					return
				}
				s.fired(FaultSessionPinRefused)
				if ts.pinFailed == nil {
					ts.pinFailed = map[[2]int]bool{}
				}
				ts.pinFailed[[2]int{e.Chunk, e.Group}] = true
				ts.feedback = append(ts.feedback, actors.TxPinFailed{Chunk: e.Chunk, Group: e.Group, Err: err})
			}
		case actors.Unpin:
			if err := c.guard.Unpin(e.Group, e.IDs); err != nil {
				s.failf("%s: Unpin: %v", ts.name, err)
			}
		case actors.WatchFence:
			s.watchFence(ts, e.Chunk)
		case actors.Submit:
			// Ops for a dead worker are never posted (shellEnv.opWorker).
			if w := c.workers[e.Worker]; !w.dead {
				msg := wSubmit{Submit: e, sess: ts}
				s.mail(ts.name, w.name(), s.hop(), msg, func() { w.submit(msg) })
			}
		case actors.Flush:
			if w := c.workers[e.Worker]; !w.dead {
				msg := wFlush{Flush: e, sess: ts}
				s.mail(ts.name, w.name(), s.hop(), msg, func() { w.flush(msg) })
			}
		case actors.CloseEndpoint:
			if w := c.workers[e.Worker]; !w.dead {
				// workerSlot.close: only an endpoint that carries an op of
				// the stream's is closed for it (core.WorkerTable.Carries).
				s.mail(ts.name, w.name(), s.hop(), e, func() {
					if key := string(e.Route.AgentAddr); w.tbl.Carries(key, ts, e.Peer) {
						w.closeEndpoint(key)
					}
				})
			}
		case actors.EndStream:
			// The stream ends without a terminal frame: nothing to send.
		case actors.SendFrame:
			// A dead worker's frames go through the next live one
			// (shellEnv.frameWorker).
			if w := c.frameWorker(e.Worker); w != nil {
				s.mail(ts.name, w.name(), s.hop(), e, func() { w.send(ts, e) })
			}
		case actors.StartTimer:
			d := max(e.At.Sub(c.now()), 0)
			msg := actors.TxTimeout{Kind: e.Kind}
			s.after(d, ts.name, msg, func() {
				if !ts.stop {
					s.stepTx(ts, msg)
				}
			})
		case actors.Finish:
			ok := e.Outcome.OK
			if ok {
				s.res.TxDone++
			} else {
				s.res.TxNotDone++
			}
			if ts.app != nil {
				a := ts.app
				if c.live(a.inc) {
					a.sweep()
				}
				ts.appFinished = true
				s.mail(ts.name, a.name(), s.hop(), e, func() { a.finished() })
			}
			silent := ts.s.SilentPeers() // sessionStopped.silent
			s.mail(ts.name, c.parentName(), s.hop(), "sessionStopped", func() {
				if !c.live(ts.inc) {
					return
				}
				if c.sessions[ts.id] == ts {
					delete(c.sessions, ts.id)
				}
				for _, w := range c.workers {
					w.sessionStopped(ts)
				}
				c.table.Silence(ts.id, silent)
				c.table.Stopped(ts.id)
				// Engine.Send may have adopted the session after it stopped
				// but before this message reached the parent: its TxStart
				// went to a dead actor. The parent finishes the handle it
				// gave out (Handle.finish is idempotent), as parents.go does.
				if a := ts.app; a != nil && !ts.appFinished {
					// Done means every pin dropped: the parent sweeps the
					// ledger first (parents.go), as the session's Finish
					// did before Send adopted it.
					a.sweep()
					s.mail(c.parentName(), a.name(), s.hop(), e, func() { a.finished() })
				}
			})
		case actors.Decide:
			// The handle's Decided: TxHandle.Chunk refuses from now on.
			if a := ts.app; a != nil && e.Err != nil {
				a.decided = e.Err
			}
		case actors.Stop:
			ts.stop = true
		case actors.ReleaseDest:
			s.failf("%s: a TxSession released destination blocks", ts.name)
		case actors.Log:
		default:
			s.failf("%s: unknown effect %T", ts.name, e)
		}
	}
}

// watchFence schedules a chunk's fence: the serving process writes the
// chunk's KV (a layer part: only its layers) into its source blocks, then
// the fence fires. The parts of one chunk are fenced in layer order, as a
// forward pass computes them.
func (s *Sim) watchFence(ts *txSess, idx int) {
	if idx != len(ts.handed) {
		s.failf("%s: WatchFence %d out of order (%d chunks watched)", ts.name, idx, len(ts.handed))
		return
	}
	h := ts.cur
	h.fenceAt = s.vt + s.between(200*time.Microsecond, 4*time.Millisecond)
	if h.layers.Lo > 0 && idx > 0 {
		// The part before it in the chunk was taken just before (the
		// handle takes a chunk's parts in order, nothing between them).
		prev := ts.handed[idx-1]
		if prev.chunk != h.chunk || prev.layers.Hi != h.layers.Lo {
			s.failf("%s: chunk %d %v taken after chunk %d %v", ts.name, h.chunk, h.layers, prev.chunk, prev.layers)
			return
		}
		h.fenceAt = max(h.fenceAt, prev.fenceAt+s.between(0, 300*time.Microsecond))
	}
	ts.handed = append(ts.handed, h)
	a := ts.app
	var err error
	if s.chance(s.faults.pFence) {
		err = errors.New("sim: producer kernel failed")
	}
	msg := actors.TxFenceFired{Index: idx, Err: err}
	s.at(h.fenceAt, ts.name, msg, func() {
		if !ts.c.live(ts.inc) {
			return
		}
		if err == nil && a != nil {
			// The serving process's kernel wrote the part up to now,
			// whatever the session did meanwhile (but into a group whose
			// Pin the session was refused: that chunk's pages there are
			// the serving process's own business).
			a.writePart(h.chunk, h.layers, func(g int) bool { return ts.pinFailed[[2]int{idx, g}] })
			if s.fail != nil {
				return
			}
		}
		if ts.stop {
			return
		}
		if err != nil {
			s.fired(FaultFence)
		}
		s.stepTx(ts, msg)
	})
}

// streamEpoch is the epoch of the session's stream to generation rank
// peer (0: none).
func streamEpoch(s *actors.TxSession, peer int) uint64 {
	for i := range s.Streams() {
		if v := s.Stream(i); v.Peer() == peer {
			return v.Epoch()
		}
	}
	return 0
}

// onFrame is the context rank's listener and tx parent.
func (c *ctxRank) onFrame(f messages.Frame) {
	s := c.s
	dest, invalid := core.RouteFrame(f)
	if dest != core.FrameToTx && dest != core.FrameInvalidToTx {
		return // rejected (counted by the real listener), or not the tx parent's
	}
	if err := c.incs.Admit(f); err != nil {
		// Of an earlier incarnation: never acted on. A RequestData
		// addressed to an earlier incarnation of this rank is answered
		// (listener.misaddressed, txParent.onMisaddressed): its sender
		// took it as delivered.
		if dest == core.FrameToTx {
			c.misaddressed(f)
		}
		return
	}
	c.answering = core.FromIncarnation(f)
	if rd, ok := f.(*messages.RequestData); ok && rd.From.Instance == "gen" && rd.FromIncarnation > 0 {
		s.admitted[admitKey{k: requestKey{gen: int(rd.From.Rank), inc: int(rd.FromIncarnation) - 1, ctx: c.idx, request: rd.RequestID,
			epoch: rd.Epoch}, ctxInc: c.inc}] = true
	}
	if dest == core.FrameInvalidToTx {
		// txParent.onUnread, on the real core.TxTable: the session of a
		// request bound to the sender's instance takes it as a
		// RequestData that failed to resolve; every other is answered
		// FAILED with the reason. It renews no lease.
		rd := f.(*messages.RequestData)
		why := "invalid RequestData: " + invalid.Error()
		if c.table.Silenced(rd.RequestID, rd.From, rd.FromIncarnation) {
			return // any answer would be a proof
		}
		if c.table.Unread(rd) {
			s.sendTx(c.parentName(), c.sessions[rd.RequestID], actors.TxPeerRequest{Peer: int(rd.From.Rank), From: rd.From, Epoch: rd.Epoch,
				Err: fmt.Errorf("%w: request %s: %s", actors.ErrBadRequest, rd.RequestID, why), Incarnation: rd.FromIncarnation})
			return
		}
		c.reply(rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: c.self,
			Status: messages.StatusFailed, Error: messages.TruncateText(why, messages.MaxErrorLen)})
		return
	}
	c.renewLease(f.Sender()) // a frame of the peer: it is alive
	switch m := f.(type) {
	case *messages.RequestData:
		c.onRequestData(m)
	case *messages.Cancel:
		deliver, _, hold := c.table.Cancel(m, c.now())
		if hold { // as txParent: unanswered until a tombstone ages; the Cancel is re-sent
			return
		}
		if _, ok := c.cancelReasons[m.RequestID]; !ok {
			c.cancelReasons[m.RequestID] = m.Reason
		}
		if !deliver {
			c.reply(m.RequestID, m.From, &messages.CancelAck{RequestID: m.RequestID, Epoch: m.Epoch, From: c.self})
			return
		}
		s.sendTx(c.parentName(), c.sessions[m.RequestID], actors.TxPeerCancel{Peer: int(m.From.Rank), From: m.From, Epoch: m.Epoch,
			Incarnation: m.FromIncarnation, Reason: m.Reason})
	}
}

// misaddressed is listener.misaddressed and txParent.onMisaddressed: f,
// which Admit refused, is answered with a messages.Misaddressed when it is
// a RequestData addressed to an earlier incarnation of this rank
// (core.IncarnationTable.Misaddressed) whose sender takes the answer — the
// RequestData or the sender's Hello the link holds now says
// messages.FeatureMisaddressed (core.MisaddressedAnswer). The answer goes
// through a sender worker and the simulated link, as every reply. The
// listener's answer credits are not modelled.
func (c *ctxRank) misaddressed(f messages.Frame) {
	rd, ok := c.incs.Misaddressed(f)
	if !ok {
		return
	}
	hello, err := c.s.hello(rd.From)
	a := core.MisaddressedAnswer(rd, c.self, c.incarnation(), hello, err)
	if a == nil {
		return
	}
	c.s.res.MisaddressedAnswered++
	c.answering = rd.FromIncarnation
	c.reply(rd.RequestID, rd.From, a)
}

// peerDown is txParent's peerDown: every session hears that incarnation
// inc of a generation rank is down (Engine.PeerIncarnationDown; inc 0,
// any: Engine.PeerDown, a rank declared dead), why saying how; those with
// a stream to a later incarnation only go on.
func (c *ctxRank) peerDown(peer messages.PeerID, inc uint64, why string) {
	c.s.downCloseConns(false, c.idx, c.inc, c.workerNames(), c.parentName(), int(peer.Rank))
	for _, ts := range sortedSessions(c.sessions) {
		c.s.sendTx(c.parentName(), ts, actors.TxPeerGone{Peer: peer, Why: why, Incarnation: inc})
	}
}

func (c *ctxRank) reply(request string, to messages.PeerID, f messages.Frame) {
	core.Stamp(f, c.incarnation(), c.answering)
	i := actors.WorkerFor(request, to, len(c.workers))
	w := c.frameWorker(i)
	if w == nil {
		return
	}
	e := actors.SendFrame{Worker: i, To: to, Frame: f}
	c.s.mail(c.parentName(), w.name(), c.s.hop(), e, func() { w.send(nil, e) })
}

// frameWorker is shellEnv.frameWorker: the worker that sends a frame
// routed to worker i — i, or the next live one once i is dead — or nil
// when none is left.
func (c *ctxRank) frameWorker(i int) *worker {
	for k := range c.workers {
		if w := c.workers[(i+k)%len(c.workers)]; !w.dead {
			return w
		}
	}
	return nil
}

// resolved reports whether this rank resolved a RequestData of request id
// from generation rank gen at epoch (built a route for it).
func (c *ctxRank) resolved(id string, gen int, epoch uint64) bool {
	for _, m := range c.routes {
		if m.request == id && m.gen == gen && m.epoch == epoch {
			return true
		}
	}
	return false
}

// onRequestData is txParent.onRequestData, on the real core.TxTable.
func (c *ctxRank) onRequestData(rd *messages.RequestData) {
	s := c.s
	switch v, _ := c.table.RequestData(rd); v {
	case core.RequestDataSilenced:
		return // any answer would be a proof (txParent.onRequestData)
	case core.RequestDataStale:
		c.reply(rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: c.self,
			Status: messages.StatusFailed, Error: "request already finished on the context side, or cancelled by this generation instance before it arrived"})
		return
	case core.RequestDataClosing:
		c.reply(rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: c.self,
			Status: messages.StatusFailed, Error: "context rank closing"})
		return
	case core.RequestDataNotBound:
		c.reply(rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: c.self,
			Status: messages.StatusFailed, Error: "request bound to another generation instance"})
		return
	case core.RequestDataShed:
		c.reply(rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: c.self,
			Status: messages.StatusFailed, Error: "orphan limit"})
		return
	}
	hello, err := s.hello(rd.From)
	var route *actors.Route
	var expected []int
	if err == nil {
		route, expected, err = actors.ResolveRequest(c.topo, hello, rd)
	}
	bogus := s.isBogus(rd)
	if bogus && err == nil {
		s.failf("%s: ResolveRequest accepted a malformed RequestData for %s: %+v", c.name(), rd.RequestID, rd.Groups)
		return
	}
	refuse, spawn := c.table.Resolved(rd, err)
	if refuse {
		// Nobody has claimed the request: this frame does not get to.
		c.reply(rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: c.self,
			Status: messages.StatusFailed, Error: messages.TruncateText(err.Error(), messages.MaxErrorLen)})
		return
	}
	if route != nil {
		gi := int(rd.From.Rank)
		c.routes[route] = routeMeta{gen: gi, genInc: s.gen[gi].inc, epoch: rd.Epoch, request: rd.RequestID}
	}
	if q := s.request(rd.RequestID); q != nil && !bogus && int(rd.PromptLen) != q.promptLen {
		s.fired(FaultPromptMismatch)
	}
	ts := c.sessions[rd.RequestID]
	if spawn {
		ts = c.spawn(rd.RequestID)
	}
	s.sendTx(c.parentName(), ts, actors.TxPeerRequest{Peer: int(rd.From.Rank), From: rd.From, Epoch: rd.Epoch,
		PromptLen: int(rd.PromptLen), Route: route, Expected: expected, Err: err, Incarnation: rd.FromIncarnation})
}

// ctxApp is the context side's serving process for one request on one
// rank: it allocates source blocks, hands chunks over, writes each chunk's
// KV before its fence fires, and frees its blocks once Done fires.
type ctxApp struct {
	q      *request
	c      *ctxRank
	inc    int
	ts     *txSess
	blocks [][]kvcache.BlockID
	done   bool
	freed  bool
	nm     string
	// decided is the error of the session's Decide (the handle's
	// Decided): TxHandle.Chunk refuses every chunk from then on.
	decided error
	refused bool // a chunk was refused: the serving process stopped
	// order is the order of the chunks and parts handed, as
	// TxHandle.Chunk keeps it.
	order kvcache.ChunkOrder
	// early holds the source blocks it freed before the session pinned
	// them (FaultPinRefused); they are not freed again.
	early map[blockKey]bool
	// pending are the chunks Chunk pinned that have not reached the
	// session (actors' pinLedger), by sequence number.
	pending map[int][]kvcache.BlockRun
	nextSeq int
	// swept: the ledger stopped (sweep): Chunk pins nothing and hands
	// nothing over from then on (actors' pinLedger.take), it returns an
	// error.
	swept bool
	// unpinned: its chunks are handed without the handle's pins
	// (TxChunk.Pinned false, as in a replayed trace of an engine whose
	// handle did not pin): the session pins them (Pin), and a refused Pin
	// comes back to it as TxPinFailed.
	unpinned bool
}

// sweep is the shell's at Finish: the pins of chunks still on their way
// to the session are released, before Done reaches the serving process.
func (a *ctxApp) sweep() {
	s, c := a.c.s, a.c
	a.swept = true
	for seq, src := range a.pending {
		delete(a.pending, seq)
		if err := c.guard.UnpinRuns(src); err != nil {
			s.failf("%s: unpinning a chunk that never reached its session: %v", a.name(), err)
		}
	}
}

// freedEarly reports whether some of ids of group g were freed early.
func (a *ctxApp) freedEarly(g int, ids []kvcache.BlockID) bool {
	for _, id := range ids {
		if a.early[blockKey{g, id}] {
			return true
		}
	}
	return false
}

func (a *ctxApp) name() string { return a.nm }

func (s *Sim) scheduleCtxApp(q *request, c *ctxRank) {
	s.at(q.ctxStart, c.name()+"/app/"+q.id, "send", func() {
		if !c.alive {
			return
		}
		a := &ctxApp{q: q, c: c, inc: c.inc, nm: c.name() + "/app/" + q.id,
			order:    kvcache.NewChunkOrder(q.promptLen, s.layout.TokensPerBlock, s.layout.Layers),
			unpinned: s.ur.IntN(4) == 0}
		c.apps = append(c.apps, a)
		a.start()
	})
}

func (a *ctxApp) start() {
	s, c, q := a.c.s, a.c, a.q
	blocks := s.layout.BlocksFor(q.promptLen)
	counts := make([]int, len(s.layout.Groups))
	for g := range counts {
		if len(c.shape.Layers[g]) > 0 {
			counts[g] = blocks
		}
	}
	ids, err := c.guard.Alloc(counts)
	if err != nil {
		s.failf("%s: source blocks: %v", a.name(), err)
		return
	}
	a.blocks = ids
	for g, gids := range ids {
		for _, id := range gids {
			delete(c.written, blockKey{g, id}) // nothing of this request written yet
			c.srcOwner[blockKey{g, id}] = a
		}
	}
	if c.failed {
		// A sender worker spent its restart budget: Engine.Send refuses
		// (ErrEngineFailed).
		a.finished()
		return
	}
	// Engine.Send: the tx parent opens (or adopts) the session.
	spawn, err := c.table.Open(q.id, "")
	if err != nil {
		if why := c.cancelReasons[q.id]; why != "" && errors.Is(err, actors.ErrPeerCancelled) && !names(err, why) {
			s.failf("%s: Send refused with %v after a Cancel that said why (%q), want the error naming that reason", a.name(), err, why)
			return
		}
		a.finished()
		return
	}
	ts := c.sessions[q.id]
	if spawn {
		ts = c.spawn(q.id)
	}
	ts.app, a.ts = a, ts
	ts.deadlineVT = min(ts.deadlineVT, s.vt+q.ctxDeadline)
	s.sendTx(a.name(), ts, actors.TxStart{PromptLen: q.promptLen, Deadline: c.now().Add(q.ctxDeadline), Payload: q.payload})
	t := s.vt
	for i := range q.chunks {
		t += s.between(100*time.Microsecond, 3*time.Millisecond)
		for j := range q.parts[i] {
			if j > 0 {
				t += s.between(20*time.Microsecond, partGap)
			}
			s.at(t, a.name(), "chunk", func() { a.handChunk(i, j) })
		}
	}
	if s.chance(s.faults.cancelCtx) {
		s.at(s.vt+s.between(0, q.ctxDeadline), a.name(), "cancel", func() {
			if !c.live(a.inc) || a.done {
				return
			}
			s.fired(FaultCancelCtx)
			s.sendTx(a.name(), ts, actors.TxCancel{})
		})
	}
}

// handChunk is TxHandle.Chunk for part j of request chunk i (the parts
// come in layer order, all with the chunk's source blocks, as the handle
// requires): refused once the session's outcome is decided with an error
// (the serving process then stops handing chunks), else run through the
// request's kvcache.ChunkOrder (orderChunk) and sent to the session.
func (a *ctxApp) handChunk(i, j int) {
	s, c := a.c.s, a.c
	if !c.live(a.inc) || a.done || a.refused {
		return
	}
	if a.decided != nil || a.swept && !a.unpinned {
		// (Swept: the session stopped, and Done is on its way; a handle
		// that does not pin hands the chunk to the stopped actor.)
		a.refused = true
		return
	}
	ch := a.q.chunks[i]
	ch.Layers = a.q.parts[i][j]
	first, end := ch.Blocks(s.layout.TokensPerBlock)
	src := make([]kvcache.BlockRun, len(s.layout.Groups))
	for g := range src {
		if len(a.blocks[g]) > 0 {
			src[g] = kvcache.BlockRun{First: first, IDs: a.blocks[g][first:end]}
		}
	}
	if !a.orderChunk(i, j, ch, src) {
		return
	}
	ts := a.ts
	// TxHandle.Chunk pins the source blocks before it returns, all or
	// nothing (actors.TxHandle.ChunkPayload). A serving process that freed
	// one of them before handing the chunk (FaultPinRefused: its own bug)
	// is refused, nothing is handed over, and it cancels the request.
	early := !a.freed && s.chance(s.faults.pPinRefuse)
	if a.unpinned {
		a.handUnpinned(i, ch, src, early)
		return
	}
	if early {
		a.freeOneEarly(src)
	}
	if err := c.guard.PinRuns(src); err != nil {
		if !a.freedEarlyIn(src) {
			s.failf("%s: Chunk's pin of source blocks the serving process holds refused: %v", a.name(), err)
			return
		}
		s.fired(FaultPinRefused)
		a.refused = true
		s.sendTx(a.name(), ts, actors.TxCancel{})
		return
	}
	if s.chance(s.faults.pPinRefuse) {
		a.freeAfterChunk(src)
	}
	msg := actors.TxChunk{Chunk: ch, Src: src, Pinned: true}
	// The handle's pin ledger: the session's Finish releases the pins of
	// chunks still on their way (sweep), which are then dropped unstepped.
	a.nextSeq++
	seq := a.nextSeq
	if a.pending == nil {
		a.pending = map[int][]kvcache.BlockRun{}
	}
	a.pending[seq] = src
	s.mail(a.name(), ts.name, s.hop(), msg, func() {
		if _, ok := a.pending[seq]; !ok {
			return // swept at Finish: its pins are gone
		}
		delete(a.pending, seq)
		ts.cur = handedPart{chunk: i, layers: ch.Layers}
		if !ch.Layers.Whole() {
			s.res.Parts++
		}
		taken := ts.s.Chunks()
		s.stepTx(ts, msg)
		if s.fail == nil && c.live(a.inc) && ts.s.Chunks() == taken {
			// Not taken (the outcome decided, the session stopped): the
			// shell releases the pins Chunk took.
			if err := c.guard.UnpinRuns(src); err != nil {
				s.failf("%s: unpinning a chunk the session did not take: %v", ts.name, err)
			}
		}
	})
}

// handUnpinned hands part of request chunk i to the session without the
// handle's pins (TxChunk.Pinned false): the session's Pin takes them when
// it steps the chunk, and one refused comes back to it at once as
// TxPinFailed. With early, the serving process frees one of the chunk's
// blocks just before the session steps it (FaultPinRefused: its own bug;
// just before, so that no other request is handed the block meanwhile).
func (a *ctxApp) handUnpinned(i int, ch kvcache.Chunk, src []kvcache.BlockRun, early bool) {
	s, c, ts := a.c.s, a.c, a.ts
	msg := actors.TxChunk{Chunk: ch, Src: src}
	s.mail(a.name(), ts.name, s.hop(), msg, func() {
		if !c.live(a.inc) || ts.stop {
			return
		}
		if early && !a.freed {
			a.freeOneEarly(src)
		}
		ts.cur = handedPart{chunk: i, layers: ch.Layers}
		if !ch.Layers.Whole() {
			s.res.Parts++
		}
		s.stepTx(ts, msg)
	})
}

// freedEarlyIn reports whether some block of src was freed early.
func (a *ctxApp) freedEarlyIn(src []kvcache.BlockRun) bool {
	for g, run := range src {
		if a.freedEarly(g, run.IDs) {
			return true
		}
	}
	return false
}

// freeAfterChunk is a serving process that frees a source block after
// Chunk returned, before Done (too early): the pool must refuse, the
// block being pinned since Chunk returned.
func (a *ctxApp) freeAfterChunk(src []kvcache.BlockRun) {
	s, c := a.c.s, a.c
	for g, run := range src {
		if len(run.IDs) == 0 {
			continue
		}
		blocks := make([][]kvcache.BlockID, len(c.pools))
		blocks[g] = []kvcache.BlockID{run.IDs[s.r.IntN(len(run.IDs))]}
		if err := c.guard.Free(blocks); !errors.Is(err, kvcache.ErrBlockPinned) {
			s.failf("%s: a Free of source block %v of group %d after Chunk returned: %v, want it refused (pinned)", a.name(), blocks[g], g, err)
		}
		return
	}
}

// freeOneEarly is a serving process that frees one of a chunk's source
// blocks before it hands the chunk over: Chunk's pin is refused.
func (a *ctxApp) freeOneEarly(src []kvcache.BlockRun) {
	s, c := a.c.s, a.c
	for g, run := range src {
		if len(run.IDs) == 0 {
			continue
		}
		id := run.IDs[s.r.IntN(len(run.IDs))]
		if a.early[blockKey{g, id}] {
			return
		}
		if st, _ := c.pools[g].State(id); st != kvcache.BlockAllocated {
			return // pinned by an earlier chunk: not freeable
		}
		if a.ts != nil {
			s.checkNoReader(c, a.ts, g, []kvcache.BlockID{id}, "early Free")
		}
		blocks := make([][]kvcache.BlockID, len(c.pools))
		blocks[g] = []kvcache.BlockID{id}
		if err := c.guard.Free(blocks); err != nil {
			s.failf("%s: freeing source block %d of group %d: %v", a.name(), id, g, err)
			return
		}
		delete(c.srcOwner, blockKey{g, id})
		if a.early == nil {
			a.early = map[blockKey]bool{}
		}
		a.early[blockKey{g, id}] = true
		return
	}
}

// writePart writes the KV of the layers in part (the zero value: every
// layer) of request chunk i into its source blocks, and records them as
// written; groups skip names are left alone.
func (a *ctxApp) writePart(i int, part kvcache.LayerPart, skip func(g int) bool) {
	s, c := a.c.s, a.c
	first, end := a.q.chunks[i].Blocks(s.layout.TokensPerBlock)
	for g, ids := range a.blocks {
		if len(ids) == 0 || skip(g) {
			continue
		}
		var mask uint64
		for li, L := range c.shape.Layers[g] {
			if part.Contains(L) {
				mask |= 1 << li
			}
		}
		for b := first; b < end; b++ {
			k := blockKey{g, ids[b]}
			if a.early[k] {
				continue // not the serving process's any more
			}
			if o := c.srcOwner[k]; o != a {
				// The kernel writes until the fence fires: a session
				// that let Done fire before (its pins released, the
				// blocks freed) let the framework reuse pages it still
				// writes (DESIGN.md §3).
				who := "nobody (free)"
				if o != nil {
					who = o.name()
				}
				s.failf("%s: the serving process writes chunk %d %v into group %d block %d until its fence fires, but the block was freed after Done and is now held by %s",
					a.name(), i, part, g, ids[b], who)
				return
			}
			buf := c.pools[g].Block(ids[b])
			walkBlock(s.layout, c.shape, g, a.q.idx, b, part, func(off int, want byte) bool {
				buf[off] = want
				return true
			})
			c.written[k] |= mask
		}
	}
}

// finished is Done firing: the serving process frees its source blocks.
func (a *ctxApp) finished() {
	s, c := a.c.s, a.c
	if !c.live(a.inc) || a.done {
		return
	}
	a.done = true
	s.after(s.between(0, time.Millisecond), a.name(), "free", func() {
		if !c.live(a.inc) || a.freed {
			return
		}
		a.freed = true
		held := make([][]kvcache.BlockID, len(a.blocks))
		for g, ids := range a.blocks {
			for _, id := range ids {
				if !a.early[blockKey{g, id}] {
					held[g] = append(held[g], id)
				}
			}
			if a.ts != nil {
				s.checkNoReader(c, a.ts, g, held[g], "Free")
			}
		}
		if err := c.guard.Free(held); err != nil {
			s.failf("%s: freeing source blocks after Done: %v", a.name(), err)
		}
		for g, ids := range held {
			for _, id := range ids {
				delete(c.srcOwner, blockKey{g, id})
			}
		}
		s.checkPools(c.name(), c.pools)
	})
}

// sortedSessions returns a rank's live sessions in name order.
func sortedSessions(m map[string]*txSess) []*txSess {
	out := make([]*txSess, 0, len(m))
	for _, ts := range m {
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b *txSess) int {
		if a.name < b.name {
			return -1
		}
		if a.name > b.name {
			return 1
		}
		return 0
	})
	return out
}

// workerNames are the names of the rank's sender workers, in order.
func (c *ctxRank) workerNames() []string {
	out := make([]string, len(c.workers))
	for i, w := range c.workers {
		out[i] = w.name()
	}
	return out
}
