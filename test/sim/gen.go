package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/core"
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

	shape   kvcache.Shape
	topo    actors.Topology
	region  *kvcache.Region
	pools   []*kvcache.Pool
	guard   *actors.Pools
	hello   *messages.Hello
	workers []string
	// wstop marks the sender workers that stopped for good
	// (FaultWorkerDead): what their mailboxes hold is lost; wdead those
	// the engine knows of (frames routed to one go through the next live
	// worker); failed: the engine refuses new work (ErrEngineFailed).
	wstop, wdead []bool
	failed       bool
	// late holds, per sender worker, the report it holds up
	// (FaultSentLate); waiting, what its mailbox got meanwhile
	// (sent_late.go).
	late    []*sentLate
	waiting [][]func()
	entries map[string]*rxSess
	// table is the real rx parent's table (core.RxTable): writers and
	// epochs of started requests, the down set, the writers' plan.
	table    *core.RxTable
	queue    core.AllocQueue[*genApp] // the real rx parent's queue
	apps     []*genApp
	owner    [][]*rxSess // per group, per block: the session whose request owns it
	postedTo int         // batches ever posted to this incarnation
	maxFrame uint64      // highest frame number delivered (reorder detection)

	// incs is the real listener's incarnation table (issue 17); this
	// incarnation is inc+1.
	incs *core.IncarnationTable
	// heard holds, per context rank that restarted since this
	// incarnation booted, the incarnation whose Hello the control link
	// holds until the new one's comes (helloLag) or a frame of it: a
	// request started meanwhile is addressed to the earlier one (0: none,
	// the rank was down when this incarnation booted).
	heard map[int]uint64
}

