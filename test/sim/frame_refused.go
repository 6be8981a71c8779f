package sim

import (
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// checkFrameRefused checks a live session's step of a report that writer
// m.Writer's RequestData was refused for the frame itself
// (FaultFrameRefused): the request fails at once, with an error that is
// ErrFrameUnsent and names the refusal; that writer never got the frame,
// so it owes nothing (no proof is waited for: it is not among the
// unproven writers, and a QuarantineDest does not name it); and it is
// sent one Cancel whose reason names the refusal, so that its side of the
// request ends now, naming it. The other writers' blocks wait for their
// proofs as always (ReleaseDest's checks).
func (s *Sim) checkFrameRefused(rs *rxSess, m actors.RxSent, before, after actors.RxState, effs []actors.Effect) {
	w := m.Writer
	if m.Err == nil || !core.RefusedForGood(m.Err) || before.Terminal() || w < 0 || w >= len(rs.peers) {
		return
	}
	s.fired(FaultFrameRefused)
	for o, left := range rs.left {
		if o != w && left && !rs.proof[o] {
			s.fired(FaultFrameRefusedOthersLeft)
			break
		}
	}
	err := rs.s.Err()
	switch {
	case after != actors.RxFailed:
		s.failf("%s: writer %d's RequestData refused for good (%v), yet the request is %v, want FAILED at once", rs.name, w, m.Err, after)
		return
	case !errors.Is(err, actors.ErrFrameUnsent) || !errors.Is(err, control.ErrFrameRefused) || !strings.Contains(err.Error(), m.Err.Error()):
		s.failf("%s: writer %d's RequestData refused for good (%v): the request failed with %v, want ErrFrameUnsent naming the refusal", rs.name, w, m.Err, err)
		return
	case slices.Contains(rs.s.Unproven(), w):
		s.failf("%s: writer %d's RequestData refused for good (it never got it), yet the session waits for its proof", rs.name, w)
		return
	}
	cancels := 0
	for _, e := range effs {
		switch e := e.(type) {
		case actors.QuarantineDest:
			if slices.Contains(e.Writers, w) {
				s.failf("%s: QuarantineDest names writer %d, whose RequestData was refused for good (it never got it)", rs.name, w)
				return
			}
		case actors.SendFrame:
			c, ok := e.Frame.(*messages.Cancel)
			if !ok || e.To != rs.peers[w] {
				continue
			}
			cancels++
			if !strings.Contains(c.Reason, control.ErrFrameRefused.Error()) {
				s.failf("%s: the Cancel to writer %d, whose RequestData was refused for good, says %q, not the refusal", rs.name, w, c.Reason)
				return
			}
		}
	}
	if cancels != 1 {
		s.failf("%s: %d Cancels to writer %d, whose RequestData was refused for good, want 1 naming the refusal", rs.name, cancels, w)
	}
}

// checkRefusalCancel checks a context session's step of a Cancel whose
// reason is a refusal of its RequestData for good (FaultFrameRefused):
// the writer never got that RequestData, so the session, still live,
// fails now (its Send fails), and its error names that reason.
func (s *Sim) checkRefusalCancel(ts *txSess, m actors.TxPeerCancel, before, after actors.TxState) {
	if before.Terminal() || !strings.Contains(m.Reason, control.ErrFrameRefused.Error()) {
		return
	}
	if !after.Terminal() {
		s.failf("%s: a Cancel from %v of a RequestData refused for good (%q) left the session %v", ts.name, m.From, m.Reason, after)
		return
	}
	if ts.decide == nil || ts.decide.Err == nil || !errors.Is(ts.decide.Err, actors.ErrPeerCancelled) || !names(ts.decide.Err, m.Reason) {
		var err error
		if ts.decide != nil {
			err = ts.decide.Err
		}
		s.failf("%s: a Cancel from %v of a RequestData refused for good (%q) decided the session with %v, want ErrPeerCancelled naming the reason",
			ts.name, m.From, m.Reason, err)
	}
}

// names reports whether err's text names reason, as is or quoted.
func names(err error, reason string) bool {
	return strings.Contains(err.Error(), reason) || strings.Contains(err.Error(), strconv.Quote(reason))
}
