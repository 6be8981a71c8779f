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

// Errors of the simulated backend.
var (
	errRegistration = errors.New("sim backend: remote registration unusable")
	errBatch        = errors.New("sim backend: batch failed")
	errPartial      = errors.New("sim backend: batch failed after a partial write")
	errGone         = fmt.Errorf("sim backend: %w", rdma.ErrPeerGone)
	errUnproven     = fmt.Errorf("sim backend: cut by a forced close: %w: %w", rdma.ErrPeerGone, rdma.ErrCloseUnproven)
)

// Messages a simulated worker receives (besides the session's effects).
type (
	wSubmit struct {
		actors.Submit
		sess *txSess
	}
	wFlush struct {
		actors.Flush
		sess *txSess
	}
	wBatchDone struct {
		op   actors.OpRef
		sess *txSess
		err  error
	}
	wFlushDone struct {
		peer int
		err  error
	}
)

// worker is a simulated sender worker: it does what actors/worker.go does
// with Submit, Flush, CloseEndpoint and SendFrame, over a simulated
// backend whose batches land (copy bytes into the receiver's region) at a
// scheduled virtual time.
type worker struct {
	s   *Sim
	c   *ctxRank
	inc int
	idx int
	nm  string
	// tbl is the real worker's table (core.WorkerTable): endpoints, ops
	// in flight, what a close retires and a crash puts in doubt. Connects
	// are synchronous here: an endpoint opens in the step that needs it.
	tbl *core.WorkerTable[*txSess, *endpoint]
	// stopped: the worker stopped for good (FaultWorkerDead): what its
	// mailbox holds is lost. dead: the engine knows (shellEnv.dead): ops
	// for it are never posted, its frames go through the next live worker.
	stopped, dead bool
	// unproven are the ops of endpoints whose close proved nothing
	// (FaultCloseUnproven), by session: a stop names each session its
	// own (TxWorkerDead.InDoubt), as workerSlot.unprovenOps; a live
	// worker forgets a session's once it has stopped (sessionStopped).
	unproven []core.SessionOps[*txSess]
	// released are the ops of closes that proved their sources released
	// whose report the worker has not handled: a stop carries them
	// (TxWorkerDead.Released), as workerSlot.releasedOps.
	released []core.SessionOps[*txSess]
}

// sessionStopped: session ts has stopped. A live worker forgets its
// unproven ops, as workerSlot.sessionStopped (the worker watches it): a
// later session may reuse its request id, so its ops' refs.
func (w *worker) sessionStopped(ts *txSess) {
	if w.live() {
		w.unproven = slices.DeleteFunc(w.unproven, func(so core.SessionOps[*txSess]) bool { return so.Session == ts })
	}
}

// opsOf returns the ops of sos that belong to ts (workerDead.tx).
func opsOf(sos []core.SessionOps[*txSess], ts *txSess) []actors.OpRef {
	var out []actors.OpRef
	for _, so := range sos {
		if so.Session == ts {
			out = append(out, so.Ops...)
		}
	}
	return out
}

func (w *worker) name() string {
	if w.nm == "" {
		w.nm = fmt.Sprintf("ctx%d.%d/w%d", w.c.idx, w.inc, w.idx)
	}
	return w.nm
}

func (w *worker) live() bool { return w.c.live(w.inc) && !w.stopped }

// endpoint is one worker's connection to one generation incarnation.
type endpoint struct {
	w        *worker
	key      string
	gen      *genRank
	genInc   int
	closed   bool
	unproven bool          // its close proved nothing: cut writes may land
	doomed   bool          // the peer is dead; detection pending
	detectAt time.Duration // when the death is detected
	broken   error         // detected: every post and flush fails
	pending  []*batch
	waiters  []wFlushWaiter
}

type wFlushWaiter struct {
	peer int
	sess *txSess
}

// batch is one posted op.
type batch struct {
	w       *worker
	ep      *endpoint
	sess    *txSess
	op      actors.OpRef
	segs    []kvcache.Segment
	src     *ctxRank
	srcInc  int
	gen     *genRank
	genInc  int
	epoch   uint64
	err     error
	partial uint64 // bytes written before failing (errPartial)
	late    bool
	settled bool
	// hung: it completes only when its endpoint is closed
	// (FaultHungBatch). cut: an unproven close cut it (its Done was
	// called with ErrCloseUnproven), and it may still land.
	hung, cut bool
	// snap: the close that cut it proved its source released
	// (FaultCloseSourcesReleased): the bytes it had read then, per
	// segment, which is what may still land; it reads its source no more.
	snap [][]byte
	// landSeq numbers its landings scheduled (landCut re-draws a cut
	// one's): only the last one scheduled applies. cutAt: when a close
	// cut it.
	landSeq int
	cutAt   time.Duration
}