func (g *genRank) name() string      { return g.nm }
func (g *genRank) live(inc int) bool { return g.alive && g.inc == inc }
func (g *genRank) now() time.Time    { return epoch0.Add(g.s.vt + g.skew + g.s.drift(len(g.s.ctx)+g.idx)) }
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
	s.regions = append(s.regions, region)
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
		LayoutHash: s.layoutHash, Parallel: messages.Parallel{TP: int32(s.genPar.TP), PP: int32(s.genPar.PP), Stages: s.genPar.Stages},
		TP: int32(g.rank.TP), PP: int32(g.rank.PP), Pools: mp, Incarnation: uint64(g.inc + 1)}
	if err := g.hello.Validate(); err != nil {
		s.failf("gen hello: %v", err)
	}
	g.entries = map[string]*rxSess{}
	g.table = core.NewRxTable(g.self, s.layout, s.genPar, g.rank, s.genW)
	g.table.SetIncarnation(uint64(g.inc + 1))
	g.incs = core.NewIncarnationTable(uint64(g.inc + 1))
	g.heard = map[int]uint64{}
	for _, c := range s.ctx {
		if !c.alive {
			g.heard[c.idx] = 0 // no Hello of it: its dead incarnation's never came
		}
	}
	g.queue, g.apps = core.AllocQueue[*genApp]{}, nil
	g.postedTo, g.maxFrame = 0, 0
	g.workers = nil
	for i := range s.genW {
		g.workers = append(g.workers, fmt.Sprintf("%s/w%d", g.nm, i))
	}
	g.wstop, g.wdead, g.failed = make([]bool, s.genW), make([]bool, s.genW), false
	g.late, g.waiting = make([]*sentLate, s.genW), make([][]func(), s.genW)
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
	blocks  [][]kvcache.BlockID
	first   actors.RxState
	decided bool
	stop    bool
	prompt  int // the prompt length its Receive named
	// deadlineAt is when its deadline timer fires (virtual time).
	deadlineAt time.Duration
	// handled is when a worker last took one of its RequestData;
	// queued counts those waiting in a held-up worker's mailbox
	// (FaultSentLate).
	handled  time.Duration
	queued   int
	released bool // ReleaseDest executed
	// quarantined: QuarantineDest executed (the blocks are in the pool's
	// quarantine, still owned by this session until a proof).
	quarantined bool
	// Per writer: left, its RequestData left this process (the simulated
	// link took it); proof, a terminal frame of this epoch or the writer's
	// death was stepped; reported, the bytes of the SUCCESS it stepped
	// (-1: none); planned, what it must write, computed from the two
	// ranks' shapes; unreachable, the writer can never be reached
	// (FaultNeverConnected).
	left, proof, unreachable []bool
	// unknown: a RequestData to it was handed to a worker that never
	// reported whether it left (the worker panicked inside the send, or
	// stopped with it in its mailbox): the session must treat it as
	// possibly delivered.
	unknown []bool
	refused []bool // a RequestData to it was refused
	// writerInc: the writer incarnation each RequestData is addressed to;
	// only that incarnation's terminal frame is proof of its end.
	writerInc          []uint64
	reported           []int64
	planned            []uint64
	neverConn, ncFired bool
	// sentOK: the session stepped its worker's report that the last
	// RequestData handed for the writer left (RxSent, no error).
	// misTrue: the incarnation a Misaddressed whose claim is true said
	// the writer's RequestData was addressed to (0: none); while the
	// writer is still addressed to it, pending, and the session knows
	// the copy left, the session must have taken it (checkMisaddressedTaken).
	sentOK  []bool
	misTrue []uint64
	// peers: each writer's peer.
	peers []messages.PeerID
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
	if m, ok := msg.(actors.RxPeerGone); ok && m.Writer >= 0 && m.Writer < len(rs.writerInc) && m.Incarnation != 0 &&
		rs.writerInc[m.Writer] != 0 && m.Incarnation != rs.writerInc[m.Writer] && (after != before || len(effs) > 0) {
		// The RequestData went to another incarnation since (readdress):
		// this one's exit proves nothing about the writer.
		s.failf("%s: the exit of writer %d's incarnation %d moved the session (%v -> %v, %d effects), its RequestData went to incarnation %d",
			rs.name, m.Writer, m.Incarnation, before, after, len(effs), rs.writerInc[m.Writer])
		return
	}
	if m, ok := msg.(actors.RxSuspect); ok && m.Writer >= 0 && m.Writer < len(rs.writerInc) && m.Incarnation != 0 &&
		rs.writerInc[m.Writer] > m.Incarnation && (after != before || len(effs) > 0) {
		// The RequestData went to a later incarnation since (readdress):
		// the Down of an earlier one says nothing of it.
		s.failf("%s: the Down of writer %d's incarnation %d moved the session (%v -> %v, %d effects), its RequestData went to incarnation %d",
			rs.name, m.Writer, m.Incarnation, before, after, len(effs), rs.writerInc[m.Writer])
		return
	}
	s.noteProof(rs, msg)
	if m, ok := msg.(actors.RxSent); ok && m.Err == nil && m.Writer >= 0 && m.Writer < len(rs.sentOK) {
		rs.sentOK[m.Writer] = true
	}
	if after.Terminal() && !rs.decided {
		rs.decided, rs.first = true, after
		if f, ok := msg.(actors.RxFrame); ok && f.Invalid != nil {
			if after != actors.RxFailed {
				s.failf("%s: a writer's invalid Result decided the request %v, want FAILED", rs.name, after)
				return
			}
			s.res.InvalidFailed++
		}
		if rs.neverConn && s.vt > rs.deadlineAt {
			s.failf("%s: %T: a writer is never connected, yet the request was decided (%v) at %v, after its deadline %v",
				rs.name, msg, after, s.vt, rs.deadlineAt)
			return
		}
	}
	if m, ok := msg.(actors.RxSent); ok {
		if s.checkFrameRefused(rs, m, before, after, effs); s.fail != nil {
			return
		}
	}
	for _, e := range effs {
		switch e := e.(type) {
		case actors.QuarantineDest:
			if !after.Terminal() || after == actors.RxReady {
				s.failf("%s: %T: QuarantineDest in %v", rs.name, msg, after)
				return
			}
			for w, left := range rs.left {
				if left && !rs.proof[w] && !slices.Contains(e.Writers, w) {
					s.failf("%s: %T: QuarantineDest names writers %v, yet writer %d's RequestData left without a proof of its end",
						rs.name, msg, e.Writers, w)
					return
				}
			}
		case actors.ReleaseDest:
			if e.Quarantined != rs.quarantined {
				s.failf("%s: %T: ReleaseDest quarantined=%v, the session's blocks quarantined=%v", rs.name, msg, e.Quarantined, rs.quarantined)
				return
			}
			if !rs.s.WritersQuiescent() {
				s.failf("%s: %T: ReleaseDest while a writer may still write", rs.name, msg)
				return
			}
			for w, left := range rs.left {
				if left && !rs.proof[w] {
					s.failf("%s: %T: ReleaseDest, yet writer %d's RequestData left and no terminal frame nor death of it was seen",
						rs.name, msg, w)
					return
				}
			}
			if !slices.Contains(rs.left, true) && !slices.Contains(rs.unknown, true) && rs.neverConn && rs.queued == 0 && s.vt > max(rs.deadlineAt, rs.handled)+5*time.Millisecond {
				// (A worker held up by a late report of another
				// RequestData, FaultSentLate, handles this one only
				// when it resumes: the session cannot know sooner.)
				s.failf("%s: %T: no RequestData ever left, yet the blocks were held until %v (deadline %v, last handed to the link at %v)",
					rs.name, msg, s.vt, rs.deadlineAt, rs.handled)
				return
			}
			s.checkNoWriter(g, rs, e.Blocks)
		case actors.Finish:
			if !rs.decided || e.Outcome.Status != rs.first.Status() {
				s.failf("%s: %T: Finish %s, first outcome %v", rs.name, msg, e.Outcome.Status, rs.first)
				return
			}
			if e.Outcome.OK {
				s.checkReady(rs, msg)
			}
		}
	}
	if s.fail != nil {
		return
	}
	s.execRx(rs, effs)
	s.checkPools(g.name(), g.pools)
	if s.fail == nil && !rs.stop {
		s.checkMisaddressedTaken(rs, msg)
	}
	if s.fail == nil {
		// An answer of the writer came first: a report held up that
		// its RequestData left comes now (FaultSentLate); one for a
		// session that stopped, too.
		g.answered(rs, msg)
	}
}

