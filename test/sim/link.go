package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// errQueueFull is the simulated control connection's refusal: the frame
// does not leave this process (as control/zmq's ErrQueueFull).
var errQueueFull = errors.New("sim link: send queue full")

// linkSend is the simulated control link (ZeroMQ): every frame is encoded
// and decoded, delivered FIFO per connection (conn.go: a worker's
// connection to a peer, remade after a restart or a send error), and
// subject to the seed's faults — loss, duplication, delay,
// cross-connection reordering, and partitions (frames wait for the heal).
// Frames to or from an incarnation that dies in the meantime are lost with
// it; frames a generation rank sends to a context rank while it is down
// wait on the connection for its return and reach its next incarnation
// (ZeroMQ reconnects a DEALER to the same endpoint), addressed to the
// incarnation the sender knew.
//
// It returns an error when the frame does not leave this process, as
// control.Link's Dial and Conn.Send do: a peer that is in no directory (the
// dial fails), a RequestData refused for the frame itself
// (FaultFrameRefused: control.ErrFrameRefused), or a connection the seed's
// plan makes refuse frames (send queue full). A frame to a dead peer is taken and lost, as ZeroMQ queues
// frames for a peer that does not answer (a context rank that returns gets
// them, above). A refusal other than a full
// queue closes the worker's connection to the peer, as actors/worker.go
// does: its next frame goes on a new one.
func (s *Sim) linkSend(fromGen bool, from, inc, worker int, to messages.PeerID, f messages.Frame) error {
	b, err := messages.Encode(f)
	if err != nil {
		s.failf("a step produced a frame the codec refuses: %T: %v", f, err)
		return err
	}
	toGen := to.Instance == "gen"
	if !toGen && to.Instance != "ctx" || to.Rank < 0 ||
		toGen && int(to.Rank) >= len(s.gen) || !toGen && int(to.Rank) >= len(s.ctx) {
		return fmt.Errorf("%w: dial %s: no endpoint in the directory", control.ErrPeerGone, to)
	}
	if toGen == fromGen {
		s.failf("frame %T from %v side to its own side %v", f, fromGen, to)
		return errors.New("sim link: wrong side")
	}
	if rd, ok := f.(*messages.RequestData); ok && fromGen && s.faults.pFrameRefused > 0 && s.fr.Float64() < s.faults.pFrameRefused {
		// Refused for the frame itself (control/zmq's ErrFrameTooLarge:
		// past the writer's MaxFrameBytes, its Hello), before any check
		// of the connection, which is kept (actors/worker.go frameError).
		limit := len(b) - 1 - s.fr.IntN(len(b)/2)
		return fmt.Errorf("%w: sim link: send *messages.RequestData of request %q to %s: %d bytes exceeds the peer's MaxFrameBytes %d (its Hello)",
			control.ErrFrameRefused, rd.RequestID, to, len(b), limit)
	}
	if r, ok := f.(*messages.Result); ok && !fromGen && r.Status == messages.StatusSuccess &&
		s.faults.pResultRefused > 0 && s.yr.Float64() < s.faults.pResultRefused {
		// Refused for the frame itself (FaultResultRefused: its payload
		// past the generation rank's MaxFrameBytes, its Hello), before
		// any check of the connection, which is kept.
		limit := len(b) - 1 - s.yr.IntN(len(b)/2)
		return fmt.Errorf("%w: sim link: send *messages.Result of request %q to %s: %d bytes exceeds the peer's MaxFrameBytes %d (its Hello)",
			control.ErrFrameRefused, r.RequestID, to, len(b), limit)
	}
	if fromGen {
		if refused, _ := s.faults.refused(from, int(to.Rank), s.vt); refused {
			return fmt.Errorf("%w: %T to %s", errQueueFull, f, to)
		}
	} else if s.faults.unsentAt(from, int(to.Rank), s.vt) {
		s.fired(FaultResultUnsent)
		s.closeConn(linkKey{fromGen: fromGen, from: from, inc: inc, worker: worker, to: int(to.Rank)})
		return fmt.Errorf("%w: dial %s: refused", control.ErrPeerGone, to)
	}
	var toInc int
	var toName string
	base := s.vt // when the frame may leave for its peer
	queued := false
	if toGen {
		g := s.gen[to.Rank]
		if !g.alive {
			return nil
		}
		toInc, toName = g.inc, g.nm
	} else {
		c := s.ctx[to.Rank]
		if !c.alive {
			if c.backAt == 0 {
				return nil
			}
			// A generation rank's DEALER to a context rank that is down
			// but returns keeps its frames queued and reconnects to the
			// rank's next incarnation (same endpoint, same routing id):
			// they reach it once it is up, still addressed to the
			// incarnation the sender knew (ZeroMQ). Its draws come from
			// Sim.mr, so that no other draw moves.
			r := s.r
			s.r = s.mr
			defer func() { s.r = r }()
			base, queued = c.backAt, true
			toInc, toName = c.inc+1, fmt.Sprintf("ctx%d.%d", c.idx, c.inc+1)
		} else {
			toInc, toName = c.inc, c.name()
		}
	}
	if s.chance(s.faults.pDrop) {
		s.fired(FaultDrop)
		return nil
	}
	lat := s.between(20*time.Microsecond, 400*time.Microsecond)
	if s.chance(s.faults.pReorder) {
		lat += s.between(0, 4*time.Millisecond)
	}
	if s.chance(s.faults.pDelay) {
		s.fired(FaultDelay)
		lat += s.between(5*time.Millisecond, 60*time.Millisecond)
	}
	ci, gi := from, int(to.Rank)
	if fromGen {
		ci, gi = gi, ci
	}
	if end := s.faults.partitioned(ci, gi, base, base+lat); end > 0 {
		s.fired(FaultPartition)
		lat = end - base + s.between(20*time.Microsecond, 400*time.Microsecond)
	}
	cn := s.conn(linkKey{fromGen: fromGen, from: from, inc: inc, worker: worker, to: int(to.Rank)})
	t := max(base+lat, cn.last)
	cn.last = t
	s.frameSeq++
	n := s.frameSeq
	name := toName + "/listener"
	send := func() {
		w := &wire{c: cn, frame: f}
		cn.inflight = append(cn.inflight, w)
		if rd, ok := f.(*messages.RequestData); ok && fromGen {
			s.trackRequestData(w, requestKey{gen: from, inc: inc, ctx: int(to.Rank), request: rd.RequestID, epoch: rd.Epoch})
		}
		var deliver func()
		deliver = func() {
			if w.lost {
				return
			}
			if w.hold > s.vt {
				// Its connection closed meanwhile: it leaves in the linger.
				w.ev = s.at(w.hold, name, f, deliver)
				return
			}
			s.delivered(w)
			if fromGen && !s.gen[from].live(inc) || !fromGen && !s.ctx[from].live(inc) {
				return
			}
			fr, err := messages.Decode(b)
			if err != nil {
				s.failf("the codec refuses a frame it encoded: %v", err)
				return
			}
			if toGen {
				g := s.gen[to.Rank]
				if !g.live(toInc) {
					return
				}
				s.noteOrder(&g.maxFrame, n)
				g.onFrame(fr)
			} else {
				c := s.ctx[to.Rank]
				if !c.live(toInc) {
					return
				}
				if queued {
					s.res.QueuedToNext++
				}
				s.noteOrder(&c.maxFrame, n)
				if m, ok := fr.(*messages.Cancel); ok {
					s.noteCancel(requestKey{gen: from, inc: inc, ctx: int(to.Rank), request: m.RequestID, epoch: m.Epoch})
				}
				c.onFrame(fr)
			}
		}
		w.ev = s.at(t, name, f, deliver)
	}
	send()
	if s.chance(s.faults.pDup) {
		s.fired(FaultDuplicate)
		send()
	}
	return nil
}

// noteOrder counts a frame delivered after a frame sent later (on another
// connection) as a reordering.
func (s *Sim) noteOrder(maxSeen *uint64, n uint64) {
	if n < *maxSeen {
		if s.faults.on[FaultReorder] {
			s.fired(FaultReorder)
		}
		return
	}
	*maxSeen = n
}
