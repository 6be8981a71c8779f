package control

import (
	"sync"
	"time"
)

// Throttle rate-limits repeated warnings per (peer, kind), so that a
// flood of frames from, or to, one peer cannot flood the log: each key may
// log Burst lines at once, then one line per Every. What it holds back is
// counted and reported with the next line it lets through (Allow's held),
// so a reader knows how much was suppressed. A shared budget of
// Burst×16 lines per Every caps all keys together, so many keys (a peer
// churning through ranks or connections) cannot multiply the output.
//
// It remembers at most maxKeys keys; when full, a key that has refilled
// completely is forgotten first, else any. Time comes in as an argument
// (pure, testable with fabricated times). Its methods are safe for
// concurrent use.
type Throttle struct {
	burst   float64
	every   time.Duration
	maxKeys int

	mu     sync.Mutex
	keys   map[throttleKey]*bucket
	global bucket
}

type throttleKey struct{ peer, kind string }

// bucket is a token bucket: tokens refill at one per every, up to a cap.
type bucket struct {
	tokens float64
	last   time.Time
	held   int // lines held back since the last one let through
}

// Defaults of NewThrottle's zero arguments.
const (
	DefaultThrottleBurst   = 5
	DefaultThrottleEvery   = 10 * time.Second
	DefaultThrottleMaxKeys = 4096
	globalBurstFactor      = 16
)

// NewThrottle returns a Throttle that lets each key log burst lines, then
// one per every, remembering at most maxKeys keys. Zero (or negative)
// arguments take the defaults (5 lines, then one per 10s, 4096 keys).
func NewThrottle(burst int, every time.Duration, maxKeys int) *Throttle {
	if burst <= 0 {
		burst = DefaultThrottleBurst
	}
	if every <= 0 {
		every = DefaultThrottleEvery
	}
	if maxKeys <= 0 {
		maxKeys = DefaultThrottleMaxKeys
	}
	return &Throttle{burst: float64(burst), every: every, maxKeys: maxKeys, keys: map[throttleKey]*bucket{},
		global: bucket{tokens: float64(burst * globalBurstFactor)}}
}

// Allow reports whether a warning of kind about peer may be logged at now
// and, when it may, how many such warnings were held back since the last
// one logged. A nil Throttle allows everything.
func (t *Throttle) Allow(now time.Time, peer, kind string) (ok bool, held int) {
	if t == nil {
		return true, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := throttleKey{peer, kind}
	b := t.keys[k]
	if b == nil {
		if len(t.keys) >= t.maxKeys {
			t.evict(now)
		}
		b = &bucket{tokens: t.burst, last: now}
		t.keys[k] = b
	}
	t.refill(b, now, t.burst)
	t.refill(&t.global, now, t.burst*globalBurstFactor)
	if b.tokens < 1 || t.global.tokens < 1 {
		b.held++
		return false, 0
	}
	b.tokens--
	t.global.tokens--
	held, b.held = b.held, 0
	return true, held
}

func (t *Throttle) refill(b *bucket, now time.Time, limit float64) {
	if b.last.IsZero() {
		b.last = now
	}
	if now.After(b.last) {
		b.tokens += float64(now.Sub(b.last)) / float64(t.every)
		b.last = now
	}
	if b.tokens > limit {
		b.tokens = limit
	}
}

// evict forgets one key: one that has refilled completely and held
// nothing back if there is one, else an arbitrary one.
func (t *Throttle) evict(now time.Time) {
	var victim *throttleKey
	for k, b := range t.keys {
		if victim == nil {
			kk := k
			victim = &kk
		}
		if b.held == 0 && b.tokens+float64(now.Sub(b.last))/float64(t.every) >= t.burst {
			delete(t.keys, k)
			return
		}
	}
	if victim != nil {
		delete(t.keys, *victim)
	}
}

// Len is how many keys the Throttle remembers.
func (t *Throttle) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.keys)
}
