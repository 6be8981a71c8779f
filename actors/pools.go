package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/kvxfer/kvxfer/kvcache"
)

// Pools guards an engine's per-group block pools (one region, one pool per
// layer group). Session shells pin and unpin through it, the rx supervisor
// allocates through it, and the serving process allocates source blocks
// through it; a mutex keeps kvcache.Pool's single-owner rule.
type Pools struct {
	mu     sync.Mutex
	cond   *sync.Cond
	pools  []*kvcache.Pool
	onFree func()
	// quarantineLimit bounds the quarantined bytes (0: a default, half
	// the pools' bytes): past it Alloc refuses (ErrQuarantineFull, which
	// wraps kvcache.ErrOutOfBlocks, so the allocation queue waits).
	quarantineLimit uint64
}

// ErrQuarantineFull: destination blocks of requests that failed without
// proof that their writers stopped fill the quarantine bound; new
// requests wait until a proof releases some (or fail at their deadline).
// It wraps kvcache.ErrOutOfBlocks.
var ErrQuarantineFull = fmt.Errorf("%w: quarantine full", kvcache.ErrOutOfBlocks)

// SetQuarantineLimit bounds the quarantined bytes (0: half the pools'
// bytes).
func (p *Pools) SetQuarantineLimit(bytes uint64) {
	p.mu.Lock()
	p.quarantineLimit = bytes
	p.mu.Unlock()
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
	for _, pl := range p.pools {
		total += pl.BlockBytes() * uint64(pl.Len())
	}
	return max(total/2, 1)
}