func (w *worker) toSession(ts *txSess, msg any) { w.s.sendTx(w.name(), ts, msg) }

func (w *worker) submit(m wSubmit) {
	s := w.s
	if !w.live() {
		return
	}
	ts := m.sess
	if st := ts.s.State(); st.Terminal() && !ts.stop {
		s.reached(RaceSubmitAfterFail)
	}
	// Record first: a crash from here on knows the op.
	w.tbl.Admit(m.Op, ts, string(m.Route.AgentAddr))
	ep, err := w.endpoint(m.Route, m)
	if err == nil {
		err = w.post(ep, m)
	}
	if err != nil {
		w.tbl.Settle(m.Op)
		w.toSession(ts, actors.TxCompleted{Op: m.Op, Err: err, Refused: true})
		return
	}
	// The post returned: the op is SUBMITTED (workerSlot.submit). Its
	// completion comes later through this worker, so after this.
	w.toSession(ts, actors.TxSubmitted{Op: m.Op})
}

func (w *worker) endpoint(r *actors.Route, m wSubmit) (*endpoint, error) {
	key := string(r.AgentAddr)
	if ep, open, _ := w.tbl.Endpoint(key, m); open {
		return ep, nil
	}
	meta, ok := w.c.routes[r]
	if !ok {
		w.s.failf("%s: Submit on a route the parent never resolved", w.name())
		return nil, errBatch
	}
	g := w.s.gen[meta.gen]
	if !g.live(meta.genInc) {
		return nil, fmt.Errorf("worker %d: connect to %s: %w", w.idx, r.Peer, rdma.ErrPeerGone)
	}
	ep := &endpoint{w: w, key: key, gen: g, genInc: meta.genInc}
	w.tbl.Connecting(key, m)
	w.tbl.Connected(key, ep, nil) // m is handled by the caller
	return ep, nil
}

func (w *worker) post(ep *endpoint, m wSubmit) error {
	s, c := w.s, w.c
	if s.faults.registrationDown(c.idx, s.vt) {
		s.fired(FaultRegistration)
		return errRegistration
	}
	if ep.broken != nil {
		return ep.broken
	}
	meta := c.routes[m.Route]
	if meta.request != m.Op.Request {
		s.failf("%s: op %v posted on the route of request %s", w.name(), m.Op, meta.request)
		return errBatch
	}
	for _, seg := range m.Segments {
		if !s.srcPinned(c, seg.Src, seg.Src+seg.Len, m.Op, "posted") {
			return errBatch
		}
	}
	b := &batch{w: w, ep: ep, sess: m.sess, op: m.Op, segs: m.Segments, src: c, srcInc: c.inc,
		gen: ep.gen, genInc: ep.genInc, epoch: meta.epoch}
	c.posted++
	ep.gen.postedTo++
	if ep.doomed {
		// The peer is dead: the batch can never land; it fails when the
		// death is detected.
		b.settled = true
		s.at(max(ep.detectAt, s.vt), w.name(), wBatchDone{b.op, b.sess, rdma.ErrPeerGone}, func() { w.batchDone(b.op, b.sess, errGone) })
		return nil
	}
	land := s.vt + s.between(50*time.Microsecond, 2*time.Millisecond)
	if s.chance(s.faults.pLate) {
		// A completion that straggles past the session's deadline: around
		// the deadline and its drain grace, or much later.
		if dl := m.sess.deadlineVT; dl > s.vt && s.r.IntN(4) > 0 {
			land = max(land, dl+s.between(0, s.drainGrace*3/2))
		} else {
			land += s.between(20*time.Millisecond, 150*time.Millisecond)
		}
		m.sess.lateOps[m.Op] = true
		b.late = true
	}
	if end := s.faults.partitioned(c.idx, ep.gen.idx, s.vt, land); end > 0 {
		s.fired(FaultPartition)
		land = max(land, end+s.between(50*time.Microsecond, time.Millisecond))
	}
	if end := s.faults.stallEnd(c.name()+"/", land); end > 0 && s.r.IntN(2) == 0 {
		// A shared-memory copy stopped midway by the pause: it ends after
		// the resume (an RDMA write would land on time: the NIC goes on).
		s.fired(FaultStall)
		land = end + s.between(10*time.Microsecond, 500*time.Microsecond)
	}
	var total uint64
	for _, seg := range m.Segments {
		total += seg.Len
	}
	switch {
	case s.chance(s.faults.pBatchFail):
		b.err = errBatch
	case s.chance(s.faults.pPartial) && total >= 2:
		b.err = errPartial
		b.partial = 1 + uint64(s.r.Int64N(int64(total-1)))
	}
	ep.pending = append(ep.pending, b)
	s.batches = append(s.batches, b)
	if s.faults.pHung > 0 && s.hr.Float64() < s.faults.pHung {
		// It hangs: no landing, no completion, until its endpoint is
		// closed (closeEndpoint) or its peer's death is detected.
		s.fired(FaultHungBatch)
		b.hung = true
		return nil
	}
	s.at(land, "backend", b.op, func() {
		if b.landSeq == 0 {
			s.land(b)
		}
	})
	return nil
}

