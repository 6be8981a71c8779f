package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kvxfer/kvxfer/kvcache"
)

// Pools guards an engine's per-group block pools (one region, one pool per
// layer group). Session shells pin and unpin through it, the rx supervisor
// allocates through it, and the serving process allocates source blocks
// through it; a mutex keeps kvcache.Pool's single-owner rule.
//
// Who owns a block, and so who may give it back:
//   - blocks the serving process allocated (Alloc), and a READY outcome's
//     blocks once it is delivered, are the caller's (kvcache.BlockAllocated):
//     Free (Engine.FreeBlocks) frees them;
//   - destination blocks a live receive allocated are the receive's
//     (kvcache.BlockReceiving) until READY hands them to the caller, or the
//     receive frees or quarantines them itself: Free, Quarantine and Pin
//     refuse them, naming the group and the block;
//   - the caller's allocated blocks it passes to a receive
//     (RxRequest.Blocks) are lent to it: the receive's until its handle
//     says Released, then the caller's again, allocated (not free);
//   - blocks free in the pool that the caller passes to a receive (a
//     framework that allocates its ids elsewhere) stay free here, but no
//     other receive may be passed them until that handle says Released;
//   - a pin is its taker's: the caller's Unpin drops only the pins its
//     own Pin took, never those of a chunk's admission (held until Done).
//
// The engine's sessions use their own view of the same pools (forSessions),
// whose Alloc hands out receiving blocks and whose Free and Quarantine take
// back only those; every other user, the serving process included, holds
// the caller's view. Free, Quarantine and ReleaseQuarantine check every
// group before they change any: an error leaves the pools as they were.
type Pools struct {
	*poolSet
	// sessions: the engine's sessions' view (forSessions).
	sessions bool
}

// poolSet is the state both views of a Pools share.
type poolSet struct {
	mu     sync.Mutex
	cond   *sync.Cond
	pools  []*kvcache.Pool
	onFree func()
	// quarantineLimit bounds the quarantined bytes (0: a default, half
	// the pools' bytes): past it Alloc refuses (ErrQuarantineFull, which
	// wraps kvcache.ErrOutOfBlocks, so the allocation queue waits).
	quarantineLimit uint64
	// weights[g] is what a block of group g weighs in the quarantine's
	// bytes (SetBlockWeights; nil or 0: the pool's BlockBytes).
	weights []uint64
	// lentTo[g][id] is the receive the caller lent block id of group g to
	// (nil: none); a group's row is made at its first lend. lends holds
	// the lends not yet over.
	lentTo [][]*lend
	lends  map[*lend]struct{}
	// unwoken: a lend's end put blocks back on the free lists under a
	// call that does not wake allocations (any that settles lends by the
	// way: Stats, Alloc, Free, …). The lend's session calls settleOver or
	// endLend right after it closes over, and wakes them then, whoever
	// ended the lend.
	unwoken bool
	// sessQ[g] holds the blocks of group g that the sessions' view
	// quarantined (a request failed without proof): only that view
	// releases them (made at the group's first).
	sessQ []map[kvcache.BlockID]bool
	// closed: the engine closed (Close); Alloc refuses with ErrClosed.
	closed bool
	// callerPins[g][id] counts the pins the caller's view took (Pin,
	// PinRuns) on block id of group g and has not dropped: the caller's
	// Unpin drops only those, never a session's (a group's map is made at
	// its first).
	callerPins []map[kvcache.BlockID]uint32
}

// lend is a caller's allocated blocks lent to one receive
// (ReceiveRequest.Blocks): receiving until over is closed (the handle's
// Released: no write of the receive can touch them any more), then the
// caller's again.
type lend struct {
	request string
	over    <-chan struct{}
	blocks  [][]kvcache.BlockID
	// free are the blocks the caller passed that were free in the pool:
	// reserved (receiving, off the free lists) while the lend lives, free
	// again at its end.
	free [][]kvcache.BlockID
}

// forSessions is the view of p the engine's sessions use: its Alloc hands
// out blocks a live receive owns (kvcache.BlockReceiving), its Free and
// Quarantine take back only such blocks, and never the caller's lent ones.
func (p *Pools) forSessions() *Pools { return &Pools{poolSet: p.poolSet, sessions: true} }

