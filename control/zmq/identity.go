package zmq

import (
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/messages"
)

// Identity binds a CURVE client public key to what it may speak for: the
// frames of a connection authenticated with PublicKey must name a sender
// (messages.PeerID) of Instance and, when Ranks is not empty, one of Ranks.
// An Identity also admits its key at the handshake, as AllowedPeers does.
type Identity struct {
	// PublicKey is the client key (Z85, 40 characters).
	PublicKey string
	// Instance is the engine instance the key speaks for.
	Instance string
	// Ranks are the ranks it may speak as; empty: every rank of Instance.
	Ranks []int32
}

func (id Identity) check(what string) error {
	if err := checkKey(what, id.PublicKey); err != nil {
		return err
	}
	if id.Instance == "" || len(id.Instance) > messages.MaxInstanceLen {
		return fmt.Errorf("%w: %s: instance length %d, want 1..%d", ErrConfig, what, len(id.Instance), messages.MaxInstanceLen)
	}
	for _, r := range id.Ranks {
		if r < 0 || r >= messages.MaxRank {
			return fmt.Errorf("%w: %s: rank %d, want 0..%d", ErrConfig, what, r, messages.MaxRank-1)
		}
	}
	return nil
}

// permits reports whether id lets its key speak as p.
func (id Identity) permits(p messages.PeerID) bool {
	return p.Instance == id.Instance && (len(id.Ranks) == 0 || slices.Contains(id.Ranks, p.Rank))
}

// identities is what each CURVE key may speak for: the union of the
// explicit Identities, the departed keys' peers (RemovePeer) and, for a
// key that is some directory peer's server key, that peer's PeerID (one keypair per link serves both as its
// ROUTER's server key and its DEALERs' client key). It is immutable: the
// link builds a new one when either source changes, and the listener reads
// the current one with each frame without a lock.
type identities struct {
	explicit map[string][]Identity
	peers    map[string][]messages.PeerID
}

// permits reports whether a connection authenticated with key may send
// frames as p.
func (t *identities) permits(key string, p messages.PeerID) bool {
	if t == nil {
		return false
	}
	for _, id := range t.explicit[key] {
		if id.permits(p) {
			return true
		}
	}
	return slices.Contains(t.peers[key], p)
}

// bound reports whether key may speak for anyone.
func (t *identities) bound(key string) bool {
	return t != nil && (len(t.explicit[key]) > 0 || len(t.peers[key]) > 0)
}

// rebuildIdentitiesLocked publishes a new identities from l.explicit and
// the directory's server keys. Callers hold l.mu.
func (l *Link) rebuildIdentitiesLocked() {
	t := &identities{explicit: l.explicit, peers: map[string][]messages.PeerID{}}
	for id, p := range l.peers {
		if p.serverKey != "" {
			t.peers[p.serverKey] = append(t.peers[p.serverKey], id)
		}
	}
	for _, d := range l.departed {
		if !slices.Contains(t.peers[d.key], d.peer) {
			t.peers[d.key] = append(t.peers[d.key], d.peer)
		}
	}
	l.idents.Store(t)
}

// AddIdentity binds a CURVE client key to the instance (and ranks) it may
// speak for and admits it at the handshake from now on (see AllowKey for
// a peer refused earlier). Bindings add up: a key may speak for the union
// of its identities.
func (l *Link) AddIdentity(id Identity) error {
	if err := id.check("identity"); err != nil {
		return err
	}
	id.Ranks = slices.Clone(id.Ranks)
	l.mu.Lock()
	defer l.mu.Unlock()
	explicit := make(map[string][]Identity, len(l.explicit)+1)
	for k, v := range l.explicit {
		explicit[k] = v
	}
	explicit[id.PublicKey] = append(slices.Clip(explicit[id.PublicKey]), id)
	l.explicit = explicit
	l.allowed[id.PublicKey] = true
	l.rebuildIdentitiesLocked()
	return nil
}

// keyPermits reports whether a connection authenticated with key may
// speak as p.
func (l *Link) keyPermits(key string, p messages.PeerID) bool { return l.idents.Load().permits(key, p) }
