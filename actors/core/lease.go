package core

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// PeerLeases are a writer's leases on its peers (issue 17: writer
// self-fencing). A writer posts writes for a peer only while it holds an
// unexpired lease on it; each sign of the peer's life (its heartbeat, any
// frame it sent) renews the lease for TTL from then; when a lease lapses
// the writer stops posting to that peer and fails its requests to it
// (TxPeerGone: the streams fail, ops in flight go IN_DOUBT, the endpoint
// is closed).
//
// This is liveness, not proof: a writer paused between its lease check
// and its post, or in the middle of a copy, resumes and writes after its
// lease expired. The receiver still waits for a proof of DESIGN.md §3
// before it reuses a page (its quarantine).
type PeerLeases struct {
	ttl    time.Duration
	until  map[messages.PeerID]time.Time
	lapsed map[messages.PeerID]bool // reported by Expired, not renewed since
}

// NewPeerLeases returns leases of length ttl (0: leases are off: every
// peer is always held).
func NewPeerLeases(ttl time.Duration) *PeerLeases {
	return &PeerLeases{ttl: ttl, until: map[messages.PeerID]time.Time{}, lapsed: map[messages.PeerID]bool{}}
}

// TTL is the lease length (0: off).
func (l *PeerLeases) TTL() time.Duration { return l.ttl }

// Renew extends peer's lease to now+TTL (never shortens it).
func (l *PeerLeases) Renew(peer messages.PeerID, now time.Time) {
	if l.ttl <= 0 {
		return
	}
	if u := now.Add(l.ttl); u.After(l.until[peer]) {
		l.until[peer] = u
	}
	delete(l.lapsed, peer)
}

// Held reports whether the writer may post to peer at now: its lease has
// not expired (a peer never heard holds none).
func (l *PeerLeases) Held(peer messages.PeerID, now time.Time) bool {
	if l.ttl <= 0 {
		return true
	}
	u, ok := l.until[peer]
	return ok && now.Before(u)
}

// Expired returns, sorted, the peers whose lease lapsed at or before now
// and were not reported since they were last renewed: each lapse is
// reported once.
func (l *PeerLeases) Expired(now time.Time) []messages.PeerID {
	var out []messages.PeerID
	for p, u := range l.until {
		if !now.Before(u) && !l.lapsed[p] {
			l.lapsed[p] = true
			out = append(out, p)
		}
	}
	slices.SortFunc(out, comparePeers)
	return out
}

// comparePeers orders peers by instance, then rank.
func comparePeers(a, b messages.PeerID) int {
	if c := strings.Compare(a.Instance, b.Instance); c != 0 {
		return c
	}
	return cmp.Compare(a.Rank, b.Rank)
}

// Next is when the earliest unexpired lease lapses (zero: none held).
func (l *PeerLeases) Next(now time.Time) time.Time {
	var next time.Time
	for _, u := range l.until {
		if now.Before(u) && (next.IsZero() || u.Before(next)) {
			next = u
		}
	}
	return next
}