// ErrQuarantineFull: destination blocks of requests that failed without
// proof that their writers stopped fill the quarantine bound; new
// requests wait until a proof releases some (or fail at their deadline).
// It wraps kvcache.ErrOutOfBlocks.
var ErrQuarantineFull = fmt.Errorf("%w: quarantine full", kvcache.ErrOutOfBlocks)

// SetQuarantineLimit bounds the quarantined bytes (0: half the pools'
// bytes). Allocations waiting for blocks are woken, as by a free: a
// raised bound may let them through.
func (p *Pools) SetQuarantineLimit(bytes uint64) {
	p.mu.Lock()
	p.quarantineLimit = bytes
	p.cond.Broadcast()
	f := p.onFree
	p.mu.Unlock()
	if f != nil {
		f()
	}
}

// QuarantineLimit is the bound in force, in bytes.
func (p *Pools) QuarantineLimit() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.limitLocked()
}

func (p *Pools) limitLocked() uint64 {
	if p.quarantineLimit > 0 {
		return p.quarantineLimit
	}
	var total uint64
	for g, pl := range p.pools {
		total += p.weightLocked(g) * uint64(pl.Len())
	}
	return max(total/2, 1)
}

func (p *Pools) quarantinedLocked() uint64 {
	var n uint64
	for g, pl := range p.pools {
		n += p.weightLocked(g) * uint64(pl.Stats().Quarantined)
	}
	return n
}

// weightLocked is what a block of group g weighs in the quarantine's
// bytes.
func (p *Pools) weightLocked(g int) uint64 {
	if g < len(p.weights) && p.weights[g] > 0 {
		return p.weights[g]
	}
	return p.pools[g].BlockBytes()
}

// SetBlockWeights says what a block of each group holds, in bytes, where
// its pool's BlockBytes does not (an engine over Config.Memory, whose
// pools number blocks of one byte each while the descriptors say where
// a block's bytes lie): the quarantine's bound (SetQuarantineLimit, its
// default half of the pools) and QuarantinedBytes count them so. A
// weight of 0 keeps the pool's BlockBytes. Allocations waiting for blocks
// are woken, as by SetQuarantineLimit.
func (p *Pools) SetBlockWeights(bytes []uint64) {
	p.mu.Lock()
	p.weights = slices.Clone(bytes)
	p.cond.Broadcast()
	f := p.onFree
	p.mu.Unlock()
	if f != nil {
		f()
	}
}

// QuarantinedBytes is the bytes of the blocks in quarantine.
func (p *Pools) QuarantinedBytes() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.quarantinedLocked()
}

// Quarantined is the number of blocks in quarantine, over all groups.
func (p *Pools) Quarantined() int {
	n := 0
	for _, st := range p.Stats() {
		n += st.Quarantined
	}
	return n
}

// Quarantine moves blocks per group into quarantine, all or nothing: in
// the caller's view every block must be the caller's (allocated,
// unpinned), in the sessions' view a live receive's; none named twice.
func (p *Pools) Quarantine(blocks [][]kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sessions {
		if err := p.applyLocked("Quarantine", kvcache.BlockReceiving, blocks, (*kvcache.Pool).QuarantineReceiving); err != nil {
			return err
		}
		for g, ids := range blocks {
			for len(p.sessQ) <= g {
				p.sessQ = append(p.sessQ, nil)
			}
			if p.sessQ[g] == nil && len(ids) > 0 {
				p.sessQ[g] = map[kvcache.BlockID]bool{}
			}
			for _, id := range ids {
				p.sessQ[g][id] = true
			}
		}
		return nil
	}
	return p.applyLocked("Quarantine", kvcache.BlockAllocated, blocks, (*kvcache.Pool).Quarantine)
}

// ReleaseQuarantine returns quarantined blocks per group to the free
// lists, all or nothing: the caller has proof that no write can reach them
// any more. The caller's view refuses blocks the engine's sessions
// quarantined (a request that failed without proof that its writers
// stopped): only the engine, holding that proof, releases them.
func (p *Pools) ReleaseQuarantine(blocks [][]kvcache.BlockID) error {
	return p.putBack("ReleaseQuarantine", kvcache.BlockQuarantined, blocks, (*kvcache.Pool).ReleaseQuarantine, p.releasableLocked)
}