// noteProof records what a message proves about a writer: a terminal
// frame of this epoch (Result, CancelAck) or its death ends its writes; a
// SUCCESS also reports its bytes.
func (s *Sim) noteProof(rs *rxSess, msg any) {
	switch m := msg.(type) {
	case actors.RxFrame:
		s.noteMisaddressed(rs, m)
		if m.Writer < 0 || m.Writer >= len(rs.proof) || rs.proof[m.Writer] || m.Invalid != nil {
			return // an unreadable frame proves nothing
		}
		if in, ok := m.Frame.(messages.Incarnated); ok {
			if w := rs.writerInc[m.Writer]; w != 0 && in.Incarnation().FromIncarnation != w {
				return // another incarnation of the writer: proves nothing
			}
		}
		switch f := m.Frame.(type) {
		case *messages.Result:
			if f.Epoch == rs.epoch {
				rs.proof[m.Writer] = true
				if f.Status == messages.StatusSuccess {
					rs.reported[m.Writer] = int64(f.Bytes)
				}
			}
		case *messages.CancelAck:
			rs.proof[m.Writer] = f.Epoch == rs.epoch
		}
	case actors.RxPeerGone:
		// The death of another incarnation than the one the writer's
		// RequestData went to last proves nothing (readdress).
		if m.Writer >= 0 && m.Writer < len(rs.proof) &&
			(m.Incarnation == 0 || rs.writerInc[m.Writer] == 0 || m.Incarnation == rs.writerInc[m.Writer]) {
			rs.proof[m.Writer] = true
		}
	}
}

// noteMisaddressed: the session's own checks aside, a Misaddressed
// that tells the truth — the incarnation the writer's RequestData is
// addressed to is gone and never admitted one of this request and epoch
// from this incarnation — shows that no copy of it that left was acted
// on, nor will be (a later incarnation drops it unread).
func (s *Sim) noteMisaddressed(rs *rxSess, m actors.RxFrame) {
	f, ok := m.Frame.(*messages.Misaddressed)
	w := m.Writer
	if !ok || m.Invalid != nil || w < 0 || w >= len(rs.left) || f.Addressed == 0 || rs.writerInc[w] != f.Addressed ||
		f.Epoch != rs.epoch || f.From.Instance != "ctx" || f.From.Rank < 0 || int(f.From.Rank) >= len(s.ctx) {
		return
	}
	c, xinc := s.ctx[f.From.Rank], int(f.Addressed)-1
	if !c.live(xinc) && !s.admitted[admitKey{k: requestKey{gen: rs.g.idx, inc: rs.inc, ctx: c.idx, request: rs.req.id, epoch: rs.epoch},
		ctxInc: xinc}] {
		rs.left[w], rs.unknown[w] = false, false
		rs.misTrue[w] = f.Addressed
	}
}

// checkMisaddressedTaken: a Misaddressed whose claim is true (the
// incarnation it names is gone and never admitted the RequestData) about
// the copy the session knows left, to the incarnation its writer is
// addressed to, must be taken once both the answer and the report that the
// copy left are stepped, in whichever order they came (FaultSentLate): the
// session addresses the writer anew (or, decided, counts it never
// reached). Dropped, the request waits for an answer from an incarnation
// that never got it: it is lost at its deadline and its blocks stay
// quarantined until a proof that may never come (CI found the engine
// dropping one that overtook its RxSent).
func (s *Sim) checkMisaddressedTaken(rs *rxSess, msg any) {
	pending := rs.s.Unproven()
	for w, inc := range rs.misTrue {
		if inc != 0 && inc == rs.writerInc[w] && rs.sentOK[w] && slices.Contains(pending, w) {
			s.failf("%s: %T: writer %d's RequestData left addressed to incarnation %d, which is gone and never got it (a true Misaddressed came), yet the session did not address it anew",
				rs.name, msg, w, inc)
			return
		}
	}
}

