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
	p.mu.Lock()
	var first error
	for g, ids := range blocks {
		if len(ids) == 0 {
			continue
		}
		if g >= len(p.pools) {
			first = fmt.Errorf("%w: group %d", kvcache.ErrUnknownBlock, g)
			continue
		}
		if err := p.pools[g].Free(ids...); err != nil && first == nil {
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

// Used is the number of blocks not free, over all groups.
func (p *Pools) Used() int {
	n := 0
	for _, st := range p.Stats() {
		n += st.Total - st.Free
	}
	return n
}

func (p *Pools) setOnFree(f func()) {
	p.mu.Lock()
	p.onFree = f
	p.mu.Unlock()
}