// releasableLocked refuses, in the caller's view, blocks the sessions' view
// quarantined; when every block may go it forgets their marks. It checks
// the blocks first, so the release that follows cannot fail.
func (p *Pools) releasableLocked(blocks [][]kvcache.BlockID) error {
	if err := p.checkLocked("ReleaseQuarantine", kvcache.BlockQuarantined, blocks); err != nil {
		return err
	}
	for g, ids := range blocks {
		if g >= len(p.sessQ) || p.sessQ[g] == nil {
			continue
		}
		for _, id := range ids {
			if p.sessQ[g][id] && !p.sessions {
				return fmt.Errorf("%w: ReleaseQuarantine: group %d block %d: the engine quarantined it (a request's writers gave no proof that they stopped); only the engine releases it",
					kvcache.ErrBlockQuarantined, g, id)
			}
		}
	}
	for g, ids := range blocks {
		if g < len(p.sessQ) && p.sessQ[g] != nil {
			for _, id := range ids {
				delete(p.sessQ[g], id)
			}
		}
	}
	return nil
}

// putBack applies put (a Free or ReleaseQuarantine) to blocks per group,
// all or nothing, then wakes allocations waiting for blocks and the
// onFree hook. guard, when set, runs first under the lock and may refuse.
func (p *Pools) putBack(op string, from kvcache.BlockState, blocks [][]kvcache.BlockID, put func(*kvcache.Pool, ...kvcache.BlockID) error,
	guard func([][]kvcache.BlockID) error) error {
	p.mu.Lock()
	if guard != nil {
		if err := guard(blocks); err != nil {
			p.mu.Unlock()
			return err
		}
	}
	if err := p.applyLocked(op, from, blocks, put); err != nil {
		p.mu.Unlock()
		return err
	}
	p.cond.Broadcast()
	f := p.onFree
	p.mu.Unlock()
	if f != nil {
		f()
	}
	return nil
}

// applyLocked checks every group's blocks (checkLocked), then applies f
// to each: it changes all groups or none.
func (p *Pools) applyLocked(op string, from kvcache.BlockState, blocks [][]kvcache.BlockID, f func(*kvcache.Pool, ...kvcache.BlockID) error) error {
	if err := p.checkLocked(op, from, blocks); err != nil {
		return err
	}
	for g, ids := range blocks {
		if len(ids) > 0 {
			if err := f(p.pools[g], ids...); err != nil {
				return fmt.Errorf("group %d: %w", g, err) // checked above: cannot happen
			}
		}
	}
	return nil
}

// checkLocked returns the error op would meet moving blocks out of state
// from, naming the group and the block, and changes nothing: a group past
// the pools, an id out of range, in another state (a live receive's, when
// the caller's are wanted) or named twice; in the sessions' view a block
// the caller lent. Lends that are over are settled first.
func (p *Pools) checkLocked(op string, from kvcache.BlockState, blocks [][]kvcache.BlockID) error {
	for g, ids := range blocks {
		if len(ids) == 0 {
			continue
		}
		if g >= len(p.pools) {
			return fmt.Errorf("%w: %s: group %d, the pools have %d", kvcache.ErrUnknownBlock, op, g, len(p.pools))
		}
		p.settleLocked(g, ids)
		if err := p.pools[g].Check(op, from, ids...); err != nil {
			if errors.Is(err, kvcache.ErrBlockReceiving) {
				if l := p.firstLent(g, ids); l != nil {
					return fmt.Errorf("group %d: %w (lent by its caller to request %s)", g, err, l.request)
				}
			}
			return fmt.Errorf("group %d: %w", g, err)
		}
		if from == kvcache.BlockReceiving {
			if l := p.firstLent(g, ids); l != nil {
				return fmt.Errorf("%w: %s: group %d: a block its caller lent to request %s is the caller's to reuse, not the pool's",
					kvcache.ErrBlockReceiving, op, g, l.request)
			}
		}
	}
	return nil
}

// lentAt is the live lend that holds block id of group g, or nil.
func (p *Pools) lentAt(g int, id kvcache.BlockID) *lend { return lendIn(p.lentTo, g, id) }