// checkReady checks a READY outcome: every writer reported SUCCESS with
// exactly the bytes this rank's plan needs from it, the Receive named the
// Send's prompt length, and every writer was reachable.
func (s *Sim) checkReady(rs *rxSess, msg any) {
	if rs.prompt != rs.req.promptLen {
		s.failf("%s: %T: READY, yet its Receive planned %d tokens and the context side sends %d", rs.name, msg, rs.prompt, rs.req.promptLen)
		return
	}
	if rs.neverConn {
		s.failf("%s: %T: READY with a writer that was never connected", rs.name, msg)
		return
	}
	for w, got := range rs.reported {
		if got < 0 || uint64(got) != rs.planned[w] {
			s.failf("%s: %T: READY, yet writer %d reported %d bytes, its plan is %d", rs.name, msg, w, got, rs.planned[w])
			return
		}
	}
}

// plannedBytes is what context rank c must write to generation rank g for
// destination blocks blocks, from the two ranks' shapes alone: per group,
// the layers both hold × parts × the heads both hold (MLA: the latent,
// replicated) × tokens per block × bytes per token, per block.
func (s *Sim) plannedBytes(c kvcache.Rank, g *genRank, blocks [][]kvcache.BlockID) uint64 {
	l := s.layout
	cs, err := l.Shape(s.ctxPar, c)
	if err != nil {
		s.failf("ctx shape: %v", err)
		return 0
	}
	gs := g.shape
	heads := gs.Heads()
	if !l.MLA {
		heads = max(0, min(cs.HeadHi, gs.HeadHi)-max(cs.HeadLo, gs.HeadLo))
	}
	var total uint64
	for grp := range l.Groups {
		layers := 0
		for _, L := range cs.Layers[grp] {
			if slices.Contains(gs.Layers[grp], L) {
				layers++
			}
		}
		total += uint64(len(blocks[grp])) * uint64(layers*l.Parts()*heads*l.TokensPerBlock*l.TokenBytes())
	}
	return total
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
			// A frame routed to a dead worker goes through the next live
			// one (shellEnv.frameWorker), on that worker's connection.
			wi := g.frameWorker(e.Worker)
			if wi < 0 {
				break
			}
			inc := rs.inc
			s.mail(rs.name, g.workers[wi], s.hop(), e, func() {
				g.onWorker(wi, func() {
					if g.live(inc) && !g.wstop[wi] {
						_, _ = g.workerSend(wi, e.To, e.Frame, true)
					}
				})
			})
		case actors.SendRequestData:
			// The worker hands the frame to the control plane and tells
			// the session whether it left (workerSlot.send, RxSent).
			if !s.readdress(rs, e) {
				return
			}
			if e.Writer >= 0 && e.Writer < len(rs.sentOK) {
				rs.sentOK[e.Writer] = false // another copy
			}
			inc := rs.inc
			if e.Writer >= 0 && e.Writer < len(rs.refused) && rs.refused[e.Writer] && !rs.unreachable[e.Writer] {
				s.fired(FaultControlRefused) // a re-send after a refusal
			}
			wi := g.frameWorker(e.Worker)
			if wi < 0 {
				// No worker left: it never leaves (rxKind.effect).
				msg := actors.RxSent{Writer: e.Writer, Err: fmt.Errorf("%w: no sender worker left", actors.ErrEngineFailed)}
				s.after(0, rs.name, msg, func() { s.stepRx(rs, msg) })
				break
			}
			wn := g.workers[wi]
			s.mail(rs.name, wn, s.hop(), e, func() {
				q := g.held(wi)
				if q {
					rs.queued++
				}
				g.onWorker(wi, func() {
					if q {
						rs.queued--
					}
					if !g.live(inc) {
						return
					}
					rs.handled = s.vt
					if e.Writer < 0 || e.Writer >= len(rs.left) || e.Frame == nil || e.Frame.Epoch != rs.epoch {
						s.failf("%s: SendRequestData for writer %d, epoch %v", rs.name, e.Writer, e.Frame)
						return
					}
					if g.wstop[wi] {
						// Lost in a stopped worker's mailbox: no report.
						rs.unknown[e.Writer] = true
						return
					}
					err, crashed := g.workerSend(wi, e.To, e.Frame, !rs.unreachable[e.Writer])
					if err == nil {
						rs.left[e.Writer] = true
					}
					if crashed {
						// workerSlot.restart: a RequestData whose send the
						// crash cut gets no report; whether it left is not
						// known.
						rs.unknown[e.Writer] = true
						return
					}
					if err != nil {
						rs.refused[e.Writer] = true
					}
					if err != nil && rs.unreachable[e.Writer] && !rs.ncFired {
						rs.ncFired = true
						s.fired(FaultNeverConnected)
					}
					msg := actors.RxSent{Writer: e.Writer, Err: err}
					if g.sentReportLate(wi, rs, e, msg) {
						return
					}
					s.mail(wn, rs.name, s.hop(), msg, func() { s.stepRx(rs, msg) })
				})
			})
		case actors.Readdress:
			// A Misaddressed taken: the rx parent's table follows
			// (rxParent's readdressed); an incarnation proven exited
			// before gets the proof now.
			s.res.MisaddressedTaken++
			inc, id := rs.inc, rs.req.id
			s.mail(rs.name, g.parentName(), s.hop(), e, func() {
				if !g.live(inc) {
					return
				}
				if g.table.Readdress(id, e.Writer, e.Incarnation) && g.entries[id] == rs {
					msg := actors.RxPeerGone{Writer: e.Writer, Incarnation: e.Incarnation,
						Err: fmt.Errorf("%w: writer incarnation %d has exited", actors.ErrPeerGone, e.Incarnation)}
					s.sendRx(g.parentName(), rs, msg)
				}
			})
		case actors.StartTimer:
			d := max(e.At.Sub(g.now()), 0)
			if e.Kind == actors.TimerDeadline {
				if !e.At.Equal(rs.app.deadline) {
					s.failf("%s: deadline timer at %v, the Receive's deadline is %v", rs.name, e.At, rs.app.deadline)
					return
				}
				rs.deadlineAt = s.vt + d
			}
			msg := actors.RxTimeout{Kind: e.Kind}
			s.after(d, rs.name, msg, func() { s.stepRx(rs, msg) })
		case actors.Finish:
			if e.Outcome.OK {
				s.res.Ready++
				if rs.req.parted {
					s.res.ReadyParted++
				}
				s.checkData(g, rs, "at READY")
				rs.app.ready(e.Outcome.Blocks)
			} else {
				s.res.NotReady++
				rs.app.done = true
			}
		case actors.QuarantineDest:
			if err := g.guard.Quarantine(e.Blocks); err != nil {
				s.failf("%s: QuarantineDest: %v", rs.name, err)
				return
			}
			rs.quarantined = true
			s.fired(FaultQuarantine)
			s.checkPools(g.name(), g.pools)
		case actors.ReleaseDest:
			rs.released = true
			g.release(rs, e.Blocks, "ReleaseDest")
		case actors.Stop:
			rs.stop = true
			s.mail(rs.name, g.parentName(), s.hop(), "sessionStopped", func() {
				if !g.live(rs.inc) {
					return
				}
				if g.entries[rs.req.id] == rs {
					delete(g.entries, rs.req.id)
					g.table.Stopped(rs.req.id)
				}
				g.drainQueue()
			})
		case actors.Log:
		default:
			s.failf("%s: unexpected effect %T", rs.name, e)
		}
	}
}

