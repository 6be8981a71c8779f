package sim

import (
	"slices"

	"github.com/kvxfer/kvxfer/actors"
)

// stopWorker is FaultWorkerDead: a sender worker of a live rank, on
// either side, spends its restart budget and is stopped for good
// (actors/engine.go: the senders' Terminated). A worker with frames in
// flight is chosen when there is one, so that its streams' and sessions'
// later frames, which go through the next live worker, race the frames its
// own connections still hold. A rank keeps at least one live worker: with
// none, no frame of it could leave, and its peers would wait for good for
// the proofs they need to free their blocks.
func (s *Sim) stopWorker() {
	type cand struct {
		gen          bool
		rank, worker int
	}
	var busy, all []cand
	add := func(c cand, inFlight bool) {
		all = append(all, c)
		if inFlight {
			busy = append(busy, c)
		}
	}
	for _, c := range s.ctx {
		if !s.cfg.CtxWorkerStops || !c.alive || c.liveWorkers() < 2 {
			continue
		}
		for _, w := range c.workers {
			if !w.stopped {
				// Under FaultCloseUnproven, a worker with writes on the
				// wire counts as busy too: its stop's closes may cut them.
				busy := s.inFlightFrom(false, c.idx, c.inc, w.idx) || s.faults.on[FaultCloseUnproven] && w.tbl.InFlight() > 0
				add(cand{false, c.idx, w.idx}, busy)
			}
		}
	}
	for _, g := range s.gen {
		if !g.alive || g.liveWorkers() < 2 || s.hasUnreachable(g.idx) {
			continue
		}
		for i, st := range g.wstop {
			if !st {
				add(cand{true, g.idx, i}, s.inFlightFrom(true, g.idx, g.inc, i))
			}
		}
	}
	if len(busy) > 0 {
		all = busy
	}
	if len(all) == 0 {
		return
	}
	c := all[s.cr.IntN(len(all))]
	if c.gen {
		s.gen[c.rank].stopWorker(c.worker)
		return
	}
	w := s.ctx[c.rank].workers[c.worker]
	s.mail("chaos", w.name(), 0, workerCrash{}, func() { w.stop() })
}

// hasUnreachable reports whether generation rank gi has a writer that can
// never be reached (FaultNeverConnected). Its workers do not stop: a
// RequestData lost in a stopped worker's mailbox gets no report, so its
// session waits for a proof of that writer's end — a CancelAck, which an
// unreachable writer never sends — and re-sends its Cancel for good.
func (s *Sim) hasUnreachable(gi int) bool {
	for _, q := range s.reqs {
		if q.ghost[gi] {
			return true
		}
	}
	for _, rf := range s.faults.refusals {
		if rf.gen == gi && rf.forever {
			return true
		}
	}
	return false
}

func (g *genRank) liveWorkers() int {
	n := 0
	for _, st := range g.wstop {
		if !st {
			n++
		}
	}
	return n
}

func (c *ctxRank) liveWorkers() int {
	n := 0
	for _, w := range c.workers {
		if !w.stopped {
			n++
		}
	}
	return n
}

// stop is a context rank's worker stopped for good (workerActor's
// Stopping): it closes every endpoint — no write of it lands any more,
// and the endpoints' ops are retired by TxWorkerDead, as the closers'
// reports reach a stopped actor — and every control connection; what its
// mailbox still holds is lost. Then the engine learns it (the senders'
// Terminated): it refuses new work, frames routed to the worker go
// through the next live one, ops for it are never posted, and every
// session hears TxWorkerDead from the tx parent.
func (w *worker) stop() {
	s, c := w.s, w.c
	if !w.live() || c.liveWorkers() < 2 {
		return
	}
	s.fired(FaultWorkerDead)
	w.stopped = true
	for _, k := range w.tbl.Keys() {
		ep, retired, _ := w.tbl.Close(k)
		ep.closed, ep.waiters = true, nil
		if cut, released := w.cutUnproven(ep, retired); cut != nil {
			// Their Done, and endpointClosed of a close that proved
			// their sources released, reach a stopped worker: lost. The
			// ops stay in doubt (TxWorkerDead.InDoubt), pins held, but
			// for those whose close proved their sources released: the
			// stop carries that (TxWorkerDead.Released).
			if released {
				w.released = append(w.released, retired...)
			}
			continue
		}
		for _, b := range slices.Clone(ep.pending) {
			s.settle(b) // it never lands
		}
	}
	s.closeConns(false, c.idx, w.inc, w.idx)
	inc := c.inc
	s.mail(w.name(), c.name()+"/senders", s.connHop(), "workerDead", func() {
		if !c.live(inc) {
			return
		}
		w.dead, c.failed = true, true
		s.mail(c.name()+"/senders", c.parentName(), s.connHop(), "workerDead", func() {
			if !c.live(inc) {
				return
			}
			for _, ts := range sortedSessions(c.sessions) {
				s.sendTx(c.parentName(), ts, actors.TxWorkerDead{Worker: w.idx, InDoubt: opsOf(w.unproven, ts), Released: opsOf(w.released, ts)})
			}
		})
	})
}

// stopWorker is a generation rank's worker stopped for good: it holds no
// ops, so its stop closes its control connections and loses its mailbox;
// then the engine refuses new work, frames routed to it go through the
// next live worker, and every session hears RxWorkerDead from the rx
// parent (those with a writer on it fail, and their Cancels leave on
// another worker's connections).
func (g *genRank) stopWorker(wi int) {
	s, inc := g.s, g.inc
	s.mail("chaos", g.workers[wi], 0, workerCrash{}, func() {
		g.onWorker(wi, func() {
			if !g.live(inc) || g.wstop[wi] || g.liveWorkers() < 2 {
				return
			}
			s.fired(FaultWorkerDead)
			g.wstop[wi] = true
			s.closeConns(true, g.idx, inc, wi)
			s.mail(g.workers[wi], g.nm+"/senders", s.connHop(), "workerDead", func() {
				if !g.live(inc) {
					return
				}
				g.wdead[wi], g.failed = true, true
				s.mail(g.nm+"/senders", g.parentName(), s.connHop(), "workerDead", func() {
					if !g.live(inc) {
						return
					}
					for _, id := range sortedIDs(g.entries) {
						s.sendRx(g.parentName(), g.entries[id], actors.RxWorkerDead{Worker: wi})
					}
				})
			})
		})
	})
}
