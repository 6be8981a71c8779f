package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// genRank is one generation rank: its pools, the rx parent's table and
// allocation queue, and its RxSessions.
type genRank struct {
	s          *Sim
	idx        int
	rank       kvcache.Rank
	inc        int
	alive      bool
	nm         string
	self       messages.PeerID
	poolBlocks int
	pad        uint64
	skew       time.Duration

	shape    kvcache.Shape
	topo     actors.Topology
	region   *kvcache.Region
	pools    []*kvcache.Pool
	guard    *actors.Pools
	hello    *messages.Hello
	workers  []string
	entries  map[string]*rxSess
	queue    []*genApp
	apps     []*genApp
	epoch    uint64
	owner    [][]*rxSess // per group, per block: the session whose request owns it
	down     map[messages.PeerID]bool
	postedTo int    // batches ever posted to this incarnation
	maxFrame uint64 // highest frame number delivered (reorder detection)
}

func (g *genRank) name() string      { return g.nm }
func (g *genRank) live(inc int) bool { return g.alive && g.inc == inc }
func (g *genRank) now() time.Time    { return epoch0.Add(g.s.vt + g.skew) }
func (g *genRank) parentName() string {
	return g.nm + "/parent"
}

func (g *genRank) boot() {
	s := g.s
	g.nm = fmt.Sprintf("gen%d.%d", g.idx, g.inc)
	shape, err := s.layout.Shape(s.genPar, g.rank)
	if err != nil {
		s.failf("gen shape: %v", err)
		return
	}
	g.shape = shape
	region, pools, geoms, err := rankPools(s.layout, shape, g.poolBlocks, g.pad)
	if err != nil {
		s.failf("gen pools: %v", err)
		return
	}
	g.alive = true
	g.region, g.pools, g.guard = region, pools, actorsPools(pools)
	g.topo = actors.Topology{Layout: s.layout, LayoutHash: s.layoutHash, Parallel: s.genPar, Rank: g.rank, Pools: geoms}
	mp := make([]messages.PoolGeometry, len(geoms))
	g.owner = make([][]*rxSess, len(geoms))
	for i, pg := range geoms {
		mp[i] = messages.PoolGeometry{Offset: pg.Offset, BlockBytes: pg.BlockBytes, Blocks: int32(pg.Blocks)}
		g.owner[i] = make([]*rxSess, pg.Blocks)
	}
	g.hello = &messages.Hello{From: g.self, Backend: "sim", AgentAddr: []byte(g.nm + "/agent"),
		Region:     messages.RemoteRegion{Key: []byte(g.nm + "/key"), Len: region.Len},
		LayoutHash: s.layoutHash, Parallel: messages.Parallel{TP: int32(s.genPar.TP), PP: int32(s.genPar.PP)},
		TP: int32(g.rank.TP), PP: int32(g.rank.PP), Pools: mp}
	if err := g.hello.Validate(); err != nil {
		s.failf("gen hello: %v", err)
	}
	g.entries = map[string]*rxSess{}
	g.down = map[messages.PeerID]bool{}
	g.queue, g.apps = nil, nil
	g.postedTo, g.maxFrame = 0, 0
	g.workers = nil
	for i := range s.genW {
		g.workers = append(g.workers, fmt.Sprintf("%s/w%d", g.nm, i))
	}
}

// hello is the control link's view of a peer's Hello.
func (s *Sim) hello(p messages.PeerID) (*messages.Hello, error) {
	if p.Instance != "gen" || p.Rank < 0 || int(p.Rank) >= len(s.gen) {
		return nil, fmt.Errorf("sim link: no hello from %v", p)
	}
	g := s.gen[p.Rank]
	if !g.alive {
		return nil, fmt.Errorf("sim link: hello from %v: %w", p, rdma.ErrPeerGone)
	}
	return g.hello, nil
}

// rxSess is one RxSession and what the simulator tracks about it.
type rxSess struct {
	g       *genRank
	inc     int
	req     *request
	name    string
	s       *actors.RxSession
	app     *genApp
	epoch   uint64
	writers map[messages.PeerID]int
	blocks  [][]kvcache.BlockID
	first   actors.RxState
	decided bool
	stop    bool
}