// lendIn is table[g][id] (lentTo), or nil outside it.
func lendIn(table [][]*lend, g int, id kvcache.BlockID) *lend {
	if g >= len(table) || table[g] == nil || id < 0 || int(id) >= len(table[g]) {
		return nil
	}
	return table[g][id]
}

// note records l as table[g][id], making the table and its row first.
func (p *Pools) note(table *[][]*lend, g int, id kvcache.BlockID, l *lend) {
	if *table == nil {
		*table = make([][]*lend, len(p.pools))
	}
	if (*table)[g] == nil {
		(*table)[g] = make([]*lend, p.pools[g].Len())
	}
	(*table)[g][id] = l
}

// firstLent is the lend of the first of ids of group g a lend holds, or
// nil.
func (p *Pools) firstLent(g int, ids []kvcache.BlockID) *lend {
	if len(p.lends) == 0 {
		return nil
	}
	for _, id := range ids {
		if l := p.lentAt(g, id); l != nil {
			return l
		}
	}
	return nil
}

// settleLocked ends the lends of ids of group g that are over. Without a
// lend it costs one length check.
func (p *Pools) settleLocked(g int, ids []kvcache.BlockID) {
	if len(p.lends) == 0 {
		return
	}
	for _, id := range ids {
		if l := p.lentAt(g, id); l != nil {
			p.settleLend(l)
		}
	}
}

// settleLend ends l if it is over.
func (p *Pools) settleLend(l *lend) {
	select {
	case <-l.over:
		p.endLocked(l)
	default:
	}
}

// settleOver ends every lend that is over (its receive proven done with
// the blocks) and wakes allocations if that, or the end of a lend under
// a call that does not wake them (unwoken: a Stats between the session's
// release and this call), put blocks back on the free lists: the rx
// session calls it as its caller-owned receive stops.
func (p *Pools) settleOver() {
	p.mu.Lock()
	for l := range p.lends {
		select {
		case <-l.over:
			p.endLocked(l)
		default:
		}
	}
	p.unlockWaking()
}

// unlockWaking unlocks p.mu and then, when a lend's end put blocks back on
// the free lists since the last wake (unwoken), wakes allocations.
func (p *Pools) unlockWaking() {
	f := p.onFree
	if !p.unwoken {
		f = nil
	}
	p.unwoken = false
	p.mu.Unlock()
	if f != nil {
		f()
	}
}

// endLocked gives l's blocks back to the caller: its allocated ones
// allocated again, those that were free in the pool free again (then
// allocations waiting may go on: unwoken says so until settleOver or
// endLend wakes them).
func (p *Pools) endLocked(l *lend) {
	if _, live := p.lends[l]; !live {
		return
	}
	freed := false
	for g, ids := range l.blocks {
		if len(ids) == 0 {
			continue
		}
		_ = p.pools[g].HandOver(ids...) // lent: only the lend's end moves them
		for _, id := range ids {
			p.lentTo[g][id] = nil
		}
	}
	for g, ids := range l.free {
		if len(ids) == 0 {
			continue
		}
		_ = p.pools[g].FreeReceiving(ids...) // reserved: only the lend's end moves them
		for _, id := range ids {
			p.lentTo[g][id] = nil
		}
		freed = true
	}
	delete(p.lends, l)
	if freed {
		p.cond.Broadcast()
		p.unwoken = true
	}
}

