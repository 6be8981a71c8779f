package sim

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// scheduleFaults turns the seed's plan into events.
func (s *Sim) scheduleFaults() {
	p := &s.faults
	for _, t := range p.crashes {
		s.at(t, "chaos", "WorkerCrash", func() { s.crashWorker() })
	}
	for _, t := range p.remakes {
		s.at(t, "chaos", "remakeConn", func() { s.remakeConn(20) })
	}
	for _, t := range p.stops {
		s.at(t, "chaos", "workerStop", func() { s.stopWorker() })
	}
	for _, d := range p.deaths {
		if !d.gen && d.back > 0 && s.mr.IntN(3) == 0 {
			// A supervisor that restarts the rank at once: its next
			// incarnation is up before the failure detector's timeout
			// (2-15 ms), so that requests still live may be re-addressed
			// to it (Misaddressed).
			const lo, hi = 200 * time.Microsecond, 2 * time.Millisecond
			d.back = d.at + time.Duration(float64(lo)*math.Pow(float64(hi)/float64(lo), s.mr.Float64()))
		}
		s.at(d.at, "chaos", "death", func() { s.kill(d) })
	}
	for _, t := range p.jumps {
		s.at(t, "chaos", "clockJump", func() { s.jumpClock() })
	}
	for _, t := range p.malformed {
		s.at(t, "chaos", "malformed", func() { s.injectMalformed() })
	}
	for _, t := range p.sessPanics {
		s.at(t, "chaos", "sessionPanic", func() { s.panicSession() })
	}
	if p.leaseTTL > 0 {
		for t := time.Duration(0); t < p.beatsEnd; t += p.beat {
			s.at(t, "chaos", "heartbeats", func() { s.heartbeats() })
		}
	}
	for _, st := range p.stalls {
		// The paused rank sends no heartbeats: every generation rank
		// suspects it (it cannot tell a pause from a death).
		if t := st.w.from + s.between(2*time.Millisecond, 15*time.Millisecond); t < st.w.to {
			s.at(t, "chaos", "peerDown", func() {
				if s.ctx[st.ctx].alive {
					s.declareDown(false, st.ctx, -1)
				}
			})
			// Its heartbeats come back as it resumes (Engine.PeerAlive).
			s.at(st.w.to+heardAfter, "chaos", "peerAlive", func() { s.declareHeard(st.ctx, -1) })
		}
	}
	if s.cfg.SuspectPartitions {
		for _, pt := range p.partitions {
			// Each side stops hearing the other's heartbeats.
			if t := pt.w.from + s.between(2*time.Millisecond, 15*time.Millisecond); t < pt.w.to {
				s.at(t, "chaos", "peerDown", func() { s.declareDown(false, pt.ctx, pt.gen) })
			}
			if t := pt.w.from + s.between(2*time.Millisecond, 15*time.Millisecond); t < pt.w.to {
				s.at(t, "chaos", "peerDown", func() { s.declareDown(true, pt.gen, pt.ctx) })
			}
			s.at(pt.w.to+heardAfter, "chaos", "peerAlive", func() { s.declareHeard(pt.ctx, pt.gen) })
		}
	}
}

// crashWorker makes a sender worker of a live rank panic: a context
// rank's (ops in doubt, endpoints and connections closed), or one time in
// four a generation rank's (its connections closed). The generation side's
// draws come from Sim.cr, so that the context side's are those of a seed
// whose generation workers never crash.
func (s *Sim) crashWorker() {
	var live []*ctxRank
	for _, c := range s.ctx {
		if c.alive {
			live = append(live, c)
		}
	}
	var w *worker
	if len(live) > 0 {
		c := live[s.r.IntN(len(live))]
		w = c.workers[s.r.IntN(len(c.workers))]
	}
	if s.cr.IntN(4) == 0 {
		var gens []*genRank
		for _, g := range s.gen {
			if g.alive {
				gens = append(gens, g)
			}
		}
		if len(gens) > 0 {
			g := gens[s.cr.IntN(len(gens))]
			g.crashWorker(s.cr.IntN(len(g.workers)))
			return
		}
	}
	if w != nil {
		s.mail("chaos", w.name(), 0, workerCrash{}, func() { w.crash() })
	}
}