// srcPinned asserts that the source bytes [lo, hi) lie in pinned blocks.
func (s *Sim) srcPinned(c *ctxRank, lo, hi uint64, op actors.OpRef, what string) bool {
	ok := true
	blocksOf(c.pools, lo, hi, func(g int, id kvcache.BlockID) {
		if !ok {
			return
		}
		if st, _ := c.pools[g].State(id); st != kvcache.BlockPinned {
			s.failf("%s: a write of op %v %s reading group %d block %d, which is %v", c.name(), op, what, g, id, st)
			ok = false
		}
	})
	return ok
}

// srcWritten asserts that the source bytes [lo, hi) a write reads were
// written by the serving process before a fence that fired: every layer
// they touch is recorded in the rank's written set (an op of a layer
// part that read a later part's layers would copy stale bytes).
func (s *Sim) srcWritten(c *ctxRank, lo, hi uint64, op actors.OpRef) bool {
	l := s.layout
	for g, p := range c.pools {
		bb := p.BlockBytes()
		start := p.Offset(0)
		end := start + bb*uint64(p.Len())
		if hi <= start || lo >= end {
			continue
		}
		layerBytes := uint64(l.Parts() * c.shape.Heads() * l.TokensPerBlock * l.TokenBytes())
		data := layerBytes * uint64(len(c.shape.Layers[g]))
		for id := (max(lo, start) - start) / bb; start+id*bb < min(hi, end); id++ {
			b0 := start + id*bb
			a, e := max(lo, b0)-b0, min(hi, b0+bb)-b0
			if e > data {
				s.failf("%s: a write of op %v reads group %d block %d bytes [%d, %d), past its %d bytes of KV (padding)",
					c.name(), op, g, id, a, e, data)
				return false
			}
			written := c.written[blockKey{g, kvcache.BlockID(id)}]
			for li := a / layerBytes; li <= (e-1)/layerBytes; li++ {
				if written&(1<<li) == 0 {
					s.failf("%s: a write of op %v reads group %d block %d layer %d before the serving process wrote it (no fence of it fired)",
						c.name(), op, g, id, c.shape.Layers[g][li])
					return false
				}
			}
		}
	}
	return true
}