// lend lends the caller's allocated blocks among blocks (one receive's
// ReceiveRequest.Blocks) to request's receive until over is closed: they
// are receiving, and no Free, Quarantine, Pin or other lend takes them,
// until then; after, the caller's again (allocated). Blocks free in the
// pool (a framework that allocates them elsewhere) are reserved, receiving
// and off the free lists, so that no Alloc hands them to another request
// while a write may reach them; the lend's end puts them back free.
// Ids the receive's own check refuses (out of range, a group past the
// layout) are left alone. A block a live request owns, pinned or
// quarantined fails the lend, changing nothing. A nil lend: nothing was
// lent.
func (p *Pools) lend(request string, blocks [][]kvcache.BlockID, over <-chan struct{}) (*lend, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for g, ids := range blocks {
		if g >= len(p.pools) {
			continue
		}
		p.settleLocked(g, ids)
		for _, id := range ids {
			st, err := p.pools[g].State(id)
			if err != nil || st == kvcache.BlockFree || st == kvcache.BlockAllocated {
				continue
			}
			why := fmt.Sprintf("is %v", st)
			sentinel := kvcache.ErrBlockQuarantined
			switch st {
			case kvcache.BlockReceiving:
				sentinel, why = kvcache.ErrBlockReceiving, "is receiving: a live request owns it"
				if l := p.lentAt(g, id); l != nil {
					why = "is receiving: live request " + l.request + " owns it"
				}
			case kvcache.BlockPinned:
				sentinel, why = kvcache.ErrBlockPinned, "is pinned: a send reads it"
			}
			return nil, fmt.Errorf("%w: request %s layer group %d: destination block %d %s: %w", ErrBadRequest, request, g, id, why, sentinel)
		}
	}
	l := &lend{request: request, over: over, blocks: make([][]kvcache.BlockID, len(blocks)), free: make([][]kvcache.BlockID, len(blocks))}
	n := 0
	for g, ids := range blocks {
		if g >= len(p.pools) {
			continue
		}
		pl := p.pools[g]
		for _, id := range ids {
			st, err := pl.State(id)
			if err == nil && st == kvcache.BlockFree {
				if err := pl.Reserve(id); err != nil {
					continue // free: cannot fail
				}
				p.note(&p.lentTo, g, id, l)
				l.free[g] = append(l.free[g], id)
				n++
				continue
			}
			if err != nil || st != kvcache.BlockAllocated {
				continue // out of range, or named twice
			}
			if err := pl.Lend(id); err != nil {
				continue // allocated: cannot fail
			}
			p.note(&p.lentTo, g, id, l)
			l.blocks[g] = append(l.blocks[g], id)
			n++
		}
	}
	if n == 0 {
		return nil, nil
	}
	if p.lends == nil {
		p.lends = make(map[*lend]struct{})
	}
	p.lends[l] = struct{}{}
	return l, nil
}

// endLend gives a lend's blocks back to the caller at once: the receive
// never started, or it is READY. A nil lend is a no-op.
func (p *Pools) endLend(l *lend) {
	if l == nil {
		return
	}
	p.mu.Lock()
	p.endLocked(l)
	p.unlockWaking()
}

// handOver gives a READY receive's blocks, receiving, to its caller:
// allocated, for Engine.FreeBlocks. All or nothing.
func (p *Pools) handOver(blocks [][]kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applyLocked("HandOver", kvcache.BlockReceiving, blocks, (*kvcache.Pool).HandOver)
}

// NewPools wraps pools (index = layer group).
func NewPools(pools []*kvcache.Pool) *Pools {
	s := &poolSet{pools: pools}
	s.cond = sync.NewCond(&s.mu)
	return &Pools{poolSet: s}
}

// Groups is the number of layer groups.
func (p *Pools) Groups() int { return len(p.pools) }

// Geometry returns group g's pool geometry inside the region.
func (p *Pools) Geometry(g int) kvcache.PoolGeometry {
	pl := p.pools[g]
	return kvcache.PoolGeometry{Offset: pl.Offset(0), BlockBytes: pl.BlockBytes(), Blocks: pl.Len()}
}

// Alloc allocates counts[g] blocks in every group, all or nothing: the
// caller's (allocated), or in the sessions' view a live receive's
// (receiving). After Close it fails with ErrClosed.
func (p *Pools) Alloc(counts []int) ([][]kvcache.BlockID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocLocked(counts)
}