// kill is a rank's death: everything of its incarnation is gone, and its
// peers find out (the backend at once for writes in flight, the failure
// detector after a while).
func (s *Sim) kill(d death) {
	if d.gen {
		g := s.gen[d.rank]
		if !g.alive {
			return
		}
		pending := false
		for _, b := range s.batches {
			pending = pending || b.gen == g && b.genInc == g.inc
		}
		s.fired(classify(pending, g.postedTo > 0))
		inc := g.inc
		s.genDied(g, inc)
		g.alive = false
		s.detect(true, d.rank, inc)
		s.exitDowns(d, inc)
		if d.back > 0 {
			s.at(d.back, "chaos", "return", func() {
				s.fired(FaultPeerReturn)
				g.inc++
				g.boot()
				s.detectFor(true, g.idx)
			})
		}
		return
	}
	c := s.ctx[d.rank]
	if !c.alive {
		return
	}
	pending := false
	for _, b := range s.batches {
		pending = pending || b.src == c && b.srcInc == c.inc
	}
	s.fired(classify(pending, c.posted > 0))
	inc := c.inc
	s.ctxDied(c)
	c.alive, c.backAt = false, d.back
	s.detect(false, d.rank, inc)
	s.exitDowns(d, inc)
	// The backend's proof of that incarnation's death (shm: its pidfd,
	// opened at its Hello, becomes readable) reaches every live
	// generation rank: Engine.WriterExited. For a rank that returns, one
	// time in two it comes only after the return (exitProofDelay: a
	// backend without pidfds, where the control plane's record of the
	// next incarnation replacing this one is the proof), so that the next
	// incarnation may answer a RequestData addressed to this one
	// (Misaddressed) before it.
	late := d.back > 0 && s.mr.IntN(2) == 0
	for _, g := range s.gen {
		if g.alive {
			ginc := g.inc
			delay := s.between(100*time.Microsecond, 2*time.Millisecond)
			if late {
				delay = d.back - d.at + s.exitProofDelay()
			}
			s.after(delay, g.parentName(), "writerExited", func() {
				if g.live(ginc) {
					g.writerExited(c.self, uint64(inc+1))
				}
			})
		}
	}
	if d.back > 0 {
		s.at(d.back, "chaos", "return", func() {
			s.fired(FaultPeerReturn)
			c.inc++
			c.boot()
			s.restarted(c)
			s.detectFor(false, c.idx)
		})
	}
}

// maxExitProofDelay bounds how long after its successor boots the proof
// of a context incarnation's exit may reach a generation rank, when it
// comes late (kill).
const maxExitProofDelay = 30 * time.Millisecond

// exitProofDelay draws a late exit proof's delay after the return:
// log-uniform from 100 µs to maxExitProofDelay, from Sim.mr.
func (s *Sim) exitProofDelay() time.Duration {
	const lo = 100 * time.Microsecond
	return time.Duration(float64(lo) * math.Pow(float64(maxExitProofDelay)/float64(lo), s.mr.Float64()))
}

// heartbeats: every live generation rank's heartbeat reaches every live
// context rank it is not partitioned from, through the rank's listener (a
// stalled rank hears it on resume); it renews the writer's lease.
func (s *Sim) heartbeats() {
	for _, g := range s.gen {
		if !g.alive {
			continue
		}
		for _, c := range s.ctx {
			if !c.alive || s.faults.partitioned(c.idx, g.idx, s.vt, s.vt) > 0 {
				continue
			}
			c, inc, peer := c, c.inc, g.self
			s.at(s.vt+s.between(20*time.Microsecond, 400*time.Microsecond), c.name()+"/listener", "heartbeat", func() {
				if c.live(inc) {
					c.renewLease(peer)
				}
			})
		}
	}
}

// detect is the control plane's failure detector (heartbeats): once a
// dead incarnation has been silent for a while, and only if the rank has
// not come back meanwhile, every live rank on the other side hears
// Engine.PeerDown for it.
func (s *Sim) detect(gen bool, rank, inc int) {
	s.after(s.between(2*time.Millisecond, 15*time.Millisecond), "chaos", "peerDown", func() {
		if gen {
			if g := s.gen[rank]; g.alive || g.inc != inc {
				return
			}
			s.declareDown(true, rank, -1)
			return
		}
		if c := s.ctx[rank]; c.alive || c.inc != inc {
			return
		}
		s.declareDown(false, rank, -1)
	})
}