// land applies a batch: its bytes land in the receiver's region now.
func (s *Sim) land(b *batch) {
	if b.settled {
		return
	}
	if b.cut && (!b.src.live(b.srcInc) || !b.gen.live(b.genInc)) {
		s.settle(b) // gone with its writer's or its target's process
		return
	}
	switch {
	case b.ep.closed && !b.cut:
		s.failf("backend: a write of op %v lands after its endpoint closed", b.op)
		return
	case !b.src.live(b.srcInc) || !b.gen.live(b.genInc):
		s.failf("backend: a write of op %v lands across a dead incarnation", b.op)
		return
	}
	budget := ^uint64(0)
	switch b.err {
	case errBatch:
		budget = 0
		s.fired(FaultBatchFailure)
	case errPartial:
		budget = b.partial
		s.fired(FaultPartialWrite)
	}
	src, dst := b.src.region.Bytes(), b.gen.region.Bytes()
	for i, seg := range b.segs {
		n := min(seg.Len, budget)
		if n == 0 {
			break
		}
		budget -= n
		if b.snap != nil {
			// Cut by a close that proved its source released: what lands
			// is what it had read, wherever its source pages went since.
			if !s.dstOwned(b, seg.Dst, seg.Dst+n) {
				return
			}
			copy(dst[seg.Dst:seg.Dst+n], b.snap[i][:n])
			continue
		}
		if !s.srcPinned(b.src, seg.Src, seg.Src+n, b.op, "landing") || !s.srcWritten(b.src, seg.Src, seg.Src+n, b.op) {
			return
		}
		if !s.dstOwned(b, seg.Dst, seg.Dst+n) {
			return
		}
		copy(dst[seg.Dst:seg.Dst+n], src[seg.Src:seg.Src+n])
	}
	s.settle(b)
	if b.cut {
		if s.vt-b.cutAt >= lateCut {
			s.fired(FaultCutLandsLate)
		}
		return // its Done was called when the close cut it
	}
	w, err := b.w, b.err
	s.mail("backend", w.name(), s.between(10*time.Microsecond, 300*time.Microsecond), wBatchDone{b.op, b.sess, err}, func() { w.batchDone(b.op, b.sess, err) })
}

// dstOwned asserts the physical half of the rule on the destination side:
// a write lands only in blocks its request's session still owns.
func (s *Sim) dstOwned(b *batch, lo, hi uint64) bool {
	ok := true
	g := b.gen
	blocksOf(g.pools, lo, hi, func(grp int, id kvcache.BlockID) {
		if !ok {
			return
		}
		o := g.owner[grp][id]
		if o == nil || o.req.id != b.op.Request || o.epoch != b.epoch {
			who := "nobody (free)"
			if o != nil {
				who = fmt.Sprintf("%s epoch %d", o.req.id, o.epoch)
			}
			s.failf("backend: write of op %v (epoch %d) lands in %s group %d block %d, owned by %s",
				b.op, b.epoch, g.name(), grp, id, who)
			ok = false
		}
	})
	return ok
}

// settle takes a batch off the in-flight lists.
func (s *Sim) settle(b *batch) {
	b.settled = true
	if i := slices.Index(s.batches, b); i >= 0 {
		s.batches = slices.Delete(s.batches, i, i+1)
	}
	ep := b.ep
	if i := slices.Index(ep.pending, b); i >= 0 {
		ep.pending = slices.Delete(ep.pending, i, i+1)
	}
	ep.checkWaiters()
}

// batchDone is the backend's Done callback reaching the worker: the op
// leaves the in-flight table and its session hears the outcome (even when
// a close already retired it).
func (w *worker) batchDone(op actors.OpRef, ts *txSess, err error) {
	if !w.live() {
		return
	}
	w.tbl.Settle(op)
	w.toSession(ts, actors.TxCompleted{Op: op, Err: err, Unproven: errors.Is(err, rdma.ErrCloseUnproven)})
}

func (w *worker) flush(m wFlush) {
	if !w.live() {
		return
	}
	ep, open, _ := w.tbl.Endpoint(string(m.Route.AgentAddr), m)
	if !open {
		w.toSession(m.sess, actors.TxFlushed{Peer: m.Peer})
		return
	}
	ep.waiters = append(ep.waiters, wFlushWaiter{peer: m.Peer, sess: m.sess})
	if ep.broken != nil {
		ep.failWaiters(ep.broken)
		return
	}
	ep.checkWaiters()
}

// checkWaiters completes flushes once nothing posted before them is pending.
func (ep *endpoint) checkWaiters() {
	if len(ep.waiters) == 0 || len(ep.pending) > 0 || ep.doomed || ep.closed {
		return
	}
	s, w := ep.w.s, ep.w
	ws := ep.waiters
	ep.waiters = nil
	d := s.between(10*time.Microsecond, 300*time.Microsecond)
	if end := s.faults.partitioned(w.c.idx, ep.gen.idx, s.vt, s.vt+d); end > 0 {
		s.fired(FaultPartition)
		d = end - s.vt + d
	}
	for _, wt := range ws {
		msg := wFlushDone{peer: wt.peer}
		s.mail("backend", w.name(), d, msg, func() {
			if w.live() {
				w.toSession(wt.sess, actors.TxFlushed{Peer: wt.peer})
			}
		})
	}
}