// readdress follows a writer's RequestData addressed to another
// incarnation than its last one (a Misaddressed taken: the session sends
// it again, to the incarnation that dropped it), from the frames the
// session emits, not from its Readdress effect. The incarnation it went
// to before must be gone for good — an incarnation that answers
// Misaddressed exists only after its predecessors died, and a dead
// incarnation's writes end with it —, so that what its copies left proves
// nothing from now on: only the new incarnation's terminal frame or death
// (noteProof) ends the writer. It reports false after a failure.
func (s *Sim) readdress(rs *rxSess, e actors.SendRequestData) bool {
	w := e.Writer
	if w < 0 || w >= len(rs.writerInc) || e.Frame == nil {
		return true // the worker's SendRequestData check fails it
	}
	old, inc := rs.writerInc[w], e.Frame.ToIncarnation
	if inc == old {
		return true
	}
	if e.To.Instance != "ctx" || e.To.Rank < 0 || int(e.To.Rank) >= len(s.ctx) {
		return true // a context instance that does not exist: never sent
	}
	c := s.ctx[e.To.Rank]
	if old == 0 || inc < old || c.live(int(old)-1) {
		s.failf("%s: writer %d's RequestData re-addressed from incarnation %d to %d (the rank runs incarnation %d, alive %v)",
			rs.name, w, old, inc, c.incarnation(), c.alive)
		return false
	}
	rs.writerInc[w] = inc
	rs.left[w], rs.unknown[w], rs.proof[w], rs.reported[w] = false, false, false, -1
	return true
}