// detectFor is the failure detector of a rank that just booted: peers on
// the other side that are dead, and stay dead for a while, are declared to
// it.
func (s *Sim) detectFor(gen bool, rank int) {
	if gen {
		g, inc := s.gen[rank], s.gen[rank].inc
		for _, c := range s.ctx {
			if !c.alive {
				cinc := c.inc
				s.after(s.between(2*time.Millisecond, 15*time.Millisecond), "chaos", "peerDown", func() {
					if g.live(inc) && !c.alive && c.inc == cinc {
						g.peerDown(c.self)
					}
				})
			}
		}
		return
	}
	c, inc := s.ctx[rank], s.ctx[rank].inc
	for _, g := range s.gen {
		if !g.alive {
			ginc := g.inc
			s.after(s.between(2*time.Millisecond, 15*time.Millisecond), "chaos", "peerDown", func() {
				if c.live(inc) && !g.alive && g.inc == ginc {
					c.peerDown(g.self, 0, "")
				}
			})
		}
	}
}

// declareDown delivers Engine.PeerDown for a rank to every live rank on
// the other side (only to rank `only` when it is not -1).
func (s *Sim) declareDown(gen bool, rank, only int) {
	if gen {
		peer := messages.PeerID{Instance: "gen", Rank: int32(rank)}
		for _, c := range s.ctx {
			if c.alive && (only < 0 || c.idx == only) {
				c.peerDown(peer, 0, "")
			}
		}
		return
	}
	peer := messages.PeerID{Instance: "ctx", Rank: int32(rank)}
	for _, g := range s.gen {
		if g.alive && (only < 0 || g.idx == only) {
			g.peerDown(peer)
		}
	}
}

func classify(pending, posted bool) Fault {
	switch {
	case pending:
		return FaultPeerDeathDuringPost
	case posted:
		return FaultPeerDeathAfterPost
	}
	return FaultPeerDeathBeforePost
}

// drift is how far rank i's clock (context ranks first) has drifted from
// virtual time (FaultClockDrift).
func (s *Sim) drift(i int) time.Duration {
	if i >= len(s.faults.driftPPM) {
		return 0
	}
	if d := s.faults.driftPPM[i]; d != 0 {
		s.fired(FaultClockDrift)
		return time.Duration(int64(s.vt) / 1_000_000 * d)
	}
	return 0
}

func (s *Sim) jumpClock() {
	d := s.between(5*time.Millisecond, 200*time.Millisecond)
	if s.r.IntN(2) == 0 {
		d = -d
	}
	s.fired(FaultClockJump)
	if i := s.r.IntN(len(s.ctx) + len(s.gen)); i < len(s.ctx) {
		s.ctx[i].skew += d
	} else {
		s.gen[i-len(s.ctx)].skew += d
	}
}

func (s *Sim) panicSession() {
	var txs []*txSess
	var rxs []*rxSess
	for _, c := range s.ctx {
		if c.alive {
			for _, ts := range sortedSessions(c.sessions) {
				if !ts.stop {
					txs = append(txs, ts)
				}
			}
		}
	}
	for _, g := range s.gen {
		if g.alive {
			for _, id := range sortedIDs(g.entries) {
				if rs := g.entries[id]; !rs.stop {
					rxs = append(rxs, rs)
				}
			}
		}
	}
	n := len(txs) + len(rxs)
	if n == 0 {
		return
	}
	s.fired(FaultSessionPanic)
	if i := s.r.IntN(n); i < len(txs) {
		s.sendTx("supervisor", txs[i], actors.TxPanic{Err: errors.New("sim: nil map write")})
	} else {
		s.sendRx("supervisor", rxs[i-len(txs)], actors.RxPanic{Err: errors.New("sim: index out of range")})
	}
}

