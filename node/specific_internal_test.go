package node

import (
	"testing"

	"github.com/kvxfer/kvxfer/control/zmq"
)

// TestMoreSpecific: a failed handshake's reason seen after WaitPeers'
// wait replaces the first one seen, unless the first names the mistake
// and the later one does not (a hang-up after the link's hold of the
// named reason ran out); a state that moved on from the failure does not
// replace it. Whether a reason names the mistake is its zmq.Cause, not
// its words: the reasons here are worded unlike control/zmq's (the
// hang-up's starts as the link's mismatch did). (Checked to fail with
// node's former prefix checks on the reason.)
func TestMoreSpecific(t *testing.T) {
	failed := func(c zmq.Cause, reason string) zmq.PeerState {
		return zmq.PeerState{Conn: zmq.ConnHandshakeFailed, Cause: c, Reason: reason}
	}
	hung := failed(zmq.CauseHungUp, "security mechanism mismatch, a wrong server key or no kvxfer engine: what listens there hung up (broken pipe)")
	named := failed(zmq.CauseMechanismMismatch, "we are insecure and the peer uses CURVE")
	refused := failed(zmq.CauseKeyRefused, "our key is not among the peer's (ZAP status 400)")
	for _, c := range []struct {
		name               string
		first, later, want zmq.PeerState
	}{
		{"hang-up then mismatch", hung, named, named},
		{"mismatch then hang-up", named, hung, named},
		{"hang-up then hang-up", hung, hung, hung},
		{"mismatch then refused", named, refused, refused},
		{"hang-up then up", hung, zmq.PeerState{Conn: zmq.ConnUp}, hung},
		{"mismatch then connecting", named, zmq.PeerState{Conn: zmq.ConnConnecting}, named},
	} {
		if got := moreSpecific(c.first, c.later); got != c.want {
			t.Errorf("%s: moreSpecific = %v, want %v", c.name, got, c.want)
		}
	}
}