func (s *Sim) sendRx(from string, rs *rxSess, msg any) {
	s.mail(from, rs.name, s.hop(), msg, func() { s.stepRx(rs, msg) })
}

// stepRx delivers one message to an RxSession and checks its invariants.
func (s *Sim) stepRx(rs *rxSess, msg any) {
	g := rs.g
	if !g.live(rs.inc) || rs.stop {
		return
	}
	before := rs.s.State()
	effs := rs.s.Step(msg, g.now())
	after := rs.s.State()
	if before.Terminal() && after != before {
		s.failf("%s: %T: first terminal outcome %v overwritten by %v", rs.name, msg, before, after)
		return
	}
	if after.Terminal() && !rs.decided {
		rs.decided, rs.first = true, after
	}
	for _, e := range effs {
		switch e := e.(type) {
		case actors.ReleaseDest:
			if !rs.s.WritersQuiescent() {
				s.failf("%s: %T: ReleaseDest while a writer may still write", rs.name, msg)
				return
			}
			s.checkNoWriter(g, rs, e.Blocks)
		case actors.Finish:
			if !rs.decided || e.Outcome.Status != rs.first.String() {
				s.failf("%s: %T: Finish %s, first outcome %v", rs.name, msg, e.Outcome.Status, rs.first)
				return
			}
		}
	}
	if s.fail != nil {
		return
	}
	s.execRx(rs, effs)
	s.checkPools(g.name(), g.pools)
}

// checkNoWriter asserts the rule on the destination side: no posted,
// unsettled write may land in blocks being released.
func (s *Sim) checkNoWriter(g *genRank, rs *rxSess, blocks [][]kvcache.BlockID) {
	for _, b := range s.batches {
		if b.gen != g || b.genInc != g.inc {
			continue
		}
		for grp, ids := range blocks {
			for _, id := range ids {
				lo, hi := blockRange(g.pools[grp], id)
				for _, seg := range b.segs {
					if seg.Dst < hi && lo < seg.Dst+seg.Len {
						s.failf("%s: ReleaseDest of group %d block %d while a write of op %v (posted, not landed) targets it",
							rs.name, grp, id, b.op)
						return
					}
				}
			}
		}
	}
}

func (s *Sim) execRx(rs *rxSess, effs []actors.Effect) {
	g := rs.g
	for _, e := range effs {
		if s.fail != nil {
			return
		}
		switch e := e.(type) {
		case actors.SendFrame:
			wn := g.workers[e.Worker]
			inc := rs.inc
			s.mail(rs.name, wn, s.hop(), e, func() {
				if g.live(inc) {
					s.linkSend(true, g.idx, inc, e.Worker, e.To, e.Frame)
				}
			})
		case actors.StartTimer:
			d := max(e.At.Sub(g.now()), 0)
			s.after(d, rs.name, actors.RxTimeout{}, func() { s.stepRx(rs, actors.RxTimeout{}) })
		case actors.Finish:
			if e.Outcome.OK {
				s.res.Ready++
				s.checkData(g, rs, "at READY")
				rs.app.ready(e.Outcome.Blocks)
			} else {
				s.res.NotReady++
				rs.app.done = true
			}
		case actors.ReleaseDest:
			g.release(rs, e.Blocks, "ReleaseDest")
		case actors.Stop:
			rs.stop = true
			s.mail(rs.name, g.parentName(), s.hop(), "sessionStopped", func() {
				if !g.live(rs.inc) {
					return
				}
				if g.entries[rs.req.id] == rs {
					delete(g.entries, rs.req.id)
				}
				g.drainQueue()
			})
		case actors.Log:
		default:
			s.failf("%s: unexpected effect %T", rs.name, e)
		}
	}
}

// release frees a request's destination blocks and drops their ownership.
func (g *genRank) release(rs *rxSess, blocks [][]kvcache.BlockID, why string) {
	s := g.s
	for grp, ids := range blocks {
		for _, id := range ids {
			if g.owner[grp][id] != rs {
				s.failf("%s: %s of group %d block %d, which it does not own", rs.name, why, grp, id)
				return
			}
			g.owner[grp][id] = nil
		}
	}
	if err := g.guard.Free(blocks); err != nil {
		s.failf("%s: %s: %v", rs.name, why, err)
		return
	}
	s.checkPools(g.name(), g.pools)
	s.after(0, g.parentName(), "blocksFreed", func() {
		if g.live(rs.inc) {
			g.drainQueue()
		}
	})
}