func (p *Pools) allocLocked(counts []int) ([][]kvcache.BlockID, error) {
	if p.closed {
		return nil, fmt.Errorf("%w: no blocks are allocated once the engine is closed", ErrClosed)
	}
	if len(counts) != len(p.pools) {
		return nil, fmt.Errorf("%w: %d group counts for %d groups", kvcache.ErrBadPlan, len(counts), len(p.pools))
	}
	for g, n := range counts {
		if err := p.pools[g].Geometry().CheckFits(n); err != nil {
			return nil, fmt.Errorf("layer group %d: %w", g, err)
		}
	}
	// The quarantine's bound holds back what would take blocks: an
	// allocation of none (a receive whose every block is a prefix hit)
	// takes nothing, and waiting for a proof unrelated to it would only
	// hold it, and the queue behind it, to a deadline.
	if q, lim := p.quarantinedLocked(), p.limitLocked(); q >= lim && slices.ContainsFunc(counts, func(n int) bool { return n > 0 }) {
		return nil, fmt.Errorf("%w: %d bytes quarantined, limit %d", ErrQuarantineFull, q, lim)
	}
	for l := range p.lends {
		p.settleLend(l) // an over lend's reserved blocks are free again
	}
	for g, n := range counts {
		if st := p.pools[g].Stats(); n > st.Free {
			return nil, fmt.Errorf("%w: group %d needs %d blocks, %d free", kvcache.ErrOutOfBlocks, g, n, st.Free)
		}
	}
	alloc, free := (*kvcache.Pool).Alloc, (*kvcache.Pool).Free
	if p.sessions {
		alloc, free = (*kvcache.Pool).AllocReceiving, (*kvcache.Pool).FreeReceiving
	}
	out := make([][]kvcache.BlockID, len(counts))
	for g, n := range counts {
		ids, err := alloc(p.pools[g], n)
		if err != nil {
			for h := 0; h < g; h++ {
				_ = free(p.pools[h], out[h]...)
			}
			return nil, err
		}
		out[g] = ids
	}
	return out, nil
}

// AllocWait is Alloc that waits for blocks until ctx ends. A request larger
// than a pool (kvcache.ErrPoolTooSmall) or otherwise malformed fails at
// once: it waits only while blocks are in use (kvcache.ErrOutOfBlocks).
// One whose ctx ended while it waited says so first, wrapping both
// ctx.Err() and the last ErrOutOfBlocks.
func (p *Pools) AllocWait(ctx context.Context, counts []int) ([][]kvcache.BlockID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids, err := p.allocLocked(counts)
	if err == nil {
		return ids, nil
	}
	// Out of blocks: only now is ctx watched (its end wakes the wait), so
	// that an allocation that fits at once registers nothing. Registered
	// under mu, before the first Wait: an end from now on takes mu after
	// the Wait released it, and wakes it.
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	for {
		if !errors.Is(err, kvcache.ErrOutOfBlocks) {
			return nil, err // too small for the pool, a bad count: no free can help
		}
		if ctx.Err() != nil {
			// The end of the wait first: a cancel (an interrupted run)
			// reported as "out of blocks" sent users to grow the pool.
			return nil, fmt.Errorf("waiting for blocks ended (%w): %w", ctx.Err(), err)
		}
		p.cond.Wait()
		if ids, err = p.allocLocked(counts); err == nil {
			return ids, nil
		}
	}
}