// frameWorker is shellEnv.frameWorker: the worker that sends a frame
// routed to worker i — i, or the next live one once i is dead — or -1
// when none is left.
func (g *genRank) frameWorker(i int) int {
	for k := range g.workers {
		if j := (i + k) % len(g.workers); !g.wdead[j] {
			return j
		}
	}
	return -1
}

// workerSend is workerSlot.send on worker wi: err is nil when the frame
// left. With worker panics on, the worker now and then panics inside the
// send (drawn from Sim.cr) (mayCrash: the caller allows it): the frame left or not, nobody
// knows which (crashed), and the restart follows.
func (g *genRank) workerSend(wi int, to messages.PeerID, f messages.Frame, mayCrash bool) (err error, crashed bool) {
	s := g.s
	if mayCrash && s.faults.on[FaultWorkerPanic] && s.cr.Float64() < pPanicInSend {
		err = fmt.Errorf("%w: worker %d", actors.ErrWorkerCrashed, wi)
		if s.cr.IntN(2) == 0 {
			err = s.linkSend(true, g.idx, g.inc, wi, to, f)
		}
		s.note(g.workers[wi], panicInSend{Frame: f, Left: err == nil})
		g.restartWorker(wi)
		return err, true
	}
	return s.linkSend(true, g.idx, g.inc, wi, to, f), false
}

// crashWorker makes worker wi panic (the engine's crash injection, through
// its mailbox).
func (g *genRank) crashWorker(wi int) {
	inc := g.inc
	g.s.mail("chaos", g.workers[wi], 0, workerCrash{}, func() {
		g.onWorker(wi, func() {
			if g.live(inc) && !g.wstop[wi] {
				g.restartWorker(wi)
			}
		})
	})
}

