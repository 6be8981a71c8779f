package faulty

import (
	"time"
)

// Option configures an Agent.
type Option func(*config)

type config struct {
	seed     uint64
	clock    Clock
	rules    []rule
	postCost time.Duration
	unproven bool // WithUnprovenClose
	released bool // WithSourcesReleased
}

// kind is a kind of fault.
type kind uint8

const (
	kindFail kind = iota + 1
	kindPartial
	kindHang
	kindDelay
	kindSlow
	kindPeerGone
	kindCut
)

func (k kind) String() string {
	switch k {
	case kindFail:
		return "fail"
	case kindPartial:
		return "partial"
	case kindHang:
		return "hang"
	case kindDelay:
		return "delay"
	case kindSlow:
		return "slow"
	case kindPeerGone:
		return "peer-gone"
	case kindCut:
		return "cut"
	}
	return "kind(?)"
}

// rule is one fault and the batches it hits.
type rule struct {
	kind   kind
	match  Match
	prefix int           // kindPartial
	delay  time.Duration // kindDelay
	gate   *Gate         // kindSlow
}

// WithPostCost makes every Post take d on the caller's goroutine before
// it does anything else: the CPU cost of posting a batch (building work
// requests, ringing the doorbell) that a sender worker pays, which is what
// several workers parallelise. It is a cost model for benchmarks, not a
// fault: outcomes are unchanged.
func WithPostCost(d time.Duration) Option { return func(c *config) { c.postCost = d } }

// WithUnprovenClose makes an endpoint's Close, when it cuts batches that
// Hang or Slow still hold, return an error wrapping rdma.ErrCloseUnproven,
// as UCX's forced close after its timeout does: those batches stand for
// writes on the wire that the peer may still apply. (Without it such a
// Close is a proof, as a loopback or shm close is.)
func WithUnprovenClose() Option { return func(c *config) { c.unproven = true } }

// WithSourcesReleased makes a Close that returns rdma.ErrCloseUnproven
// (WithUnprovenClose, Cut) wrap rdma.ErrSourcesReleased beside it, as
// UCX's does once its forced close has completed: the cut writes may
// still land at the peer, but nothing reads their sources any more.
// Without it such a Close says nothing of the sources, as a backend whose
// cut writes may still read them (a GPU copy on a stream).
func WithSourcesReleased() Option { return func(c *config) { c.released = true } }

// WithSeed seeds the endpoints' random streams (default 0).
func WithSeed(seed uint64) Option { return func(c *config) { c.seed = seed } }

// WithClock sets the clock Delay waits on (default: real time).
func WithClock(clk Clock) Option { return func(c *config) { c.clock = clk } }

// Fail fails the batches m matches without posting them.
func Fail(m Match) Option { return addRule(rule{kind: kindFail, match: m}) }

// Partial posts only the first prefix segments of the batches m matches and
// fails them naming segment prefix (the last segment when prefix is not
// below the batch's length).
func Partial(m Match, prefix int) Option {
	return addRule(rule{kind: kindPartial, match: m, prefix: max(prefix, 0)})
}

// Hang posts the batches m matches but withholds their Done until the
// endpoint closes.
func Hang(m Match) Option { return addRule(rule{kind: kindHang, match: m}) }

// Delay calls the Done of the batches m matches d after they completed, on
// the configured Clock.
func Delay(m Match, d time.Duration) Option {
	return addRule(rule{kind: kindDelay, match: m, delay: d})
}

// Slow holds the Done of the batches m matches until g opens.
func Slow(m Match, g *Gate) Option { return addRule(rule{kind: kindSlow, match: m, gate: g}) }

// Cut posts the batches m matches and, once they complete, fails them as
// UCX's endpoint error fails a batch on the wire to a peer it lost: with
// rdma.ErrPeerGone and rdma.ErrCloseUnproven (its writes may still land).
// The endpoint is failed from then on: later posts fail with
// rdma.ErrPeerGone, a Flush reports it, and Close returns an error
// wrapping rdma.ErrCloseUnproven (and rdma.ErrSourcesReleased with
// WithSourcesReleased), with or without WithUnprovenClose.
func Cut(m Match) Option { return addRule(rule{kind: kindCut, match: m}) }

// PeerGone fails the first batch m matches, and every later one, with
// rdma.ErrPeerGone at Post.
func PeerGone(m Match) Option { return addRule(rule{kind: kindPeerGone, match: m}) }

func addRule(r rule) Option { return func(c *config) { c.rules = append(c.rules, r) } }