// onFrame is the generation rank's listener and rx parent.
func (g *genRank) onFrame(f messages.Frame) {
	s := g.s
	if err := f.Validate(); err != nil {
		return
	}
	switch f.(type) {
	case *messages.Result, *messages.CancelAck:
	default:
		return
	}
	delete(g.down, f.Sender()) // it speaks again
	rs := g.entries[f.Request()]
	if rs == nil {
		return // stale
	}
	w, ok := rs.writers[f.Sender()]
	if !ok {
		return // not a writer of the request
	}
	s.sendRx(g.parentName(), rs, actors.RxFrame{Writer: w, Frame: f})
}

// peerDown is rxParent's peerDown (Engine.PeerDown): the control plane
// declared a context rank dead; every session with it as a writer hears
// RxPeerGone, and sessions started while it stays down fail at once.
func (g *genRank) peerDown(peer messages.PeerID) {
	s := g.s
	g.down[peer] = true
	for _, id := range sortedIDs(g.entries) {
		rs := g.entries[id]
		if w, ok := rs.writers[peer]; ok {
			s.sendRx(g.parentName(), rs, actors.RxPeerGone{Writer: w, Err: fmt.Errorf("%w: %s missed its heartbeats", actors.ErrPeerGone, peer)})
		}
	}
}