// Close refuses every later Alloc (ErrClosed, which wakes an AllocWait
// too): the engine closed, and its pool memory may be gone. Frees still
// work. Idempotent.
func (p *Pools) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Held checks that every id of group g is held by its owner (allocated,
// pinned or not), as a source block must be before Pin: the error wraps
// the first bad block's kvcache.ErrBlockFree (kvcache.ErrBlockReceiving
// for a block a live receive owns, kvcache.ErrBlockQuarantined for one in
// quarantine, or the pool's error) and names every bad block, up to a
// few.
func (p *Pools) Held(g int, ids []kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g < 0 || g >= len(p.pools) {
		return fmt.Errorf("%w: group %d of %d", kvcache.ErrUnknownBlock, g, len(p.pools))
	}
	p.settleLocked(g, ids)
	var bad []string
	var first error
	for _, id := range ids {
		st, err := p.pools[g].State(id)
		if err == nil && (st == kvcache.BlockAllocated || st == kvcache.BlockPinned) {
			continue
		}
		switch {
		case err == nil && st == kvcache.BlockReceiving:
			err = fmt.Errorf("%w: block %d is receiving: a live request owns it", kvcache.ErrBlockReceiving, id)
		case err == nil && st == kvcache.BlockQuarantined:
			// Not free: held until no write can reach it (ReleaseQuarantine).
			err = fmt.Errorf("%w: block %d is quarantined: it is not the caller's until its quarantine is released",
				kvcache.ErrBlockQuarantined, id)
		case err == nil:
			err = fmt.Errorf("%w: block %d is %v", kvcache.ErrBlockFree, id, st)
		}
		if first == nil {
			first = err
		}
		if len(bad) < 8 {
			bad = append(bad, fmt.Sprint(id))
		}
	}
	if first == nil {
		return nil
	}
	return fmt.Errorf("group %d: source blocks [%s] not held (of %d named): %w", g, strings.Join(bad, " "), len(ids), first)
}

// Free frees blocks per group, all or nothing: in the caller's view
// (Engine.FreeBlocks) the caller's blocks, never one a live receive owns;
// in the sessions' view a live receive's own.
func (p *Pools) Free(blocks [][]kvcache.BlockID) error {
	if p.sessions {
		return p.putBack("Free", kvcache.BlockReceiving, blocks, (*kvcache.Pool).FreeReceiving, nil)
	}
	return p.putBack("Free", kvcache.BlockAllocated, blocks, (*kvcache.Pool).Free, nil)
}

// Pin pins blocks of group g. In the caller's view the pins are the
// caller's: its Unpin drops them, and only them.
func (p *Pools) Pin(g int, ids []kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g < 0 || g >= len(p.pools) {
		return fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
	}
	p.settleLocked(g, ids)
	if err := p.pools[g].Pin(ids...); err != nil {
		return err
	}
	p.notePinsLocked(g, ids)
	return nil
}

// notePinsLocked counts pins the caller's view took on ids of group g.
func (p *Pools) notePinsLocked(g int, ids []kvcache.BlockID) {
	if p.sessions || len(ids) == 0 {
		return
	}
	if p.callerPins == nil {
		p.callerPins = make([]map[kvcache.BlockID]uint32, len(p.pools))
	}
	if p.callerPins[g] == nil {
		p.callerPins[g] = map[kvcache.BlockID]uint32{}
	}
	for _, id := range ids {
		p.callerPins[g][id]++
	}
}

// callerPinnedLocked checks, in the caller's view, that the caller pinned
// each of ids of group g (as often as ids names it): a block only a session
// pinned (a chunk's source, read until Done) is refused with ErrNotPinned,
// naming it. It changes nothing.
func (p *Pools) callerPinnedLocked(g int, ids []kvcache.BlockID) error {
	var pins map[kvcache.BlockID]uint32
	if p.callerPins != nil {
		pins = p.callerPins[g]
	}
	var want map[kvcache.BlockID]uint32
	if len(ids) > 1 {
		want = make(map[kvcache.BlockID]uint32, len(ids))
	}
	for _, id := range ids {
		n := uint32(1)
		if want != nil {
			want[id]++
			n = want[id]
		}
		if pins[id] < n {
			return p.notCallerPinned(g, id, n, pins[id])
		}
	}
	return nil
}

// notCallerPinned is callerPinnedLocked's refusal of block id of group g,
// named n times where the caller holds held pins on it: out of range, not
// pinned at all, named more often than the caller pinned it, or pinned by
// a request's chunk alone.
func (p *Pools) notCallerPinned(g int, id kvcache.BlockID, n, held uint32) error {
	pl := p.pools[g]
	st, err := pl.State(id)
	switch {
	case err != nil:
		return fmt.Errorf("%w: Unpin: group %d block %d out of range [0, %d): name a block the caller pinned (Pools.Pin)",
			kvcache.ErrUnknownBlock, g, id, pl.Len())
	case st != kvcache.BlockPinned:
		return fmt.Errorf("%w: Unpin: group %d block %d is %v: it has no pin to drop (unpin only blocks the caller pinned with Pools.Pin)",
			kvcache.ErrNotPinned, g, id, st)
	case held > 0:
		return fmt.Errorf("%w: Unpin: group %d block %d named %d times, the caller holds %d pins on it (Pools.Pin): name it at most once a pin it holds",
			kvcache.ErrNotPinned, g, id, n, held)
	}
	return fmt.Errorf("%w: Unpin: group %d block %d has no pin the caller took (Pools.Pin): a request's chunk pinned it, and its pins go at Done",
		kvcache.ErrNotPinned, g, id)
}

// dropCallerPinsLocked uncounts the caller's pins on ids of group g, which
// callerPinnedLocked found.
func (p *Pools) dropCallerPinsLocked(g int, ids []kvcache.BlockID) {
	pins := p.callerPins[g]
	for _, id := range ids {
		if pins[id]--; pins[id] == 0 {
			delete(pins, id)
		}
	}
}

// PinRuns pins every run's blocks (run g: group g), all or nothing: when
// the pool refuses one group, the groups pinned before it are unpinned and
// its error, naming the group, is returned.
func (p *Pools) PinRuns(src []kvcache.BlockRun) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for g, run := range src {
		if len(run.IDs) == 0 {
			continue
		}
		var err error
		if g < len(p.pools) {
			p.settleLocked(g, run.IDs)
			err = p.pools[g].Pin(run.IDs...)
		} else {
			err = fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
		}
		if err != nil {
			for u := range g {
				if len(src[u].IDs) > 0 {
					_ = p.pools[u].Unpin(src[u].IDs...)
				}
			}
			p.cond.Broadcast()
			return fmt.Errorf("group %d: %w", g, err)
		}
	}
	for g, run := range src {
		p.notePinsLocked(g, run.IDs)
	}
	return nil
}

