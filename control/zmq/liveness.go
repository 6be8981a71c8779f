package zmq

import (
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// liveness tracks when each peer was last heard from and which are down.
// It is pure (time comes in as an argument) and owned by the listener
// goroutine.
//
// A peer is tracked from its first Hello. States: alive —(silence ≥
// timeout, or its goodbye)→ down —(heard from)→ alive. expire reports each
// alive→down transition by silence once; leave makes the transition for a
// goodbye. An incarnation that said goodbye stays gone (leftAs): its
// frames are no sign of life, and a late Hello of it (the listener asks
// leftAs first) does not bring the peer back; a new incarnation's does.
type liveness struct {
	timeout time.Duration // 0: never expire
	peers   map[messages.PeerID]*lifeState
	// left are the goodbyes (lifeState.byes) of the peers forget stopped
	// tracking, so that leftAs still knows them, and a Hello that tracks
	// the name again takes them back. At most maxPeers names: past it,
	// any one goes. Made on first use.
	left map[messages.PeerID][4]uint64
}

type lifeState struct {
	last time.Time
	down bool
	// byes are the last incarnations of the peer that said goodbye
	// (leave), newest first; 0: none. Incarnations are new at each start
	// of a rank, so one that said goodbye never speaks again but for its
	// late frames.
	byes [4]uint64
}

func newLiveness(timeout time.Duration) *liveness {
	return &liveness{timeout: timeout, peers: map[messages.PeerID]*lifeState{}}
}

// hello starts tracking p (or refreshes it) at now; it reports whether p
// was down (it came back). The listener does not call it for a Hello of
// an incarnation that said goodbye (leftAs).
func (l *liveness) hello(p messages.PeerID, now time.Time) (back bool) {
	s := l.peers[p]
	if s == nil {
		l.peers[p] = &lifeState{last: now, byes: l.left[p]}
		delete(l.left, p)
		return false
	}
	return l.refresh(s, now)
}

// leave notes that incarnation inc (not 0) of p said goodbye and marks p
// down; it reports whether p was tracked and alive (untracked peers are
// ignored, and a peer already down stays so, untold, though inc is
// noted). From then on the frames of inc, a Hello included, are no sign
// of life (leftAs).
func (l *liveness) leave(p messages.PeerID, inc uint64) bool {
	s := l.peers[p]
	if s == nil {
		return false
	}
	if inc != 0 && !slices.Contains(s.byes[:], inc) {
		copy(s.byes[1:], s.byes[:])
		s.byes[0] = inc
	}
	if s.down {
		return false
	}
	s.down = true
	return true
}

// leftAs reports whether incarnation inc (not 0) of p said goodbye.
func (l *liveness) leftAs(p messages.PeerID, inc uint64) bool {
	byes := l.left[p]
	if s := l.peers[p]; s != nil {
		byes = s.byes
	}
	return byes[0] != 0 && inc != 0 && slices.Contains(byes[:], inc)
}

// forget stops tracking p (a peer the directory forgot to make room):
// with names that come and go, the table would otherwise grow with every
// name ever heard, and each expiry walk with it. p's goodbyes are kept
// (left): the directory forgets first the peers that are down, those
// that said goodbye among them, and a late Hello of an incarnation that
// said goodbye must not bring it back once forgotten either.
func (l *liveness) forget(p messages.PeerID) {
	if s := l.peers[p]; s != nil && s.byes[0] != 0 {
		if l.left == nil {
			l.left = map[messages.PeerID][4]uint64{}
		}
		for q := range l.left {
			if len(l.left) < maxPeers {
				break
			}
			delete(l.left, q)
		}
		l.left[p] = s.byes
	}
	delete(l.peers, p)
}

// seen records a sign of life from a tracked peer at now; untracked peers
// are ignored. It reports whether p was down.
func (l *liveness) seen(p messages.PeerID, now time.Time) (back bool) {
	s := l.peers[p]
	if s == nil {
		return false
	}
	return l.refresh(s, now)
}

func (l *liveness) refresh(s *lifeState, now time.Time) bool {
	if now.After(s.last) {
		s.last = now
	}
	back := s.down
	s.down = false
	return back
}

// tracks reports whether p is tracked (said Hello, not forgotten).
func (l *liveness) tracks(p messages.PeerID) bool { return l.peers[p] != nil }

// isDown reports whether p is tracked and down.
func (l *liveness) isDown(p messages.PeerID) bool {
	s := l.peers[p]
	return s != nil && s.down
}

// expire marks down every alive peer silent for at least the timeout and
// calls fn for each, once per alive→down transition.
func (l *liveness) expire(now time.Time, fn func(messages.PeerID)) {
	if l.timeout <= 0 {
		return
	}
	for p, s := range l.peers {
		if !s.down && now.Sub(s.last) >= l.timeout {
			s.down = true
			fn(p)
		}
	}
}

// next is how long from now until the first tracked alive peer's silence
// reaches the timeout (when expire would mark it down), at most most; most
// when no peer is alive or the timeout is 0. A peer first heard from later
// expires at least the timeout from then, so a wait of at most
// min(most, timeout) misses none.
func (l *liveness) next(now time.Time, most time.Duration) time.Duration {
	d := most
	if l.timeout <= 0 {
		return d
	}
	d = min(d, l.timeout)
	for _, s := range l.peers {
		if s.down {
			continue
		}
		d = min(d, s.last.Add(l.timeout).Sub(now))
	}
	return max(d, 0)
}