func (ep *endpoint) failWaiters(err error) {
	s, w := ep.w.s, ep.w
	ws := ep.waiters
	ep.waiters = nil
	for _, wt := range ws {
		msg := wFlushDone{peer: wt.peer, err: err}
		s.mail("backend", w.name(), s.hop(), msg, func() {
			if w.live() {
				w.toSession(wt.sess, actors.TxFlushed{Peer: wt.peer, Err: err})
			}
		})
	}
}

// closeEndpoint is workerSlot.closeEndpoint: after it no write of the
// endpoint can land; every unfinished batch completes with
// ErrEndpointClosed, and the ops in flight on it are reported retired.
func (w *worker) closeEndpoint(key string) {
	s := w.s
	if !w.live() {
		return
	}
	ep, retired, ok := w.tbl.Close(key)
	if !ok {
		return
	}
	ep.closed = true
	if cut, released := w.cutUnproven(ep, retired); cut != nil {
		// workerSlot.closeEndpoint after an ErrCloseUnproven: each cut
		// batch's Done says so, and no op is retired — unless the close
		// proved their sources released (rdma.ErrSourcesReleased): then,
		// once Close returned (after every Done), endpointClosed retires
		// them unproven.
		for _, b := range cut {
			op, ts := b.op, b.sess
			s.mail("backend", w.name(), s.hop(), wBatchDone{op, ts, errUnproven}, func() { w.batchDone(op, ts, errUnproven) })
		}
		ep.failWaiters(errUnproven)
		if released {
			w.released = append(w.released, retired...)
			s.mail("backend", w.name(), s.hop(), "endpoint closed, sources released", func() {
				if !w.live() {
					return // lost: the worker's stop carries it
				}
				w.released = slices.DeleteFunc(w.released, func(so core.SessionOps[*txSess]) bool {
					return slices.ContainsFunc(retired, func(r core.SessionOps[*txSess]) bool {
						return r.Session == so.Session && slices.Equal(r.Ops, so.Ops)
					})
				})
				for _, so := range retired {
					w.toSession(so.Session, actors.TxRetired{Ops: so.Ops, Unproven: true})
				}
			})
		}
		return
	}
	for _, b := range slices.Clone(ep.pending) {
		s.settle(b)
		op, ts := b.op, b.sess
		s.mail("backend", w.name(), s.hop(), wBatchDone{op, ts, rdma.ErrEndpointClosed}, func() { w.batchDone(op, ts, rdma.ErrEndpointClosed) })
	}
	ep.failWaiters(rdma.ErrEndpointClosed)
	for _, so := range retired {
		w.toSession(so.Session, actors.TxRetired{Ops: so.Ops})
	}
}

// cutUnproven decides whether the close of ep, with writes on the wire,
// proves nothing (FaultCloseUnproven): then its unfinished batches are
// cut but may still land, at any time until the writer's process exits
// (landCut; a hung one too), the ops the close would have retired are
// in doubt for good (w.unproven), and the writer's process exits a while
// later (its supervisor restarts it: its pool's deregistration fails
// busy; exitDelay), which is what settles them; with
// Config.CtxWorkerStops the worker may stop for good before that. It
// returns the cut batches, or nil for a close that proves, and whether
// the close proves their sources released
// (FaultCloseSourcesReleased): then each keeps the bytes it had read
// (what may still land) and reads its source no more, and the ops are
// retired unproven (the caller).
func (w *worker) cutUnproven(ep *endpoint, retired []core.SessionOps[*txSess]) (cut []*batch, released bool) {
	s, c := w.s, w.c
	if len(ep.pending) == 0 || s.faults.pUnproven == 0 || s.xr.Float64() >= s.faults.pUnproven {
		return nil, false
	}
	s.fired(FaultCloseUnproven)
	if released = s.rr.IntN(2) == 0; released {
		s.fired(FaultCloseSourcesReleased)
	}
	ep.unproven = true
	cut = ep.pending
	ep.pending = nil
	for _, b := range cut {
		b.cut = true
		if released {
			// The bytes on the wire were read while the source was
			// pinned and written; from now on it may be unpinned, freed
			// and reused.
			b.snap = make([][]byte, len(b.segs))
			src := b.src.region.Bytes()
			for i, seg := range b.segs {
				if !s.srcPinned(b.src, seg.Src, seg.Src+seg.Len, b.op, "cut") || !s.srcWritten(b.src, seg.Src, seg.Src+seg.Len, b.op) {
					return cut, released
				}
				b.snap[i] = slices.Clone(src[seg.Src : seg.Src+seg.Len])
			}
		}
	}
	w.unproven = append(w.unproven, retired...)
	if !c.exitDue {
		c.exitDue = true
		inc := c.inc
		d := death{rank: c.idx, at: s.vt + s.exitDelay()}
		if s.xr.IntN(2) == 0 {
			d.back = d.at + time.Millisecond + time.Duration(s.xr.Int64N(int64(40*time.Millisecond)))
		}
		c.exitAt = d.at
		s.at(d.at, "chaos", "death", func() {
			if c.live(inc) {
				s.kill(d)
			}
		})
	}
	for _, b := range cut {
		b.hung = false
		s.landCut(b, c.exitAt)
	}
	if s.cfg.CtxWorkerStops {
		// The worker may stop for good (FaultWorkerDead) before the exit,
		// holding those ops in doubt: its stop must name them
		// (TxWorkerDead.InDoubt), whatever sessions stopped meanwhile.
		at := s.vt + time.Duration(s.xr.Int64N(int64(max(c.exitAt-s.vt, time.Microsecond))))
		s.at(at, "chaos", "workerStop", func() {
			s.mail("chaos", w.name(), 0, workerCrash{}, func() { w.stop() })
		})
	}
	return cut, released
}