// UnpinRuns unpins every run's blocks (run g: group g). In the caller's
// view it is all or nothing, as PinRuns: when Unpin would refuse one
// group, no pin drops and that refusal, naming the group, is returned.
// In the sessions' view (a sweep of a chunk's pins) it unpins every group
// it can and reports the first refusal.
func (p *Pools) UnpinRuns(src []kvcache.BlockRun) error {
	if !p.sessions {
		return p.unpinCallerRuns(src)
	}
	var first error
	for g, run := range src {
		if len(run.IDs) > 0 {
			if err := p.Unpin(g, run.IDs); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// unpinCallerRuns is the caller's UnpinRuns: every group is checked (its
// pins the caller's own) before any is unpinned.
func (p *Pools) unpinCallerRuns(src []kvcache.BlockRun) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for g, run := range src {
		if len(run.IDs) == 0 {
			continue
		}
		if g >= len(p.pools) {
			return fmt.Errorf("%w: UnpinRuns: group %d, the pools have %d", kvcache.ErrUnknownBlock, g, len(p.pools))
		}
		if err := p.callerPinnedLocked(g, run.IDs); err != nil {
			return err
		}
	}
	for g, run := range src {
		if len(run.IDs) == 0 {
			continue
		}
		// Checked: the caller's pins are among the pool's.
		if err := p.pools[g].Unpin(run.IDs...); err != nil {
			return fmt.Errorf("group %d: %w", g, err)
		}
		p.dropCallerPinsLocked(g, run.IDs)
	}
	p.cond.Broadcast()
	return nil
}

// Unpin unpins blocks of group g. In the caller's view it drops only pins
// the caller took (Pin, PinRuns): a block pinned by a session alone (a
// chunk's source until Done) is refused with kvcache.ErrNotPinned, naming
// it, and nothing is unpinned.
func (p *Pools) Unpin(g int, ids []kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g < 0 || g >= len(p.pools) {
		return fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
	}
	if !p.sessions {
		if err := p.callerPinnedLocked(g, ids); err != nil {
			return err
		}
	}
	err := p.pools[g].Unpin(ids...)
	if err == nil && !p.sessions && len(ids) > 0 {
		p.dropCallerPinsLocked(g, ids)
	}
	p.cond.Broadcast()
	return err
}

// Stats returns each group's counters (lends that are over settled
// first).
func (p *Pools) Stats() []kvcache.PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.lends {
		p.settleLend(l)
	}
	out := make([]kvcache.PoolStats, len(p.pools))
	for g, pl := range p.pools {
		out[g] = pl.Stats()
	}
	return out
}

// Used is the number of blocks held (allocated, pinned or receiving),
// over all groups; quarantined blocks are counted by Quarantined.
func (p *Pools) Used() int {
	n := 0
	for _, st := range p.Stats() {
		n += st.Used
	}
	return n
}

func (p *Pools) setOnFree(f func()) {
	p.mu.Lock()
	p.onFree = f
	p.mu.Unlock()
}