// injectMalformed delivers a malformed or unresolvable frame to a rank's
// listener: it must be rejected there (Validate) or, for a well-formed
// RequestData naming blocks the receiver does not have, by
// ResolveRequest — and the engine must keep serving everyone else.
func (s *Sim) injectMalformed() {
	r := s.r
	toGen := r.IntN(3) == 0
	id := "bogus-" + fmt.Sprint(s.bogus)
	s.bogus++
	if r.IntN(3) == 0 {
		id = s.reqs[r.IntN(len(s.reqs))].id
	}
	ctxPeer := messages.PeerID{Instance: "ctx", Rank: int32(r.IntN(len(s.ctx)))}
	genPeer := messages.PeerID{Instance: "gen", Rank: int32(r.IntN(len(s.gen)))}
	var f messages.Frame
	if toGen {
		g := s.gen[r.IntN(len(s.gen))]
		if !g.alive {
			return
		}
		switch r.IntN(3) {
		case 0:
			res := &messages.Result{RequestID: id, From: ctxPeer, Status: messages.Status(5 + r.IntN(5)), Bytes: uint64(r.IntN(1 << 20))}
			if rs := g.entries[id]; rs != nil && len(rs.s.Config().Writers) > 0 && r.IntN(2) == 0 {
				// Named as a writer's answer for the live session: it
				// fails the request, proving nothing.
				ws := rs.s.Config().Writers
				res.Epoch, res.From = rs.epoch, ws[r.IntN(len(ws))].Peer
			}
			f = res
		case 1:
			f = &messages.CancelAck{RequestID: strings.Repeat("x", messages.MaxRequestIDLen+1), From: ctxPeer}
		default:
			f = &messages.Result{RequestID: id, From: messages.PeerID{Rank: -1}, Status: messages.StatusSuccess}
		}
		s.fired(FaultMalformed)
		if f.Validate() == nil {
			s.failf("messages: a malformed %T passed Validate: %+v", f, f)
			return
		}
		g.onFrame(f)
		return
	}
	c := s.ctx[r.IntN(len(s.ctx))]
	if !c.alive {
		return
	}
	switch r.IntN(5) {
	case 0:
		f = &messages.Cancel{RequestID: id, From: messages.PeerID{Instance: "", Rank: 3}}
	case 1:
		// No request id; or one, with no layer groups (named: answered
		// FAILED, or failing the request's session when the request is
		// bound to the sender's instance — unless it duplicates the
		// epoch of a stream the session has of that rank, which must
		// change nothing: that stream's writes may be in flight).
		rd := &messages.RequestData{From: genPeer, GenParallel: messages.Parallel{TP: 1, PP: 1}}
		if r.IntN(2) == 0 {
			rd.RequestID = id
			if rs := s.gen[genPeer.Rank].entries[id]; rs != nil && r.IntN(2) == 0 && c.resolved(id, int(genPeer.Rank), rs.epoch) {
				rd.Epoch = rs.epoch
			}
		}
		f = rd
	case 2:
		if _, err := messages.Decode(garbage(r.Uint64())); err == nil {
			return // by chance a valid frame: nothing malformed arrived
		}
		s.fired(FaultMalformed)
		return
	default:
		rd := s.bogusRequest(id, genPeer)
		if rd == nil {
			return
		}
		if rs := s.gen[genPeer.Rank].entries[id]; rs != nil && r.IntN(2) == 0 && c.resolved(id, int(genPeer.Rank), rs.epoch) {
			// A duplicate of the RequestData this rank already resolved
			// for the live session (the same epoch) that does not
			// resolve: it must change nothing, since the first one's
			// writes may be in flight and a FAILED answer would be a
			// false proof. (Before the first one arrives, a different
			// RequestData of the same epoch is a broken generation rank
			// lying about its own pages, which kvxfer does not guard.)
			rd.Epoch = rs.epoch
		}
		s.fired(FaultMalformed)
		c.onFrame(rd)
		return
	}
	s.fired(FaultMalformed)
	if f.Validate() == nil {
		s.failf("messages: a malformed %T passed Validate: %+v", f, f)
		return
	}
	c.onFrame(f)
}

func garbage(x uint64) []byte {
	b := make([]byte, 1+x%40)
	for i := range b {
		x = x*6364136223846793005 + 1442695040888963407
		b[i] = byte(x >> 56)
	}
	return b
}

