package sim

import (
	"errors"
	"strings"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// checkResultRefused checks a session's step of the report that stream
// m.Peer's SUCCESS Result was refused for the frame itself
// (FaultResultRefused): that Result never left, so the request is not
// DONE, and when the refusal decided it, FAILED with an error that names
// the refusal; and the same step answers that
// stream's peer again with its outcome — a Result other than SUCCESS,
// without payload, or a CancelAck — which the generation side takes as
// its proof (ReleaseDest's checks). A session that stopped before the
// report came answers too (the report reached it before its poison).
func (s *Sim) checkResultRefused(ts *txSess, m actors.TxSent, before, after actors.TxState, effs []actors.Effect) {
	to, ok := ts.refusedTo[m.Peer]
	if !ok || m.Err == nil {
		return
	}
	delete(ts.refusedTo, m.Peer)
	s.fired(FaultResultRefused)
	if after == actors.TxDone {
		s.failf("%s: stream %d's SUCCESS Result refused for good (%v), yet the request is DONE", ts.name, m.Peer, m.Err)
		return
	}
	if err := ts.s.Err(); !before.Terminal() && (!errors.Is(err, actors.ErrFrameUnsent) || !strings.Contains(err.Error(), m.Err.Error())) {
		s.failf("%s: stream %d's SUCCESS Result refused for good (%v): the request failed with %v, want it named", ts.name, m.Peer, m.Err, err)
		return
	}
	for _, e := range effs {
		se, ok := e.(actors.SendFrame)
		if !ok || se.To != to {
			continue
		}
		switch f := se.Frame.(type) {
		case *messages.CancelAck:
			return
		case *messages.Result:
			if f.Status == messages.StatusSuccess || len(f.Payload) != 0 {
				s.failf("%s: stream %d's SUCCESS Result refused for good: answered again with %v and %d payload bytes, want an outcome without payload",
					ts.name, m.Peer, f.Status, len(f.Payload))
			}
			return
		}
	}
	s.failf("%s: stream %d's SUCCESS Result refused for good (%v): no answer to %v follows, so it waits for its deadline (effects %v)", ts.name, m.Peer, m.Err, to, effs)
}