// restartWorker is a generation rank's worker panic and its supervisor's
// restart (workerSlot.restart): it holds no ops, so the restart closes its
// control connections; its next frames dial anew.
func (g *genRank) restartWorker(wi int) {
	g.s.fired(FaultWorkerPanic)
	g.s.closeConns(true, g.idx, g.inc, wi)
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
	free := g.guard.Free
	if rs.quarantined && why == "ReleaseDest" {
		free = g.guard.ReleaseQuarantine
	}
	if err := free(blocks); err != nil {
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
	dest, invalid := core.RouteFrame(f)
	if dest != core.FrameToRx && dest != core.FrameInvalidToRx {
		return // rejected, or not the rx parent's
	}
	if err := g.incs.Admit(f); err != nil {
		return // of an earlier incarnation: never acted on
	}
	g.heardFrom(f)
	if dest == core.FrameInvalidToRx {
		// A writer's Result that fails validation: the rx parent looks
		// its writer up (changing nothing) and fails the session, as no
		// proof.
		if v, w := g.table.Lookup(f); v == core.RxRouteDeliver {
			s.sendRx(g.parentName(), g.entries[f.Request()], actors.RxFrame{Writer: w, Frame: f, Invalid: invalid})
		}
		return
	}
	// A frame takes its sender out of the down set (RxTable.Route); its
	// suspected requests hear it after the frame (rxParent.route).
	down := g.table.IsDown(f.Sender())
	if v, w := g.table.Route(f); v == core.RxRouteDeliver { // else stale, or not a writer of the request
		s.sendRx(g.parentName(), g.entries[f.Request()], actors.RxFrame{Writer: w, Frame: f})
	}
	if down {
		g.tellHeard(f.Sender(), core.FromIncarnation(f))
	}
}

// heardFrom: a frame of a context incarnation carries its Hello's
// incarnation (the control link binds a connection to its Hello).
func (g *genRank) heardFrom(f messages.Frame) {
	from := f.Sender()
	if h, ok := g.heard[int(from.Rank)]; ok && from.Instance == "ctx" && core.FromIncarnation(f) > h {
		g.hear(int(from.Rank), core.FromIncarnation(f))
	}
}

// hear records that the control link holds incarnation inc's Hello of
// context rank c.
func (g *genRank) hear(c int, inc uint64) {
	if h, ok := g.heard[c]; !ok || inc <= h {
		return
	}
	if inc >= g.s.ctx[c].incarnation() {
		delete(g.heard, c) // the current one
		return
	}
	g.heard[c] = inc
}

// restarted: context rank c booted incarnation inc+1; every live
// generation rank holds the Hello it had (inc's, or none) until the new
// one comes, after a lag drawn from Sim.mr (helloLag) or with a frame of
// it.
func (s *Sim) restarted(c *ctxRank) {
	for _, g := range s.gen {
		if !g.alive {
			continue
		}
		if _, ok := g.heard[c.idx]; !ok {
			g.heard[c.idx] = uint64(c.inc) // the previous incarnation's
		}
		ginc, cinc := g.inc, c.incarnation()
		s.after(s.helloLag(), g.parentName(), "hello", func() {
			if g.live(ginc) {
				g.hear(c.idx, cinc)
			}
		})
	}
}

// maxHelloLag bounds how long after a context rank's restart a
// generation rank's control link holds its previous incarnation's Hello.
const maxHelloLag = 20 * time.Millisecond

// helloLag draws it: log-uniform from 100 µs to maxHelloLag.
func (s *Sim) helloLag() time.Duration {
	const lo = 100 * time.Microsecond
	return time.Duration(float64(lo) * math.Pow(float64(maxHelloLag)/float64(lo), s.mr.Float64()))
}

// peerDown is rxParent's peerDown (Engine.PeerDown): the control plane
// declared a context rank dead; every session with it as a writer hears
// RxSuspect (missed heartbeats prove nothing), and sessions started while
// it stays down fail at once. When the rank really is dead, the backend's
// proof of its death (shm: the writer's pidfd, opened at its Hello) comes
// too, as Engine.WriterExited: RxPeerGone — only when it does not return.
func (g *genRank) peerDown(peer messages.PeerID) {
	s := g.s
	// Dead for good: a rank that returns gets the frames sent to it
	// meanwhile (linkSend), one addressed to no incarnation included, so
	// its death now proves nothing about what its next incarnation writes.
	c := s.ctx[peer.Rank]
	dead := !c.alive && c.backAt == 0
	s.downCloseConns(true, g.idx, g.inc, g.workers, g.parentName(), int(peer.Rank))
	for _, r := range g.table.PeerDown(peer, 0) {
		var msg any = actors.RxSuspect{Writer: r.Writer, Err: fmt.Errorf("%w: %s missed its heartbeats", actors.ErrPeerGone, peer)}
		if dead {
			msg = actors.RxPeerGone{Writer: r.Writer, Err: fmt.Errorf("%w: %s exited", actors.ErrPeerGone, peer)}
		}
		s.sendRx(g.parentName(), g.entries[r.Request], msg)
	}
}

// writerExited is rxParent's writerExited (Engine.WriterExited): proof that
// incarnation inc of a context rank writes no more, for the requests
// addressed to it.
func (g *genRank) writerExited(peer messages.PeerID, inc uint64) {
	for _, r := range g.table.Exited(peer, inc) {
		g.s.sendRx(g.parentName(), g.entries[r.Request], actors.RxPeerGone{Writer: r.Writer, Incarnation: inc,
			Err: fmt.Errorf("%w: %s incarnation %d exited", actors.ErrPeerGone, peer, inc)})
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
	prompt   int    // the prompt length the Receive names
	context  string // the context instance the Receive names
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
		a := &genApp{q: q, g: g, inc: g.inc, nm: g.nm + "/app/" + q.id, prompt: q.genPrompt[g.idx], context: "ctx"}
		if q.ghost[g.idx] {
			a.context = ghostInstance
		}
		g.apps = append(g.apps, a)
		a.receive()
	})
}

func (a *genApp) receive() {
	g, s, q := a.g, a.g.s, a.q
	if g.failed {
		// A sender worker spent its restart budget: Engine.Receive
		// refuses (ErrEngineFailed).
		a.done = true
		s.res.NotReady++
		return
	}
	l := s.layout
	a.counts = make([]int, len(l.Groups))
	for grp, lg := range l.Groups {
		if len(g.shape.Layers[grp]) == 0 {
			continue
		}
		first, end := kvcache.NeededRange(a.prompt, lg.Window, l.TokensPerBlock, q.prefixHit[grp])
		a.counts[grp] = end - first
	}
	a.deadline = g.now().Add(q.genDeadline)
	a.queued = true
	g.queue.Push(q.id, a.counts, a)
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
	g.queue.Remove(a.q.id)
	a.queued = false
}