// bogusRequest is a well-formed RequestData from a real generation rank
// that no writer may act on: its blocks lie outside the receiver's pool,
// its group count is wrong, or its blocks run past the prompt.
func (s *Sim) bogusRequest(id string, from messages.PeerID) *messages.RequestData {
	r := s.r
	g := s.gen[from.Rank]
	if !g.alive {
		return nil
	}
	l := s.layout
	prompt := 1 + r.IntN(8*l.TokensPerBlock)
	groups := make([]messages.GroupDest, len(l.Groups))
	for i := range groups {
		groups[i] = messages.GroupDest{Blocks: []int32{0}}
	}
	switch r.IntN(3) {
	case 0:
		gi := r.IntN(len(groups))
		groups[gi].Blocks = []int32{int32(g.hello.Pools[gi].Blocks) + int32(r.IntN(4))}
	case 1:
		groups = append(groups, messages.GroupDest{})
	default:
		groups[0].First = int32(l.BlocksFor(prompt))
	}
	rd := &messages.RequestData{RequestID: id, Epoch: r.Uint64(), From: from,
		GenParallel: messages.Parallel{TP: int32(s.genPar.TP), PP: int32(s.genPar.PP), Stages: s.genPar.Stages},
		GenTP:       int32(g.rank.TP), GenPP: int32(g.rank.PP), PromptLen: int32(prompt), Groups: groups}
	if err := rd.Validate(); err != nil {
		s.failf("sim: bogus RequestData is not well formed: %v", err)
		return nil
	}
	s.bogusFrames = append(s.bogusFrames, rd)
	return rd
}

func (s *Sim) isBogus(rd *messages.RequestData) bool {
	for _, b := range s.bogusFrames {
		if b == rd {
			return true
		}
	}
	return false
}

// stuck names, for a run that never went quiet, the first session still
// live with an op in flight (a context rank's), or else the first
// generation session still live.
func (s *Sim) stuck() string {
	for _, c := range s.ctx {
		if !c.alive {
			continue
		}
		for _, ts := range sortedSessions(c.sessions) {
			if !ts.s.Quiescent() {
				return fmt.Sprintf(": %s still %v with ops %v", ts.name, ts.s.State(), ts.s.OpStates())
			}
		}
	}
	for _, g := range s.gen {
		if !g.alive {
			continue
		}
		for _, id := range sortedIDs(g.entries) {
			rs := g.entries[id]
			return fmt.Sprintf(": %s still %v, writers without a proof %v", rs.name, rs.s.State(), rs.s.Unproven())
		}
	}
	return ""
}

// checkEnd runs once the queue is empty: every session stopped, every
// request terminal, every block back in its pool.
func (s *Sim) checkEnd() {
	for _, c := range s.ctx {
		if !c.alive {
			continue
		}
		for _, ts := range sortedSessions(c.sessions) {
			s.failf("%s never stopped: state %v, ops %v, pinned chunks %v", ts.name, ts.s.State(), ts.s.OpStates(), ts.s.PinnedChunks())
			return
		}
		for _, a := range c.apps {
			if !a.freed {
				s.failf("%s: source blocks never freed (done %v)", a.name(), a.done)
				return
			}
		}
		for _, w := range c.workers {
			if n := w.tbl.InFlight(); n > 0 {
				s.failf("%s: ops still in flight at the end: %d", w.name(), n)
				return
			}
		}
		for g, p := range c.pools {
			if st := p.Stats(); st.Free != st.Total {
				s.failf("%s group %d: %d blocks leaked (%+v)", c.name(), g, st.Total-st.Free, st)
				return
			}
		}
		s.checkPools(c.name(), c.pools)
	}
	for _, g := range s.gen {
		if !g.alive {
			continue
		}
		for _, id := range sortedIDs(g.entries) {
			rs := g.entries[id]
			s.failf("%s never stopped: state %v, writers quiescent %v", rs.name, rs.s.State(), rs.s.WritersQuiescent())
			return
		}
		for _, a := range g.apps {
			if !a.done {
				s.failf("%s: request never terminal", a.nm)
				return
			}
			if rs := a.rs; rs != nil && rs.neverConn && rs.deadlineAt == 1<<62 {
				s.failf("%s: a writer was never connected and no deadline timer was armed", rs.name)
				return
			}
			if rs := a.rs; rs != nil && rs.neverConn && !rs.released {
				s.failf("%s: a writer was never connected, yet the blocks were never released (state %v, stopped %v)",
					rs.name, rs.s.State(), rs.stop)
				return
			}
		}
		for grp, p := range g.pools {
			if st := p.Stats(); st.Free != st.Total {
				s.failf("%s group %d: %d blocks leaked (%+v)", g.name(), grp, st.Total-st.Free, st)
				return
			}
		}
		s.checkPools(g.name(), g.pools)
	}
	if len(s.batches) > 0 {
		s.failf("%d batches never settled", len(s.batches))
		return
	}
	if s.calm {
		// A context rank the peer map gives no link (MLA with a larger
		// context TP) is never asked: its Send ends FAILED at the deadline.
		writers := 0
		for _, c := range s.ctx {
			if len(s.pm.From(c.rank)) > 0 {
				writers++
			}
		}
		want := len(s.reqs)
		if s.res.Ready != want*len(s.gen) || s.res.NotReady != 0 || s.res.TxDone != want*writers || s.res.TxNotDone != want*(len(s.ctx)-writers) {
			s.failf("calm seed (no faults): gen READY %d / other %d, ctx DONE %d / other %d; want every one of %d requests READY on %d ranks and DONE on %d",
				s.res.Ready, s.res.NotReady, s.res.TxDone, s.res.TxNotDone, want, len(s.gen), writers)
		}
	}
}

