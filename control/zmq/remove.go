package zmq

import (
	"slices"
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
// Conns dialled to the peer stay usable until their owner closes them;
// once the name has an entry again (AddPeer, or a Hello of its next
// incarnation) they follow it, and say Hello to that incarnation as after
// a restart (Conn.followLocked).
// Removing an unknown peer, or the link's own id, does nothing.
//
// The incarnation whose Hello the entry held is remembered as departed
// (departIncarnationLocked): the process may live on (draining in its
// Close, or out of etcd without knowing it) and repeat its Hello, which
// then puts nothing back (RejectDeparted): no entry, no Hello for
// Link.Hello, no binding of the name to its key. Its connections are
// still bound, so that their last frames are delivered, but nothing on
// them is a sign of life of the name (departedInc): its heartbeats and
// frames neither keep the name alive nor bring a newer incarnation's
// entry back from down, tell Config.OnPeerAlive nothing, and are not
// taken for a twin. A Hello of another incarnation is accepted as
// before. An AddPeer or SetPeerServerKey of the name lifts the mark
// (readdLocked: the link is not told which incarnation an add is for),
// but not while the name's server key is another key than the one the
// incarnation spoke with, and no longer once a newer incarnation's Hello
// is accepted (departedLocked, helloAcceptedLocked). Incarnation 0 (not
// told) is not remembered.
func (l *Link) RemovePeer(peer messages.PeerID) { l.RemovePeerIncarnation(peer, 0) }

// RemovePeerIncarnation is RemovePeer for incarnation inc of peer, the one
// that left (an etcd Down names it; 0: whichever the link holds). When the
// link holds a Hello of a newer incarnation — a restart whose Hello came
// before the old incarnation's removal (a same-key restart dialled at a
// static endpoint, or an old lease that ran out after the new process
// spoke) — that incarnation stays: only inc is remembered as departed, so
// that its Hellos and beats are refused, and nothing else changes.
// Otherwise the peer is removed as RemovePeer removes it, and inc is
// remembered as departed too when the link holds no Hello of it (an
// older incarnation's, or none), so that its Hello, should it come
// later, takes nothing back.
func (l *Link) RemovePeerIncarnation(peer messages.PeerID, inc uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.self != nil && peer == l.self.From {
		return
	}
	info := l.peers[peer]
	if info == nil {
		return
	}
	if h := info.hello; inc != 0 && h != nil && h.Incarnation > inc {
		l.departIncarnationLocked(peer, inc, "")
		l.rebuildGoneLocked()
		return
	}
	delete(l.peers, peer)
	info.removed.Store(true)
	if h := info.hello; h != nil && h.Incarnation != 0 {
		key := info.key
		if key == "" {
			key = info.serverKey
		}
		l.departIncarnationLocked(peer, h.Incarnation, key)
	}
	if h := info.hello; inc != 0 && (h == nil || h.Incarnation != inc) {
		// The incarnation that left has not said Hello here yet (its Up
		// was heard; its Hello is on its way, or it lives on out of etcd
		// without knowing it): its Hello, when it comes, must not take
		// the name back either. It spoke with the key its record named.
		l.departIncarnationLocked(peer, inc, info.serverKey)
	}
	if info.serverKey != "" {
		l.departLocked(info.serverKey, peer)
	}
	if info.key != "" && info.key != info.serverKey {
		l.departLocked(info.key, peer)
	}
	l.rebuildIdentitiesLocked()
	l.rebuildGoneLocked() // the marks, and the entry departedLocked reads
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
	info.removed.Store(true)
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

// maxGoneIncarnations bounds the departed incarnations remembered per
// peer name (a name removed again and again while its old processes live
// on): the oldest goes first.
const maxGoneIncarnations = 4

// goneIncarnation is a peer incarnation RemovePeer forgot.
type goneIncarnation struct {
	inc uint64
	key string // the CURVE key it spoke with ("" insecure, or not known)
	seq uint64 // order of removal, for eviction
	// readded: AddPeer or SetPeerServerKey added the name again since,
	// and this incarnation's Hellos are accepted (but see
	// departedLocked), until a newer incarnation's Hello is
	// (readdLocked, helloAcceptedLocked).
	readded bool
}

// departIncarnationLocked remembers incarnation inc of peer, which spoke
// with key, as departed: its Hellos put nothing back in the directory.
// At most maxPeers are remembered in all, maxGoneIncarnations per name;
// the oldest removal goes first. Callers hold l.mu.
func (l *Link) departIncarnationLocked(peer messages.PeerID, inc uint64, key string) {
	for i, g := range l.gone[peer] {
		if g.inc == inc {
			l.dropGoneLocked(peer, i)
			break
		}
	}
	if len(l.gone[peer]) >= maxGoneIncarnations {
		l.dropGoneLocked(peer, 0)
	}
	for l.goneN > 0 && l.goneN >= maxPeers {
		l.evictGoneLocked()
	}
	if l.gone == nil {
		l.gone = map[messages.PeerID][]goneIncarnation{}
	}
	l.goneSeq++
	l.gone[peer] = append(l.gone[peer], goneIncarnation{inc: inc, key: key, seq: l.goneSeq})
	l.goneN++
}

// evictGoneLocked forgets the departed incarnation removed longest ago.
// Callers hold l.mu.
func (l *Link) evictGoneLocked() {
	var (
		oldest messages.PeerID
		seq    uint64
		found  bool
	)
	for p, marks := range l.gone {
		if len(marks) > 0 && (!found || marks[0].seq < seq) {
			oldest, seq, found = p, marks[0].seq, true
		}
	}
	if !found {
		return
	}
	l.dropGoneLocked(oldest, 0)
}

// dropGoneLocked forgets the i-th departed incarnation of peer. Callers
// hold l.mu.
func (l *Link) dropGoneLocked(peer messages.PeerID, i int) {
	marks := slices.Delete(l.gone[peer], i, i+1)
	l.goneN--
	if len(marks) == 0 {
		delete(l.gone, peer)
		return
	}
	l.gone[peer] = marks
}

// departedLocked reports whether a Hello of incarnation inc of peer is one
// of a departed incarnation (RemovePeer) that no re-add since lets back,
// and with which key it spoke. A re-add lets it back (readdLocked) unless
// the name's server key is now another key than the one it spoke with:
// the add was for another process, and the departed one must not take
// the name (the name bound to its old key, the new key's Hello would be
// refused as taken). Callers hold l.mu.
func (l *Link) departedLocked(peer messages.PeerID, inc uint64) (key string, ok bool) {
	if inc == 0 {
		return "", false
	}
	for _, g := range l.gone[peer] {
		if g.inc != inc {
			continue
		}
		if !g.readded {
			return g.key, true
		}
		if info := l.peers[peer]; info != nil && info.serverKey != "" && g.key != "" && g.key != info.serverKey {
			return g.key, true
		}
		return "", false
	}
	return "", false
}

// readdLocked is an explicit add of peer (AddPeer, SetPeerServerKey): the
// departed incarnations of the name may be what is added again (the link
// is not told which incarnation an add is for), so their Hellos are
// accepted again — but see departedLocked for one that spoke with another
// key than the name's server key — until a newer incarnation's Hello is
// (helloAcceptedLocked). Callers hold l.mu.
func (l *Link) readdLocked(peer messages.PeerID) {
	if len(l.gone[peer]) == 0 {
		return
	}
	for i := range l.gone[peer] {
		l.gone[peer][i].readded = true
	}
	l.rebuildGoneLocked()
}

// helloAcceptedLocked notes that the directory took incarnation inc's
// Hello for peer: a departed incarnation older than inc that a re-add
// let back is departed again (the re-add was for inc, or inc superseded
// it), so that it does not take the name back from inc. Callers hold
// l.mu.
func (l *Link) helloAcceptedLocked(peer messages.PeerID, inc uint64) {
	changed := false
	for i := range l.gone[peer] {
		if g := &l.gone[peer][i]; g.readded && inc > g.inc {
			g.readded, changed = false, true
		}
	}
	if changed {
		l.rebuildGoneLocked()
	}
}

// goneInc names one incarnation of a peer.
type goneInc struct {
	peer messages.PeerID
	inc  uint64
}

// goneSet is the set of departed incarnations as departedLocked says, for
// the listener (Link.goneNow). It is never changed once stored.
type goneSet map[goneInc]struct{}

// rebuildGoneLocked stores in goneNow the incarnations departedLocked
// takes for departed. Every change of what departedLocked reads calls it:
// the marks (RemovePeer, readdLocked, helloAcceptedLocked) and the
// directory entry of a marked name (RemovePeer deletes it,
// SetPeerServerKey sets its server key and then calls readdLocked;
// forgetDownPeerLocked deletes only entries without a server key, and
// peerLocked makes them without one, which departedLocked reads as no
// entry). Callers hold l.mu.
func (l *Link) rebuildGoneLocked() {
	var set goneSet
	for p, marks := range l.gone {
		for _, g := range marks {
			if _, ok := l.departedLocked(p, g.inc); !ok {
				continue
			}
			if set == nil {
				set = make(goneSet, l.goneN)
			}
			set[goneInc{p, g.inc}] = struct{}{}
		}
	}
	if set == nil {
		l.goneNow.Store(nil)
		return
	}
	l.goneNow.Store(&set)
}

// departedInc reports whether incarnation inc of peer is one RemovePeer
// forgot that no re-add let back (departedLocked), without the lock: the
// listener asks it for every frame on a connection bound to inc's Hello,
// whose frames are then delivered but no sign of life of the name. A
// heartbeat names only its sender's PeerID (From) and its own sequence
// number, which says nothing of the process; the connection it comes on
// is bound to the Hello that process said first on it, and a connection
// (a ROUTER routing id: a random id per socket) is one process's. A
// connection whose Hello named no incarnation (0) cannot be told apart
// and counts as before.
func (l *Link) departedInc(peer messages.PeerID, inc uint64) bool {
	if inc == 0 {
		return false
	}
	set := l.goneNow.Load()
	if set == nil {
		return false
	}
	_, ok := (*set)[goneInc{peer, inc}]
	return ok
}
