package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// A generation rank's sender worker hands a RequestData to the control
// link, which puts it on the wire at once (control/zmq), and only then
// tells the session it left (RxSent). Under FaultSentLate the worker is
// held up between the two (descheduled on a loaded machine, a GC pause):
// its report is posted only once an answer of the writer to that
// RequestData reached the session (a Misaddressed, a Result, a CancelAck:
// the session stepped it first), or after a bound drawn per report if none
// comes. Meanwhile the worker steps nothing else: what its mailbox gets
// waits (onWorker), so that no frame it sends later, and no answer to one,
// overtakes the report, as on a real worker's goroutine.

// sentLate is one held report.
type sentLate struct {
	wi  int
	rs  *rxSess
	msg actors.RxSent
}

// earlyAnswer is a kind of answer a session took before its RequestData's
// report (Result.EarlyAnswers).
type earlyAnswer uint8

const (
	earlyMisaddressed earlyAnswer = iota
	earlyResult
	earlyCancelAck
	earlyOther // an invalid frame, or one of another kind
	numEarly
)

var earlyNames = [numEarly]string{"Misaddressed", "Result", "CancelAck", "other frame"}

func (k earlyAnswer) String() string { return earlyNames[k] }

// maxSentLate bounds how long a worker holds a report no answer releases.
const maxSentLate = 40 * time.Millisecond

// sentReportLate tells whether worker wi's report msg to rs is held
// (FaultSentLate, drawn from Sim.lr); if so, it is posted when an answer
// of the writer reaches rs, or after a bound.
//
// A RequestData addressed to an incarnation its context rank no longer
// is (one that will be answered with a Misaddressed, the order CI once
// caught the engine out on) is held whenever plan.sentLateMis, so that
// the rarer answer is reached often enough.
func (g *genRank) sentReportLate(wi int, rs *rxSess, e actors.SendRequestData, msg actors.RxSent) bool {
	s := g.s
	if msg.Err != nil {
		return false
	}
	mis := s.faults.sentLateMis && misaddressedTo(s, e)
	if !mis && (!s.faults.on[FaultSentLate] || s.lr.Float64() >= s.faults.pSentLate) {
		return false
	}
	h := &sentLate{wi: wi, rs: rs, msg: msg}
	g.late[wi] = h
	const lo = 200 * time.Microsecond
	d := time.Duration(float64(lo) * math.Pow(float64(maxSentLate)/float64(lo), s.lr.Float64()))
	if c := s.ctx[e.To.Rank]; mis && !c.alive {
		// Its answer comes from the rank's next incarnation, once up.
		d += max(c.backAt-s.vt, 0)
	}
	s.note(g.workers[wi], sentHeld{Writer: msg.Writer, Session: rs.name, Until: s.vt + d})
	inc := g.inc
	s.after(d, g.workers[wi], "sentLateBound", func() {
		if g.live(inc) {
			g.postSent(h)
		}
	})
	return true
}

// misaddressedTo reports whether e's RequestData is addressed to an
// incarnation of its context rank that is not the one up (or the one
// that boots next, for a rank that is down and returns).
func misaddressedTo(s *Sim, e actors.SendRequestData) bool {
	if e.Frame == nil || e.Frame.ToIncarnation == 0 || e.To.Instance != "ctx" || e.To.Rank < 0 || int(e.To.Rank) >= len(s.ctx) {
		return false
	}
	c := s.ctx[e.To.Rank]
	switch {
	case c.alive:
		return c.incarnation() != e.Frame.ToIncarnation
	case c.backAt > 0:
		return uint64(c.inc+2) != e.Frame.ToIncarnation
	}
	return false
}

// sentHeld is the trace's record of a worker that holds its report that
// writer Writer's RequestData left, at most until Until.
type sentHeld struct {
	Writer  int
	Session string
	Until   time.Duration
}

// answered is called after rs stepped msg: if it is a frame of a writer
// whose RequestData's report is held, the report is posted now, after the
// answer; if rs stopped, every report held for it is (nothing waits on
// it).
func (g *genRank) answered(rs *rxSess, msg any) {
	m, ok := msg.(actors.RxFrame)
	for _, h := range g.late {
		if h == nil || h.rs != rs {
			continue
		}
		if !ok || h.msg.Writer != m.Writer {
			if rs.stop {
				g.postSent(h)
			}
			continue
		}
		k := earlyOther
		if m.Invalid == nil {
			switch m.Frame.(type) {
			case *messages.Misaddressed:
				k = earlyMisaddressed
			case *messages.Result:
				k = earlyResult
			case *messages.CancelAck:
				k = earlyCancelAck
			}
		}
		g.s.res.EarlyAnswers[k]++
		g.s.fired(FaultSentLate)
		g.postSent(h)
	}
}

// postSent posts a held report (once) and lets the worker go on with
// what its mailbox got meanwhile.
func (g *genRank) postSent(h *sentLate) {
	if g.late[h.wi] != h {
		return
	}
	s, wi, rs, msg := g.s, h.wi, h.rs, h.msg
	g.late[wi] = nil
	s.mail(g.workers[wi], rs.name, s.hop(), msg, func() { s.stepRx(rs, msg) })
	inc := g.inc
	s.after(0, g.workers[wi], "resume", func() {
		if g.live(inc) {
			g.resume(wi)
		}
	})
}

// resume runs what worker wi's mailbox got while it was held up, in
// order, until a report holds it up again.
func (g *genRank) resume(wi int) {
	for g.late[wi] == nil && len(g.waiting[wi]) > 0 {
		fn := g.waiting[wi][0]
		g.waiting[wi] = g.waiting[wi][1:]
		fn()
	}
}

// held reports whether what worker wi's mailbox gets now waits.
func (g *genRank) held(wi int) bool { return g.late[wi] != nil || len(g.waiting[wi]) > 0 }

// onWorker runs fn, what worker wi does with a message of its mailbox,
// now, or once the report it holds is posted and what came before fn is
// done.
func (g *genRank) onWorker(wi int, fn func()) {
	if g.held(wi) {
		g.waiting[wi] = append(g.waiting[wi], fn)
		return
	}
	fn()
}

func (h sentHeld) String() string {
	return fmt.Sprintf("report that writer %d's RequestData left held for %s, until %v at most", h.Writer, h.Session, h.Until)
}