// summarize renders a message for the trace.
func summarize(m any) string {
	switch m := m.(type) {
	case actors.TxChunk:
		return fmt.Sprintf("%v src=%v", m.Chunk, m.Src)
	case wSubmit:
		return fmt.Sprintf("op=%v worker=%d segs=%d bytes=%d", m.Op, m.Worker, len(m.Segments), m.Bytes)
	case wFlush:
		return fmt.Sprintf("peer=%d worker=%d", m.Peer, m.Worker)
	case wBatchDone:
		return fmt.Sprintf("op=%v err=%v", m.op, m.err)
	case wFlushDone:
		return fmt.Sprintf("peer=%d err=%v", m.peer, m.err)
	case actors.CloseEndpoint:
		return fmt.Sprintf("peer=%d worker=%d", m.Peer, m.Worker)
	case actors.SendFrame:
		return fmt.Sprintf("worker=%d to=%v %s", m.Worker, m.To, frameSummary(m.Frame))
	case actors.SendRequestData:
		return fmt.Sprintf("writer=%d worker=%d to=%v %s", m.Writer, m.Worker, m.To, frameSummary(m.Frame))
	case actors.TxPeerRequest:
		return fmt.Sprintf("peer=%d epoch=%d prompt=%d expected=%v err=%v", m.Peer, m.Epoch, m.PromptLen, m.Expected, m.Err)
	case actors.RxFrame:
		return fmt.Sprintf("writer=%d %s", m.Writer, frameSummary(m.Frame))
	case messages.Frame:
		return frameSummary(m)
	case panicInSend:
		return fmt.Sprintf("panicked inside the send (left: %v) of %s", m.Left, frameSummary(m.Frame))
	case held:
		return fmt.Sprintf("in its closed connection's linger until %v: %s", m.Until, frameSummary(m.Frame))
	case lostFrame:
		return "lost with its closed connection: " + frameSummary(m.Frame)
	case sentHeld:
		return m.String()
	case actors.TxStart:
		return fmt.Sprintf("prompt=%d deadline=%s", m.PromptLen, m.Deadline.Format(time.StampMicro))
	}
	return fmt.Sprintf("%+v", m)
}

func frameSummary(f messages.Frame) string {
	switch f := f.(type) {
	case *messages.RequestData:
		n := 0
		for _, g := range f.Groups {
			n += len(g.Blocks)
		}
		return fmt.Sprintf("RequestData %s epoch=%d from=%v blocks=%d", f.RequestID, f.Epoch, f.From, n)
	case *messages.Result:
		return fmt.Sprintf("Result %s epoch=%d from=%v %v bytes=%d err=%q", f.RequestID, f.Epoch, f.From, f.Status, f.Bytes, f.Error)
	case *messages.Cancel:
		return fmt.Sprintf("Cancel %s epoch=%d from=%v", f.RequestID, f.Epoch, f.From)
	case *messages.CancelAck:
		return fmt.Sprintf("CancelAck %s epoch=%d from=%v", f.RequestID, f.Epoch, f.From)
	}
	return fmt.Sprintf("%T", f)
}

// workerCrash is the message that makes a simulated worker panic (the
// engine's crash injection, present only in kvxfer_invariants builds).
type workerCrash struct{}
