package sim

import (
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// heardAfter is when, after a stall ends or a partition heals, the
// generation ranks hear the context rank's heartbeats again; heardHop the
// rx parent's hand-off of RxHeard to a session. Fixed, not drawn: no draw
// of a seed moves.
const (
	heardAfter = time.Millisecond
	heardHop   = 50 * time.Microsecond
)

// declareHeard delivers Engine.PeerAlive for context rank ctx to every
// live generation rank (only to rank `only` when it is not -1): its
// heartbeats come back after a stall or a partition.
func (s *Sim) declareHeard(ctx, only int) {
	c := s.ctx[ctx]
	if !c.alive {
		return
	}
	for _, g := range s.gen {
		if g.alive && (only < 0 || g.idx == only) {
			g.heardAgain(c)
		}
	}
}

// heardAgain is rxParent's peerAlive (Engine.PeerAlive) for context rank
// c, which the failure detector had declared down: the control plane
// hears it again, in its current incarnation, so the table takes it out
// of the down set and every session it writes for hears RxHeard — those
// that suspected it of missed heartbeats send it the Cancel again at once
// (FaultHeardAgain, counted when a session has such a writer). Nothing is
// freed but on the writer's answer (ReleaseDest's checks).
func (g *genRank) heardAgain(c *ctxRank) {
	s := g.s
	peer := messages.PeerID{Instance: "ctx", Rank: int32(c.idx)}
	if !g.table.IsDown(peer) {
		return
	}
	g.table.Heard(peer)
	if len(g.table.WriterRefs(peer)) > 0 {
		s.fired(FaultHeardAgain)
	}
	g.tellHeard(peer, c.incarnation())
}

// tellHeard is rxParent.tellHeard: every session peer writes for hears
// RxHeard for its incarnation inc, once peer left the down set (its
// heartbeats, a request's start that found its Hello current, a frame of
// it).
func (g *genRank) tellHeard(peer messages.PeerID, inc uint64) {
	s := g.s
	for _, r := range g.table.WriterRefs(peer) {
		rs := g.entries[r.Request]
		if rs == nil {
			continue
		}
		msg := actors.RxHeard{Writer: r.Writer, Incarnation: inc}
		s.mail(g.parentName(), rs.name, heardHop, msg, func() { s.stepRx(rs, msg) })
	}
}
