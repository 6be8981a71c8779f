package sim

import (
	"math/rand/v2"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// linkKey names a sender worker's control connections to one peer: a
// worker's DEALER to a peer's ROUTER (control/zmq.Conn), in one direction.
// A key has one open connection at a time, but over its life it may have
// many (conn.id): the worker remakes it after a restart, a stop or a send
// error.
type linkKey struct {
	fromGen           bool
	from, inc, worker int
	to                int
}

// connTable is the simulated control plane's connections.
type connTable struct {
	// open holds each key's open connection; ids counts the connections
	// each key has had; seen is the newest connection of each key a frame
	// arrived on.
	open      map[linkKey]*conn
	ids, seen map[linkKey]int
	// requests counts the RequestData on the wire (Result.CancelsOvertook).
	requests map[requestKey]int
}

func newConnTable() connTable {
	return connTable{open: map[linkKey]*conn{}, ids: map[linkKey]int{}, seen: map[linkKey]int{}, requests: map[requestKey]int{}}
}

// conn is one control connection of a key. ZeroMQ keeps frames in order
// within one connection only: frames of a newer connection of the same
// worker to the same peer may overtake frames still in flight on an older
// one.
type conn struct {
	key  linkKey
	id   int           // the key's how-many-th connection (0: the first)
	last time.Duration // when its last frame is delivered (FIFO)
	// inflight holds the frames sent and not yet delivered or lost, in
	// the order they were sent.
	inflight []*wire
}

// wire is one frame in flight on a connection.
type wire struct {
	c     *conn
	frame messages.Frame
	// hold: the frame is delivered no earlier than this (its connection
	// closed while it waited: it leaves within the socket's linger).
	hold time.Duration
	// lost: its connection closed and dropped it (past the linger).
	lost bool
	// gone, when set, runs once the frame is delivered or lost.
	gone func()
	// ev is its delivery event, whose message a hold or a loss renames
	// (held, lost) so that a trace shows what became of it.
	ev *event
}

// held is the trace's name for a frame whose connection closed before it
// was delivered: at this time it is still in the socket's linger, and it
// arrives at Until.
type held struct {
	Frame messages.Frame
	Until time.Duration
}

// lostFrame is the trace's name for a frame its closed connection dropped.
type lostFrame struct{ Frame messages.Frame }

// conn returns k's open connection, dialling a new one when it has none
// (control/zmq's Link.Dial, on a worker's first frame to a peer or its
// first after the last connection closed).
func (s *Sim) conn(k linkKey) *conn {
	c := s.links.open[k]
	if c == nil {
		c = &conn{key: k, id: s.links.ids[k]}
		s.links.ids[k]++
		s.links.open[k] = c
	}
	return c
}

// closeConn closes k's open connection, if any, as a worker does after a
// send error other than a full queue and on a restart
// (control/zmq.Conn.Close): the next frame goes on a new connection.
// Frames the old one still holds get the socket's linger to leave: they
// arrive as they would have, or — FaultConnRemade — only after a while
// (frames of the new connection overtake them), or the tail of them is
// lost (the linger ran out before they left).
func (s *Sim) closeConn(k linkKey) {
	c := s.links.open[k]
	if c == nil {
		return
	}
	delete(s.links.open, k)
	if !s.faults.on[FaultConnRemade] || len(c.inflight) == 0 {
		return
	}
	s.linger(c, s.cr, FaultConnRemade)
}

// linger is a closed connection's linger: the frames c still holds leave
// only after a while, drawn from r (frames of a newer connection of its
// key may overtake them), or the tail of them is lost; each lost frame
// counts fault f.
func (s *Sim) linger(c *conn, r *rand.Rand, f Fault) {
	hold := s.vt + 500*time.Microsecond + time.Duration(r.Int64N(int64(maxLinger-500*time.Microsecond)))
	keep := len(c.inflight)
	if r.Float64() < pLingerLost {
		keep = r.IntN(len(c.inflight))
	}
	for i, w := range c.inflight {
		if i >= keep {
			w.lost = true
			if w.gone != nil {
				w.gone()
			}
			w.ev.msg = lostFrame{w.frame}
			s.fired(f)
			continue
		}
		if w.ev.at < hold {
			w.hold = hold
			w.ev.msg = held{Frame: w.frame, Until: hold}
		}
	}
	c.inflight = c.inflight[:keep]
}

// downCloseConns is a worker's workerPeerDown (actors/worker.go): the
// control plane declared peer `to` down, and each sender worker of the
// rank closes its connection to it — a mailbox hop after the Down, in
// order with the frames the worker takes meanwhile — whose frames still
// in flight then leave late within the linger, or the tail of them is
// lost (FaultDownClosesConn, drawn from Sim.wr). The worker's next frame
// to the peer dials anew. Only with the fault on: off, a seed's draws do
// not move.
func (s *Sim) downCloseConns(fromGen bool, from, inc int, workers []string, sender string, to int) {
	if !s.faults.downCloses {
		return
	}
	for wi, name := range workers {
		k := linkKey{fromGen: fromGen, from: from, inc: inc, worker: wi, to: to}
		d := time.Duration(s.wr.Int64N(int64(200 * time.Microsecond)))
		s.mail(sender, name, d, downClose{Peer: to}, func() {
			c := s.links.open[k]
			if c == nil || !s.rankLive(fromGen, from, inc) {
				return
			}
			delete(s.links.open, k)
			if len(c.inflight) > 0 {
				s.fired(FaultDownClosesConn)
				s.linger(c, s.wr, FaultDownClosesConnLost)
			}
		})
	}
}

// rankLive reports whether incarnation inc of rank `from` of the side
// fromGen says is still up.
func (s *Sim) rankLive(fromGen bool, from, inc int) bool {
	if fromGen {
		return s.gen[from].live(inc)
	}
	return s.ctx[from].live(inc)
}

// downClose is the trace's name for a worker closing its connection to a
// peer declared down (downCloseConns).
type downClose struct{ Peer int }

// connHop is the latency of one in-process mailbox hop, drawn from the
// connection faults' own stream (Sim.cr).
func (s *Sim) connHop() time.Duration {
	return time.Duration(s.cr.Int64N(int64(200 * time.Microsecond)))
}

// maxLinger bounds how long a closed connection's frames may still take to
// leave (control/zmq's closeLinger is 500 ms; here the bound is kept
// within the requests' deadlines).
const maxLinger = 60 * time.Millisecond

// pLingerLost is the probability, with FaultConnRemade on, that a closed
// connection loses the frames it still held from some point on.
const pLingerLost = 0.3

// closeConns closes every connection of one sender worker (a restart, or
// the worker's stop): the worker's next frame to each peer dials anew.
func (s *Sim) closeConns(fromGen bool, from, inc, worker int) {
	peers := len(s.gen)
	if fromGen {
		peers = len(s.ctx)
	}
	for to := range peers {
		s.closeConn(linkKey{fromGen: fromGen, from: from, inc: inc, worker: worker, to: to})
	}
}

// delivered takes w off its connection's frames in flight and counts a
// frame that arrives after a frame of a newer connection of its key did.
func (s *Sim) delivered(w *wire) {
	if w.gone != nil {
		w.gone()
	}
	c := w.c
	for i, x := range c.inflight {
		if x == w {
			c.inflight = append(c.inflight[:i], c.inflight[i+1:]...)
			break
		}
	}
	if seen, ok := s.links.seen[c.key]; ok && seen > c.id {
		if s.faults.on[FaultConnRemade] {
			s.fired(FaultConnRemade)
		}
		return
	}
	s.links.seen[c.key] = c.id
}

// remakeConn is FaultConnRemade's own trigger: a sender worker (either
// side) with control frames in flight restarts, so that its next frames
// leave on new connections while the old ones' linger. With nothing in
// flight it tries again a little later, a few times.
func (s *Sim) remakeConn(tries int) {
	type cand struct {
		gen          bool
		rank, worker int
	}
	var cands []cand
	for _, c := range s.ctx {
		if !c.alive {
			continue
		}
		for _, w := range c.workers {
			if s.inFlightFrom(false, c.idx, c.inc, w.idx) && !w.dead {
				cands = append(cands, cand{false, c.idx, w.idx})
			}
		}
	}
	for _, g := range s.gen {
		if !g.alive {
			continue
		}
		for i := range g.workers {
			if s.inFlightFrom(true, g.idx, g.inc, i) && !g.wdead[i] {
				cands = append(cands, cand{true, g.idx, i})
			}
		}
	}
	if len(cands) == 0 {
		if tries > 0 {
			s.after(200*time.Microsecond+time.Duration(s.cr.Int64N(int64(2*time.Millisecond))), "chaos", "remakeConn", func() { s.remakeConn(tries - 1) })
		}
		return
	}
	c := cands[s.cr.IntN(len(cands))]
	if c.gen {
		s.gen[c.rank].crashWorker(c.worker)
		return
	}
	w := s.ctx[c.rank].workers[c.worker]
	s.mail("chaos", w.name(), 0, workerCrash{}, func() { w.crash() })
}

// inFlightFrom reports whether a worker has frames in flight on an open
// connection.
func (s *Sim) inFlightFrom(fromGen bool, from, inc, worker int) bool {
	peers := len(s.gen)
	if fromGen {
		peers = len(s.ctx)
	}
	for to := range peers {
		if c := s.links.open[linkKey{fromGen: fromGen, from: from, inc: inc, worker: worker, to: to}]; c != nil && len(c.inflight) > 0 {
			return true
		}
	}
	return false
}

// requestKey names one generation incarnation's RequestData for one epoch
// of a request, to one context rank.
type requestKey struct {
	gen, inc, ctx int
	request       string
	epoch         uint64
}

// admitKey names a RequestData of generation rank incarnation
// (k.gen, k.inc) that context rank k.ctx's incarnation ctxInc admitted.
type admitKey struct {
	k      requestKey
	ctxInc int
}

// trackRequestData counts a RequestData put on the wire until it is
// delivered or lost, so that a Cancel delivered meanwhile is known to
// have overtaken it (Result.CancelsOvertook).
func (s *Sim) trackRequestData(w *wire, k requestKey) {
	s.links.requests[k]++
	w.gone = func() {
		if s.links.requests[k]--; s.links.requests[k] == 0 {
			delete(s.links.requests, k)
		}
	}
}

// noteCancel counts a Cancel delivered to a context rank while a
// RequestData of the same request and epoch, sent before it by the same
// generation incarnation, is still on its way: the race of a Cancel that
// overtakes its RequestData (another connection of another worker, or of
// the same worker after a restart).
func (s *Sim) noteCancel(k requestKey) {
	if s.links.requests[k] > 0 {
		s.res.CancelsOvertook++
	}
}
