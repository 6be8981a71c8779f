package zmq

import (
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
// goodbye.
type liveness struct {
	timeout time.Duration // 0: never expire
	peers   map[messages.PeerID]*lifeState
}

type lifeState struct {
	last time.Time
	down bool
	// left: the incarnation leftInc said goodbye (leave), until a Hello
	// of the peer; its frames are then no sign of life (leftAs).
	left    bool
	leftInc uint64
}

func newLiveness(timeout time.Duration) *liveness {
	return &liveness{timeout: timeout, peers: map[messages.PeerID]*lifeState{}}
}

// hello starts tracking p (or refreshes it) at now; it reports whether p
// was down (it came back).
func (l *liveness) hello(p messages.PeerID, now time.Time) (back bool) {
	s := l.peers[p]
	if s == nil {
		l.peers[p] = &lifeState{last: now}
		return false
	}
	s.left = false
	return l.refresh(s, now)
}

// leave marks p down because incarnation inc of it said goodbye; it
// reports whether p was tracked and alive (untracked peers are ignored,
// and a peer already down stays so, untold). Until p's next Hello, the
// frames of inc are no sign of life (leftAs).
func (l *liveness) leave(p messages.PeerID, inc uint64) bool {
	s := l.peers[p]
	if s == nil || s.down {
		return false
	}
	s.down, s.left, s.leftInc = true, true, inc
	return true
}

// leftAs reports whether incarnation inc of p said goodbye and p has not
// said Hello since.
func (l *liveness) leftAs(p messages.PeerID, inc uint64) bool {
	s := l.peers[p]
	return s != nil && s.left && s.leftInc == inc
}

// forget stops tracking p (a peer the directory forgot to make room):
// with names that come and go, the table would otherwise grow with every
// name ever heard, and each expiry walk with it.
func (l *liveness) forget(p messages.PeerID) { delete(l.peers, p) }

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
