package sim

import (
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// exitDowns is the node's pidfd watch of a same-host peer
// (FaultIncarnationDown): when incarnation inc (0-based) of a rank exits,
// every live rank on the other side takes that incarnation down at once —
// Engine.PeerIncarnationDown(peer, inc+1, "exited …"), through its parents
// as the engine does — which is no proof that its writes are over. Each
// rank hears it after a delay drawn from Sim.dr: soon (0.1 to 2 ms), or,
// for a rank that returns, one time in two after its next incarnation
// booted (0.1 to 30 ms after the return: a watcher slow to read its
// pidfd), when it must leave the new incarnation's requests alone.
func (s *Sim) exitDowns(d death, inc int) {
	if !s.faults.incDown {
		return
	}
	late := d.back > 0 && s.dr.IntN(2) == 0
	delay := func() time.Duration {
		if late {
			return d.back - d.at + s.drBetween(100*time.Microsecond, maxExitProofDelay)
		}
		return s.drBetween(100*time.Microsecond, 2*time.Millisecond)
	}
	if d.gen {
		peer := s.gen[d.rank].self
		for _, c := range s.ctx {
			if !c.alive {
				continue
			}
			c, cinc := c, c.inc
			s.after(delay(), c.parentName(), "incarnationDown", func() {
				if c.live(cinc) {
					s.noteIncDown(true, d.rank, inc)
					c.peerDown(peer, uint64(inc+1), fmt.Sprintf("%d exited (its process is gone: pidfd)", inc+1))
				}
			})
		}
		return
	}
	peer := s.ctx[d.rank].self
	for _, g := range s.gen {
		if !g.alive {
			continue
		}
		g, ginc := g, g.inc
		s.after(delay(), g.parentName(), "incarnationDown", func() {
			if g.live(ginc) {
				s.noteIncDown(false, d.rank, inc)
				g.incarnationDown(peer, uint64(inc+1))
			}
		})
	}
}

// drBetween is between, drawn from Sim.dr.
func (s *Sim) drBetween(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(s.dr.Int64N(int64(hi-lo)))
}

// noteIncDown counts a Down of incarnation inc of a rank, and whether its
// successor had booted.
func (s *Sim) noteIncDown(gen bool, rank, inc int) {
	s.fired(FaultIncarnationDown)
	var now int
	if gen {
		now = s.gen[rank].inc
	} else {
		now = s.ctx[rank].inc
	}
	if now > inc {
		s.fired(FaultIncarnationDownReplaced)
	}
}

// incarnationDown is rxParent's peerDown for incarnation inc of a context
// rank (core.RxTable.PeerDown): the requests addressed to that
// incarnation, or an earlier one, suspect it (no proof: their blocks stay
// quarantined until one); those addressed to a later one go on.
func (g *genRank) incarnationDown(peer messages.PeerID, inc uint64) {
	s := g.s
	s.downCloseConns(true, g.idx, g.inc, g.workers, g.parentName(), int(peer.Rank))
	for _, r := range g.table.PeerDown(peer, inc) {
		rs := g.entries[r.Request]
		if rs == nil || r.Writer < 0 || r.Writer >= len(rs.writerInc) {
			s.failf("%s: RxTable.PeerDown(%v, %d) names writer %d of request %s, which this rank has no session of", g.name(), peer, inc, r.Writer, r.Request)
			return
		}
		s.sendRx(g.parentName(), rs, actors.RxSuspect{Writer: r.Writer, Incarnation: inc,
			Err: fmt.Errorf("%w: %s %d exited (its process is gone: pidfd)", actors.ErrPeerGone, peer, inc)})
	}
}

// checkIncDown: a Down of incarnation m.Incarnation of a generation rank
// decides a live context session only if the session has a stream to
// that incarnation or an earlier one (a route resolved from its
// RequestData): a restarted peer's requests go on.
func (s *Sim) checkIncDown(ts *txSess, m actors.TxPeerGone, before, after actors.TxState) {
	if m.Incarnation == 0 || before.Terminal() || !after.Terminal() {
		return
	}
	for _, rm := range ts.c.routes {
		if rm.request == ts.id && rm.gen == int(m.Peer.Rank) && uint64(rm.genInc+1) <= m.Incarnation {
			return
		}
	}
	s.failf("%s: the Down of %v's incarnation %d failed the session, which has no stream to that incarnation or an earlier one",
		ts.name, m.Peer, m.Incarnation)
}
