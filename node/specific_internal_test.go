package node

import (
	"testing"

	"github.com/kvxfer/kvxfer/control/zmq"
)

// TestMoreSpecific: a failed handshake's reason seen after WaitPeers'
// wait replaces the first one seen, unless the first names the mistake
// and the later one does not (a hang-up after the link's hold of the
// named reason ran out); a state that moved on from the failure does not
// replace it.
func TestMoreSpecific(t *testing.T) {
	failed := func(reason string) zmq.PeerState {
		return zmq.PeerState{Conn: zmq.ConnHandshakeFailed, Reason: reason}
	}
	hung := failed("what listens there hung up during the handshake (broken pipe): a peer that uses CURVE does so on a security mechanism mismatch (we are insecure); or it is not a kvxfer engine at all")
	named := failed("security mechanism mismatch: we are insecure, the peer uses CURVE")
	refused := failed("the peer refused our key (ZAP status 400): this engine's public key is not among its peer keys")
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
