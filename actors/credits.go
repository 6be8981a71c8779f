package actors

import (
	"sync"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/messages"
)

// DefaultFrameCredits is EngineConfig.FrameCredits' default.
const DefaultFrameCredits = 4096

// DefaultMaxOrphans is EngineConfig.MaxOrphans' default.
const DefaultMaxOrphans = 4096

// orphanLimit is the tx table's orphan limit for EngineConfig.MaxOrphans.
func orphanLimit(n int) int {
	switch {
	case n == 0:
		return DefaultMaxOrphans
	case n < 0:
		return 0
	}
	return n
}

// frameCredits bounds, per sending peer, the control frames the engine has
// taken from the link and not yet handled (DESIGN.md §7: mailboxes are
// bounded by credits). A frame takes a credit when the link delivers it
// and gives it back once the listener refused it or its parent (tx or rx)
// has handled it — forwarded it to a session, answered it, or dropped it.
// With a peer's credits spent, the engine refuses that peer's RequestData
// and Cancel (counted in Counters.FramesShed and as reason "shed" of
// kvxfer_frames_rejected_total, with a sampled warning): the listener's
// and the parents' mailboxes cannot grow without bound however fast a peer
// sends, and other peers are not held up. The generation side re-sends
// Cancel on its own timer. A refused RequestData is answered FAILED, so
// that its request fails at once instead of at its deadline: a copy of the
// fields that name it (a few hundred bytes, whatever the frame held) goes
// to the tx parent, which decides it as an invalid RequestData
// (TxTable.Unread): a live session hears of it only when the request is
// bound to the sender's instance (it fails, answering FAILED, unless it
// already has that epoch from that peer: only the tx parent and the
// session know whether a stream writes for it, and a FAILED Result is a
// proof of quiescence); every other is answered FAILED by the parent.
// Those copies take an answer credit of their own, ShedAnswers per peer;
// past them a refused RequestData is dropped unanswered and its request
// waits for its deadline. A terminal frame (Result, CancelAck, valid or
// not) is never shed: it still takes a credit, over the limit if need be,
// since it may be the only proof that a writer is quiescent.
//
// A frame's credit also weighs what it keeps in memory (frameBytes: a
// RequestData's block ids and remapped extents, a Hello's pools and memory
// descriptors): a peer's held frames weigh at most DefaultFrameCreditBytes,
// so that 4096 valid RequestData of a million blocks each (16 GiB) cannot
// be held at once. A frame that alone outweighs the budget still enters
// when the peer holds nothing else, so that every valid frame can.
//
// A peer's Cancels count against credits of their own (the same limit):
// the generation side re-sends each Cancel every second until it is
// acknowledged (backing off after the first minute), so a burst of requests timing out together can keep a
// shared budget spent for as long as the storm lasts, and every new
// RequestData would be shed meanwhile — past ShedAnswers dropped, its
// request failing at its deadline and joining the next storm. Apart, a
// Cancel storm sheds only Cancels, which are re-sent anyway.
type frameCredits struct {
	limit   int
	mu      sync.Mutex
	held    map[messages.PeerID]int // every frame but Cancel
	cancels map[messages.PeerID]int // Cancel
	answers map[messages.PeerID]int // refused RequestData waiting for their answer
	// weight is frameBytes of the peer's held frames (Cancels included),
	// at most byteLimit but for a lone frame heavier than it.
	weight    map[messages.PeerID]int
	byteLimit int
}

// DefaultFrameCreditBytes bounds the weight (frameBytes) of one peer's held
// frames: 256 MiB, room for DefaultFrameCredits RequestData of 16,384
// blocks each.
const DefaultFrameCreditBytes = 256 << 20

// frameBytes is what a decoded frame keeps in memory beyond its fixed
// fields, from its variable-length fields (every other frame's fields are
// bounded to a few KiB by messages' limits).
func frameBytes(f messages.Frame) int {
	switch m := f.(type) {
	case *messages.RequestData:
		return 4*core.DestBlocks(m) + 24*len(m.Remap)
	case *messages.Result:
		return len(m.Payload) // up to messages.MaxPayload (64 KiB): held Results count
	case *messages.Hello:
		n := len(m.AgentAddr) + 64*len(m.Pools)
		for _, mem := range m.Memory {
			n += 64 + 4*len(mem.Layers) + 8*len(mem.Base)
		}
		return n
	}
	return 0
}

// ShedAnswers is how many refused RequestData of one peer may wait at once
// for their FAILED answer (frameCredits).
const ShedAnswers = 256

func newFrameCredits(limit int) *frameCredits {
	if limit <= 0 {
		limit = DefaultFrameCredits
	}
	return &frameCredits{limit: limit, held: map[messages.PeerID]int{}, cancels: map[messages.PeerID]int{},
		answers: map[messages.PeerID]int{}, weight: map[messages.PeerID]int{}, byteLimit: DefaultFrameCreditBytes}
}

// terminal reports whether f is a terminal frame, never shed.
func terminal(f messages.Frame) bool {
	switch f.(type) {
	case *messages.Result, *messages.CancelAck:
		return true
	}
	return false
}

// take reports whether f may enter the engine, and if so takes its credit.
func (c *frameCredits) take(f messages.Frame) bool {
	from := f.Sender()
	c.mu.Lock()
	defer c.mu.Unlock()
	m, w := c.budget(f), frameBytes(f)
	if !terminal(f) && (m[from] >= c.limit || c.weight[from] > 0 && c.weight[from]+w > c.byteLimit) {
		return false
	}
	m[from]++
	if w > 0 {
		c.weight[from] += w
	}
	return true
}

// budget is the count f's credit comes from.
func (c *frameCredits) budget(f messages.Frame) map[messages.PeerID]int {
	if _, ok := f.(*messages.Cancel); ok {
		return c.cancels
	}
	return c.held
}

// give returns f's credit.
func (c *frameCredits) give(f messages.Frame) {
	peer, w := f.Sender(), frameBytes(f)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dec(c.budget(f), peer, 1)
	c.dec(c.weight, peer, w)
}

// put returns one of peer's credits counted in m (held or answers).
func (c *frameCredits) put(m map[messages.PeerID]int, peer messages.PeerID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dec(m, peer, 1)
}

// dec takes n from peer's count in m, deleting it at zero. c.mu is held.
func (c *frameCredits) dec(m map[messages.PeerID]int, peer messages.PeerID, n int) {
	if n <= 0 {
		return
	}
	if v := m[peer]; v > n {
		m[peer] = v - n
	} else {
		delete(m, peer)
	}
}

// takeAnswer reports whether a RequestData from peer, refused for its
// spent credits, may wait for its answer, and if so takes an answer
// credit.
func (c *frameCredits) takeAnswer(peer messages.PeerID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answers[peer] >= ShedAnswers {
		return false
	}
	c.answers[peer]++
	return true
}

// giveAnswer returns an answer credit of peer.
func (c *frameCredits) giveAnswer(peer messages.PeerID) { c.put(c.answers, peer) }