// lateCut is how late after its cut a cut write's landing counts as
// FaultCutLandsLate (the simulator let them land within 30 ms once).
const lateCut = 100 * time.Millisecond

// maxExitDelay bounds how long after its first unproven close a writer's
// process exits (FaultCloseUnproven): far past every deadline, drain
// grace, Cancel re-send, worker stop and session stop of a seed.
const maxExitDelay = 4 * time.Second

// exitDelay draws how long after its first unproven close a writer's
// process exits: log-uniform from 20 ms to maxExitDelay, so that as many
// exits come before a seed's deadlines as long after them.
func (s *Sim) exitDelay() time.Duration {
	const lo = 20 * time.Millisecond
	return time.Duration(float64(lo) * math.Pow(float64(maxExitDelay)/float64(lo), s.xr.Float64()))
}

// landCut draws when a batch cut by an unproven close (ErrCloseUnproven,
// with or without ErrSourcesReleased) lands, if ever: the close proved
// nothing, so its writes may land at any time until the writer's process
// exits (exit, the proof that settles them), past every deadline, Cancel,
// worker stop and session stop — or never (they settle with the exit).
// Its landing scheduled at its post no longer applies: a write its
// backend did not prove over owes nothing to when it was due.
func (s *Sim) landCut(b *batch, exit time.Duration) {
	b.cutAt = s.vt
	b.landSeq++
	seq := b.landSeq
	left := max(exit-s.vt, time.Microsecond)
	var at time.Duration
	switch k := s.xr.IntN(8); {
	case k == 0:
		return // never: it settles with its writer's exit
	case k <= 2:
		// Soon: what was on the wire lands shortly after the cut.
		at = s.vt + time.Duration(s.xr.Int64N(int64(min(left, 30*time.Millisecond))))
	case k <= 4:
		// Any time until the exit.
		at = s.vt + time.Duration(s.xr.Int64N(int64(left)))
	default:
		// Just before the exit: after whatever the engine did meanwhile
		// with the pages it wrote and read.
		at = exit - time.Duration(s.xr.Int64N(int64(min(left, 2*time.Millisecond)))) - 1
	}
	s.at(max(at, s.vt), "backend", b.op, func() {
		if b.landSeq == seq {
			s.land(b)
		}
	})
}

