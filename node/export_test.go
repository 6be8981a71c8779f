package node

import (
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
)

// SetPeerUpHook sets peerUpHook (nil: none).
func SetPeerUpHook(f func(self string, rec discovery.Record)) {
	if f == nil {
		peerUpHook.Store(nil)
		return
	}
	peerUpHook.Store(&f)
}

// PeerState is the node's link's PeerState of peer.
func (n *Node) PeerState(peer messages.PeerID) (zmq.PeerState, error) { return n.link.PeerState(peer) }