func sortedIDs(m map[string]*rxSess) []string {
	out := make([]string, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// genApp is the generation side's serving process for one request on one
// rank: Engine.Receive, an optional cancel, and freeing a READY request's
// blocks after using them.
type genApp struct {
	q        *request
	g        *genRank
	inc      int
	nm       string
	rs       *rxSess
	counts   []int
	deadline time.Time
	queued   bool
	done     bool
	freed    bool
}

func (s *Sim) scheduleGenApp(q *request, g *genRank) {
	s.at(q.genStart, fmt.Sprintf("gen%d/app/%s", g.idx, q.id), "receive", func() {
		if !g.alive {
			return
		}
		a := &genApp{q: q, g: g, inc: g.inc, nm: g.nm + "/app/" + q.id}
		g.apps = append(g.apps, a)
		a.receive()
	})
}

func (a *genApp) receive() {
	g, s, q := a.g, a.g.s, a.q
	l := s.layout
	a.counts = make([]int, len(l.Groups))
	for grp, lg := range l.Groups {
		if len(g.shape.Layers[grp]) == 0 {
			continue
		}
		first, end := kvcache.NeededRange(q.promptLen, lg.Window, l.TokensPerBlock, q.prefixHit[grp])
		a.counts[grp] = end - first
	}
	a.deadline = g.now().Add(q.genDeadline)
	a.queued = true
	g.queue = append(g.queue, a)
	s.after(q.genDeadline, a.nm, "queueTimeout", func() {
		if g.live(a.inc) && a.queued {
			g.unqueue(a)
			a.done = true
			s.res.NotReady++
		}
	})
	if s.chance(s.faults.cancelGen) {
		s.after(s.between(0, q.genDeadline+5*time.Millisecond), a.nm, "cancel", func() {
			switch {
			case !g.live(a.inc) || a.done:
			case a.queued:
				s.fired(FaultCancelGen)
				g.unqueue(a)
				a.done = true
				s.res.NotReady++
			case a.rs != nil && !a.rs.stop:
				s.fired(FaultCancelGen)
				s.sendRx(a.nm, a.rs, actors.RxCancel{})
			}
		})
	}
	g.drainQueue()
}

func (g *genRank) unqueue(a *genApp) {
	if i := slices.Index(g.queue, a); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
	}
	a.queued = false
}

// drainQueue starts queued requests, in order, while blocks are free.
func (g *genRank) drainQueue() {
	for len(g.queue) > 0 {
		a := g.queue[0]
		blocks, err := g.guard.Alloc(a.counts)
		if err != nil {
			return
		}
		g.unqueue(a)
		g.start(a, blocks)
	}
}

// start is rxParent.start: the epoch, the RequestData for every writer and
// the session.
func (g *genRank) start(a *genApp, blocks [][]kvcache.BlockID) {
	s, q, l := g.s, a.q, g.s.layout
	if !s.cfg.PeerDownRace {
		// A request that needs a writer the control plane declared dead
		// fails before any RequestData leaves (see Config.PeerDownRace).
		for _, r := range s.pm.WritersOf(g.rank) {
			peer := messages.PeerID{Instance: "ctx", Rank: int32(s.ctxPar.Index(r))}
			if g.down[peer] && s.ctx[peer.Rank].alive {
				delete(g.down, peer) // the control plane hears it again
			}
			if g.down[peer] {
				if err := g.guard.Free(blocks); err != nil {
					s.failf("%s: %v", a.nm, err)
				}
				a.done = true
				s.res.NotReady++
				return
			}
		}
	}
	g.epoch++
	epoch := uint64(g.now().UnixNano())<<8 | g.epoch&0xff
	groups := make([]messages.GroupDest, len(l.Groups))
	for grp, lg := range l.Groups {
		first, _ := kvcache.NeededRange(q.promptLen, lg.Window, l.TokensPerBlock, q.prefixHit[grp])
		ids := make([]int32, len(blocks[grp]))
		for i, b := range blocks[grp] {
			ids[i] = int32(b)
		}
		groups[grp] = messages.GroupDest{First: int32(first), Blocks: ids}
	}
	rs := &rxSess{g: g, inc: g.inc, req: q, name: g.nm + "/rx/" + q.id, app: a, epoch: epoch,
		writers: map[messages.PeerID]int{}, blocks: blocks}
	var writers []actors.RxWriter
	for i, r := range s.pm.WritersOf(g.rank) {
		peer := messages.PeerID{Instance: "ctx", Rank: int32(s.ctxPar.Index(r))}
		rs.writers[peer] = i
		writers = append(writers, actors.RxWriter{Peer: peer, Worker: actors.WorkerFor(q.id, peer, s.genW),
			Request: &messages.RequestData{RequestID: q.id, Epoch: epoch, From: g.self,
				GenParallel: messages.Parallel{TP: int32(s.genPar.TP), PP: int32(s.genPar.PP)},
				GenTP:       int32(g.rank.TP), GenPP: int32(g.rank.PP),
				PromptLen: int32(q.promptLen), Groups: groups, DeadlineUnixNano: a.deadline.UnixNano()}})
	}
	for grp, ids := range blocks {
		for _, id := range ids {
			if o := g.owner[grp][id]; o != nil {
				s.failf("%s: Alloc handed out group %d block %d, still owned by %s", g.name(), grp, id, o.name)
				return
			}
			g.owner[grp][id] = rs
		}
	}
	rs.s = actors.NewRxSession(actors.RxConfig{Request: q.id, Epoch: epoch, Self: g.self,
		Deadline: a.deadline, Writers: writers, Blocks: blocks, CancelResend: s.cancelResend})
	a.rs = rs
	g.entries[q.id] = rs
	s.sendRx(g.parentName(), rs, actors.RxBegin{})
	if !s.cfg.PeerDownRace {
		return
	}
	// actors/parents.go today: the session is told its writer is gone, but
	// its RequestData still leaves — and reaches the writer if it is back.
	for i, r := range s.pm.WritersOf(g.rank) {
		peer := messages.PeerID{Instance: "ctx", Rank: int32(s.ctxPar.Index(r))}
		if g.down[peer] && s.ctx[peer.Rank].alive {
			delete(g.down, peer) // the control plane hears it again
		}
		if g.down[peer] {
			s.sendRx(g.parentName(), rs, actors.RxPeerGone{Writer: i, Err: fmt.Errorf("%w: %s is down", actors.ErrPeerGone, peer)})
		}
	}
}

// ready is Done firing with READY: the serving process uses the blocks,
// then frees them.
func (a *genApp) ready(blocks [][]kvcache.BlockID) {
	g, s := a.g, a.g.s
	a.done = true
	s.after(s.between(500*time.Microsecond, 5*time.Millisecond), a.nm, "freeBlocks", func() {
		if !g.live(a.inc) {
			return
		}
		s.checkData(g, a.rs, "when the serving process frees them")
		a.freed = true
		g.release(a.rs, blocks, "FreeBlocks")
	})
}