// crash is a worker panic and its supervisor's restart (workerSlot.restart):
// every op in flight is in doubt, then every endpoint is closed, then
// every control connection.
func (w *worker) crash() {
	s := w.s
	if !w.live() {
		return
	}
	s.fired(FaultWorkerPanic)
	crashed := fmt.Errorf("%w: worker %d", actors.ErrWorkerCrashed, w.idx)
	refused, doubt, keys := w.tbl.Restart(func(any) bool { return true })
	for _, so := range refused {
		for _, ref := range so.Ops {
			w.toSession(so.Session, actors.TxCompleted{Op: ref, Err: crashed, Refused: true})
		}
	}
	for _, so := range doubt {
		for _, ref := range so.Ops {
			if so.Session.s.OpStates()[ref] == actors.OpSubmitted {
				s.reached(RaceWorkerPanicSubmitted)
			}
		}
		w.toSession(so.Session, actors.TxInDoubt{Ops: so.Ops, Reason: crashed})
	}
	for _, k := range keys {
		w.closeEndpoint(k)
	}
	// Its control connections are closed too: its next frames dial anew.
	s.closeConns(false, w.c.idx, w.inc, w.idx)
}

// panicInSend is the trace's record of a worker that panicked inside the
// send of Frame (Left: the frame had left).
type panicInSend struct {
	Frame messages.Frame
	Left  bool
}

// pPanicInSend is the probability, with worker panics on, that a worker
// panics inside the send of a stream's terminal frame.
const pPanicInSend = 0.05

// send hands a frame to the control plane. A stream's terminal frame
// (ts set, FromStream) is reported to its session (workerSlot.send,
// TxSent); any other frame the control plane refuses is lost (the
// receiver's Cancel re-send and deadline cover it).
func (w *worker) send(ts *txSess, e actors.SendFrame) {
	if !w.live() {
		return
	}
	if ts != nil && e.FromStream && w.s.faults.on[FaultWorkerPanic] && w.s.chance(pPanicInSend) {
		// The worker panics inside the send (workerSlot.restart's
		// sending): the frame left or not, nobody knows which; the
		// stream's session hears it was not sent, then the restart's
		// reports follow.
		left := w.s.chance(0.5)
		if left {
			_ = w.s.linkSend(false, w.c.idx, w.inc, w.idx, e.To, e.Frame)
		}
		w.s.note(w.name(), panicInSend{Frame: e.Frame, Left: left})
		w.toSession(ts, actors.TxSent{Peer: e.Peer, Err: fmt.Errorf("%w: worker %d", actors.ErrWorkerCrashed, w.idx)})
		w.crash()
		return
	}
	err := w.s.linkSend(false, w.c.idx, w.inc, w.idx, e.To, e.Frame)
	if ts == nil || !e.FromStream {
		return
	}
	if err != nil {
		if ts.unsent == nil {
			ts.unsent = map[int]error{}
		}
		ts.unsent[e.Peer] = err
		if r, ok := e.Frame.(*messages.Result); ok && r.Status == messages.StatusSuccess && core.RefusedForGood(err) {
			if ts.refusedTo == nil {
				ts.refusedTo = map[int]messages.PeerID{}
			}
			ts.refusedTo[e.Peer] = e.To
		}
	}
	w.toSession(ts, actors.TxSent{Peer: e.Peer, Err: err})
}

// genDied fails every endpoint to a dead generation incarnation: nothing
// more lands there; posted batches fail when the death is detected.
func (s *Sim) genDied(g *genRank, inc int) {
	detect := s.between(time.Millisecond, 10*time.Millisecond)
	for _, c := range s.ctx {
		if !c.alive {
			continue
		}
		for _, w := range c.workers {
			var keys []string
			for _, k := range w.tbl.Keys() {
				if ep, _ := w.tbl.Lookup(k); ep.gen == g && ep.genInc == inc {
					keys = append(keys, k)
				}
			}
			for _, k := range keys {
				ep, _ := w.tbl.Lookup(k)
				ep.doomed = true
				ep.detectAt = s.vt + detect
				// Batches still in flight never land; each fails when the
				// death is detected.
				for _, b := range slices.Clone(ep.pending) {
					s.settle(b)
					s.after(detect, w.name(), wBatchDone{b.op, b.sess, rdma.ErrPeerGone}, func() { w.batchDone(b.op, b.sess, errGone) })
				}
				s.after(detect, w.name(), "peer gone", func() {
					if !w.live() {
						return
					}
					ep.broken = errGone
					ep.failWaiters(ep.broken)
				})
			}
		}
	}
}

// ctxDied drops every write of a dead context incarnation: its process
// is gone, nothing it posted lands any more.
func (s *Sim) ctxDied(c *ctxRank) {
	for _, b := range slices.Clone(s.batches) {
		if b.src == c && b.srcInc == c.inc {
			s.settle(b)
		}
	}
}
