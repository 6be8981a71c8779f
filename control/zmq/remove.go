package zmq

import (
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// maxDeparted bounds the CURVE key bindings a link keeps for peers it
// forgot (RemovePeer) or whose key changed (SetPeerServerKey): the oldest
// goes first. A departed incarnation's last frames (Result, CancelAck:
// proofs a generation side waits for) come within its requests' deadlines,
// long before thousands of later departures.
const maxDeparted = 4096

// departedKey is a CURVE key that may still speak for a peer the
// directory no longer binds it to.
type departedKey struct {
	key  string
	peer messages.PeerID
}

// RemovePeer forgets a peer that left (an etcd Down): its directory entry
// goes, the heartbeat goroutine closes its socket and monitor at its next
// beat and stops dialling it, and the peer's name is no longer bound to
// its CURVE key, so that a new incarnation under the name with another
// key is accepted at once. The departed key keeps its admission at the
// handshake and may still speak for the peer (its connections' last
// frames, a Result or CancelAck, are delivered), up to the latest
// maxDeparted departures. A later AddPeer of the name starts a new peer.
// Conns dialled to the peer stay usable until their owner closes them.
// Removing an unknown peer, or the link's own id, does nothing.
func (l *Link) RemovePeer(peer messages.PeerID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.self != nil && peer == l.self.From {
		return
	}
	info := l.peers[peer]
	if info == nil {
		return
	}
	delete(l.peers, peer)
	if info.serverKey != "" {
		l.departLocked(info.serverKey, peer)
	}
	if info.key != "" && info.key != info.serverKey {
		l.departLocked(info.key, peer)
	}
	l.rebuildIdentitiesLocked()
}

// forgetDownPeerLocked makes room in a full directory: it removes, as
// RemovePeer does, the peer that a Hello alone put there (no endpoint or
// server key of the caller's: nothing dials it) and that is down (missed
// its heartbeats), the one heard from longest ago. A peer serving through
// the link's lifetime under ever new names (restarted decode pods without
// etcd) would otherwise fill the directory for good, and every new peer's
// Hello would be refused. It returns the peer it removed, if any. Callers
// hold l.mu.
func (l *Link) forgetDownPeerLocked(isDown func(messages.PeerID) bool) (messages.PeerID, bool) {
	var (
		oldest messages.PeerID
		at     time.Time
		found  bool
	)
	for p, info := range l.peers {
		if info.endpoint != "" || info.serverKey != "" || !(info.down || isDown(p)) {
			continue
		}
		if !found || info.helloAt.Before(at) {
			oldest, at, found = p, info.helloAt, true
		}
	}
	if !found {
		return messages.PeerID{}, false
	}
	info := l.peers[oldest]
	delete(l.peers, oldest)
	if info.key != "" {
		l.departLocked(info.key, oldest)
	}
	l.rebuildIdentitiesLocked()
	l.log.Info().Stringer("peer", oldest).Msgf("control/zmq: directory full (%d peers): forgot %s, down and known only from its Hello", maxPeers, oldest)
	return oldest, true
}

// departLocked keeps key's permission to speak for peer after the
// directory dropped it, evicting the oldest past maxDeparted. Callers
// hold l.mu and rebuild the identities.
func (l *Link) departLocked(key string, peer messages.PeerID) {
	d := departedKey{key: key, peer: peer}
	for i, e := range l.departed {
		if e == d {
			l.departed = append(l.departed[:i], l.departed[i+1:]...)
			break
		}
	}
	if len(l.departed) >= maxDeparted {
		l.departed = l.departed[1:]
	}
	l.departed = append(l.departed, d)
}

// Beating is the number of peers the heartbeat goroutine holds a socket
// (and a monitor) for, as of its latest beat: the directory's peers with
// an endpoint, less those whose socket could not be made.
func (l *Link) Beating() int { return int(l.beating.Load()) }