func (p *Pools) quarantinedLocked() uint64 {
	var n uint64
	for _, pl := range p.pools {
		n += pl.BlockBytes() * uint64(pl.Stats().Quarantined)
	}
	return n
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

// Quarantine moves blocks per group into quarantine
// (kvcache.Pool.Quarantine): all or nothing — every block must be
// allocated and unpinned, none named twice.
func (p *Pools) Quarantine(blocks [][]kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for g, ids := range blocks {
		if len(ids) > 0 && g >= len(p.pools) {
			return fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
		}
		seen := make(map[kvcache.BlockID]bool, len(ids))
		for _, id := range ids {
			st, err := p.pools[g].State(id)
			if err != nil {
				return fmt.Errorf("group %d: %w", g, err)
			}
			if st != kvcache.BlockAllocated || seen[id] {
				return fmt.Errorf("%w: Quarantine: group %d block %d is %v (or named twice)", kvcache.ErrDoubleFree, g, id, st)
			}
			seen[id] = true
		}
	}
	for g, ids := range blocks {
		if len(ids) > 0 {
			if err := p.pools[g].Quarantine(ids...); err != nil {
				return fmt.Errorf("group %d: %w", g, err) // checked above: cannot happen
			}
		}
	}
	return nil
}

// ReleaseQuarantine returns quarantined blocks per group to the free
// lists: the caller has proof that no write can reach them any more.
func (p *Pools) ReleaseQuarantine(blocks [][]kvcache.BlockID) error {
	return p.putBack(blocks, (*kvcache.Pool).ReleaseQuarantine)
}

// putBack applies put (Free or ReleaseQuarantine) to blocks per group,
// then wakes allocations waiting for blocks and the onFree hook. It
// returns the first error; the other groups are still put back.
func (p *Pools) putBack(blocks [][]kvcache.BlockID, put func(*kvcache.Pool, ...kvcache.BlockID) error) error {
	p.mu.Lock()
	var first error
	for g, ids := range blocks {
		if len(ids) == 0 {
			continue
		}
		var err error
		if g < len(p.pools) {
			err = put(p.pools[g], ids...)
		} else {
			err = fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	p.cond.Broadcast()
	f := p.onFree
	p.mu.Unlock()
	if f != nil {
		f()
	}
	return first
}

// NewPools wraps pools (index = layer group).
func NewPools(pools []*kvcache.Pool) *Pools {
	p := &Pools{pools: pools}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Groups is the number of layer groups.
func (p *Pools) Groups() int { return len(p.pools) }

// Geometry returns group g's pool geometry inside the region.
func (p *Pools) Geometry(g int) kvcache.PoolGeometry {
	pl := p.pools[g]
	return kvcache.PoolGeometry{Offset: pl.Offset(0), BlockBytes: pl.BlockBytes(), Blocks: pl.Len()}
}

// Alloc allocates counts[g] blocks in every group, all or nothing.
func (p *Pools) Alloc(counts []int) ([][]kvcache.BlockID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocLocked(counts)
}

func (p *Pools) allocLocked(counts []int) ([][]kvcache.BlockID, error) {
	if len(counts) != len(p.pools) {
		return nil, fmt.Errorf("%w: %d group counts for %d groups", kvcache.ErrBadPlan, len(counts), len(p.pools))
	}
	for g, n := range counts {
		if err := p.pools[g].Geometry().CheckFits(n); err != nil {
			return nil, fmt.Errorf("layer group %d: %w", g, err)
		}
	}
	if q, lim := p.quarantinedLocked(), p.limitLocked(); q >= lim {
		return nil, fmt.Errorf("%w: %d bytes quarantined, limit %d", ErrQuarantineFull, q, lim)
	}
	for g, n := range counts {
		if st := p.pools[g].Stats(); n > st.Free {
			return nil, fmt.Errorf("%w: group %d needs %d blocks, %d free", kvcache.ErrOutOfBlocks, g, n, st.Free)
		}
	}
	out := make([][]kvcache.BlockID, len(counts))
	for g, n := range counts {
		ids, err := p.pools[g].Alloc(n)
		if err != nil {
			for h := 0; h < g; h++ {
				_ = p.pools[h].Free(out[h]...)
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
func (p *Pools) AllocWait(ctx context.Context, counts []int) ([][]kvcache.BlockID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	for {
		ids, err := p.allocLocked(counts)
		if err == nil {
			return ids, nil
		}
		if !errors.Is(err, kvcache.ErrOutOfBlocks) {
			return nil, err // too small for the pool, a bad count: no free can help
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		p.cond.Wait()
	}
}

// Held checks that every id of group g is held by its owner (allocated,
// pinned or not), as a source block must be before Pin: the error wraps
// kvcache.ErrBlockFree (or the pool's error) and names every bad block, up
// to a few.
func (p *Pools) Held(g int, ids []kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g < 0 || g >= len(p.pools) {
		return fmt.Errorf("%w: group %d of %d", kvcache.ErrUnknownBlock, g, len(p.pools))
	}
	var bad []string
	var first error
	for _, id := range ids {
		st, err := p.pools[g].State(id)
		if err == nil && (st == kvcache.BlockAllocated || st == kvcache.BlockPinned) {
			continue
		}
		if err == nil {
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

// Free frees blocks per group.
func (p *Pools) Free(blocks [][]kvcache.BlockID) error {
	return p.putBack(blocks, (*kvcache.Pool).Free)
}

// Pin pins blocks of group g.
func (p *Pools) Pin(g int, ids []kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g < 0 || g >= len(p.pools) {
		return fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
	}
	return p.pools[g].Pin(ids...)
}

// Unpin unpins blocks of group g.
func (p *Pools) Unpin(g int, ids []kvcache.BlockID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g < 0 || g >= len(p.pools) {
		return fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
	}
	err := p.pools[g].Unpin(ids...)
	p.cond.Broadcast()
	return err
}

// Stats returns each group's counters.
func (p *Pools) Stats() []kvcache.PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]kvcache.PoolStats, len(p.pools))
	for g, pl := range p.pools {
		out[g] = pl.Stats()
	}
	return out
}

// Used is the number of blocks held (allocated or pinned), over all
// groups; quarantined blocks are counted by Quarantined.
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