// drainQueue is rxParent.drainQueue: queued requests start in order
// while blocks are free (one that needs no block even behind a head that
// waits); one that can never fit fails.
func (g *genRank) drainQueue() {
	g.queue.Drain(g.guard.Alloc,
		func(a *genApp, blocks [][]kvcache.BlockID) {
			a.queued = false
			g.start(a, blocks)
		},
		func(a *genApp, err error) {
			a.queued, a.done = false, true
			g.s.res.NotReady++
		})
}

// start is rxParent.start: the epoch, the RequestData for every writer and
// the session.
func (g *genRank) start(a *genApp, blocks [][]kvcache.BlockID) {
	s, q := g.s, a.q
	o := core.RxOpen{Request: q.id, PromptLen: a.prompt, Context: a.context, ContextParallel: s.ctxPar,
		PrefixHitBlocks: q.prefixHit, Deadline: a.deadline}
	// A request that needs a writer the control plane declared dead (and
	// does not hear again) fails before any RequestData leaves.
	for _, peer := range g.table.DownWriters(o) {
		if c := s.ctx[peer.Rank]; c.alive {
			g.table.Heard(peer) // the control plane hears it again
			inc := c.incarnation()
			if h, ok := g.heard[c.idx]; ok && h < inc {
				inc = h // the new incarnation's Hello has not come yet
			}
			g.tellHeard(peer, inc)
		}
	}
	// The writers' Hellos name their incarnations (the control link's
	// directory: a live rank's current one).
	for _, peer := range g.table.Writers(o) {
		if c := s.ctx[peer.Rank]; peer.Instance == "ctx" && c.alive {
			inc := c.incarnation()
			if h, ok := g.heard[c.idx]; ok && h < inc {
				inc = h // the new incarnation's Hello has not come yet
			}
			g.table.Learn(peer, inc)
		}
	}
	// A writer whose incarnation is proven exited would never answer:
	// the request fails before any RequestData leaves (rxParent.start).
	if len(g.table.ExitedWriters(o)) > 0 {
		if err := g.guard.Free(blocks); err != nil {
			s.failf("%s: %v", a.nm, err)
		}
		a.done = true
		s.res.NotReady++
		return
	}
	epoch, writers, err := g.table.Start(o, blocks, g.now())
	if err != nil {
		if !errors.Is(err, actors.ErrPeerGone) {
			s.failf("%s: start: %v", a.nm, err)
		}
		if err := g.guard.Free(blocks); err != nil {
			s.failf("%s: %v", a.nm, err)
		}
		a.done = true
		s.res.NotReady++
		return
	}
	rs := &rxSess{g: g, inc: g.inc, req: q, name: g.nm + "/rx/" + q.id, app: a, epoch: epoch,
		blocks: blocks, prompt: a.prompt, deadlineAt: 1 << 62}
	for i, w := range writers {
		peer, r := w.Peer, s.ctxPar.RankAt(int(w.Peer.Rank))
		_, deaf := s.faults.refused(g.idx, int(peer.Rank), 0)
		unreachable := a.context == ghostInstance || deaf
		rs.neverConn = rs.neverConn || unreachable
		rs.left = append(rs.left, false)
		rs.unknown = append(rs.unknown, false)
		rs.sentOK = append(rs.sentOK, false)
		rs.misTrue = append(rs.misTrue, 0)
		rs.proof = append(rs.proof, false)
		rs.unreachable = append(rs.unreachable, unreachable)
		rs.refused = append(rs.refused, false)
		rs.peers = append(rs.peers, peer)
		rs.writerInc = append(rs.writerInc, w.Incarnation)
		rs.reported = append(rs.reported, -1)
		rs.planned = append(rs.planned, s.plannedBytes(r, g, blocks))
		if rs.planned[i] != w.Bytes {
			s.failf("%s: %s must write %d bytes by kvcache.PeerLink.BytesPerBlock, %d by the two ranks' shapes", rs.name, peer, w.Bytes, rs.planned[i])
			return
		}
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
		Deadline: a.deadline, Writers: writers, Blocks: blocks, CancelResend: s.cancelResend, Incarnation: uint64(g.inc + 1)})
	a.rs = rs
	g.entries[q.id] = rs
	// rxActor steps RxBegin on Started, before any message can reach the
	// session (a cancel, a frame, a panic): step it now.
	if s.cfg.Trace {
		s.record(&event{at: s.vt, actor: rs.name, msg: actors.RxBegin{}})
	}
	s.stepRx(rs, actors.RxBegin{})
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
