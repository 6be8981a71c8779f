package kvxfer

import (
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// checkMemory validates Config.Memory against the resolved layout and
// shape: every error wraps ErrConfig and names the group and the value.
func (r *resolved) checkMemory() error {
	groups := len(r.layout.Groups)
	if r.Region == nil {
		return fmt.Errorf("%w: Memory is set but Region is not (descriptor offsets are relative to Region)", ErrConfig)
	}
	if len(r.Memory) != groups {
		return fmt.Errorf("%w: Memory has %d descriptors, layout %s has %d layer groups", ErrConfig, len(r.Memory), quote.String(r.layout.Name), groups)
	}
	for g, m := range r.Memory {
		name := fmt.Sprintf("Memory[%d] (group %s)", g, quote.String(r.layout.Groups[g].Name))
		if m == nil {
			if len(r.shape.Layers[g]) != 0 {
				return fmt.Errorf("%w: %s is nil but rank %v holds layers %v of it", ErrConfig, name, r.Rank, r.shape.Layers[g])
			}
			continue
		}
		if err := m.Validate(); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrConfig, name, err)
		}
		for _, f := range []struct {
			what      string
			got, want int
		}{
			{"HeadLo", m.HeadLo, r.shape.HeadLo}, {"Heads", m.Heads, r.shape.Heads()},
			{"Parts", m.Parts, r.layout.Parts()}, {"HeadDim", m.HeadDim, r.layout.HeadDim},
			{"ElemBytes", m.ElemBytes, r.layout.DTypeBytes}, {"TokensPerBlock", m.TokensPerBlock, r.layout.TokensPerBlock},
		} {
			if f.got != f.want {
				return fmt.Errorf("%w: %s: %s = %d, rank %v of layout %s needs %d", ErrConfig, name, f.what, f.got, r.Rank, quote.String(r.layout.Name), f.want)
			}
		}
		if !slices.Equal(m.Layers, r.shape.Layers[g]) {
			return fmt.Errorf("%w: %s: Layers = %v, rank %v holds %v", ErrConfig, name, m.Layers, r.Rank, r.shape.Layers[g])
		}
		if m.RegionLen != r.Region.Len {
			return fmt.Errorf("%w: %s: RegionLen = %d, Region is %d bytes", ErrConfig, name, m.RegionLen, r.Region.Len)
		}
		if m.Blocks < 1 || m.Blocks > messages.MaxBlocks {
			return fmt.Errorf("%w: %s: Blocks = %d, must be in [1, %d]", ErrConfig, name, m.Blocks, messages.MaxBlocks)
		}
	}
	// Each descriptor is valid alone; together they must not share bytes:
	// block b of one group and block b of another are handed out apart.
	if err := kvcache.CheckApart(r.Memory); err != nil {
		return fmt.Errorf("%w: Memory: %w", ErrConfig, err)
	}
	return nil
}

// cloneMemory copies descriptors deep (nil entries stay nil): the engine
// keeps the descriptors Start validated and planned from, whatever the
// caller does with its own after Start returns (reuses one for the next
// rank, say), as it keeps a clone of Config.Layout.
func cloneMemory(ms []*kvcache.KVMemory) []*kvcache.KVMemory {
	out := make([]*kvcache.KVMemory, len(ms))
	for g, m := range ms {
		if m == nil {
			continue
		}
		c := *m
		c.Layers = slices.Clone(m.Layers)
		if m.Base != nil {
			c.Base = make([][]uint64, len(m.Base))
			for i, b := range m.Base {
				c.Base[i] = slices.Clone(b)
			}
		}
		out[g] = &c
	}
	return out
}

// memoryPools carves no memory: for descriptor memory kvxfer's pool of a
// group only hands out and tracks the descriptor's block ids, so its
// geometry is one byte per block at offset 0 (the region holds at least
// Blocks bytes, the descriptor's tensors). A peer that predates descriptors
// and plans into that geometry refuses the request (its block stride of 1
// byte is below any real block) rather than writing the wrong bytes.
func memoryPools(r resolved) ([]*kvcache.Pool, []kvcache.PoolGeometry, error) {
	var pools []*kvcache.Pool
	var geoms []kvcache.PoolGeometry
	for g, m := range r.Memory {
		n := 1
		if m != nil {
			n = m.Blocks
		}
		p, err := kvcache.NewPool(r.Region, 0, 1, n)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: group %d pool: %w", ErrConfig, g, err)
		}
		pools = append(pools, p)
		geoms = append(geoms, kvcache.PoolGeometry{Offset: 0, BlockBytes: 1, Blocks: n})
	}
	return pools, geoms, nil
}

// BlockTensor is the memory of block id of (global) layer's part (0 for K
// or an MLA latent, 1 for V) in layer group g: the bytes from the block's
// first element to its last, as Config.Memory lays them out (or, without
// descriptors, as the pool does). Elements are not packed when the
// descriptor's strides leave gaps; read them at the descriptor's strides
// from the start of the slice. It returns nil for a group, layer, part or
// id the rank does not hold, and for device memory.
func (e *Engine) BlockTensor(g, layer, part int, id kvcache.BlockID) []byte {
	if !e.started() || g < 0 || g >= len(e.memory) || e.memory[g] == nil {
		return nil
	}
	off, n, ok := e.memory[g].TensorBlock(layer, part, id)
	buf := e.region.Bytes()
	if !ok || buf == nil || off+n > uint64(len(buf)) {
		return nil
	}
	return buf[off : off+n : off+n]
}

// Memory is the descriptor of layer group g of this rank's KV memory:
// Start's copy of Config.Memory[g], or the pool's own layout
// (kvcache.PoolMemory) when Config.Memory is not set; nil for a group the
// rank holds no layer of. It is a copy, deep: the caller may change it
// without changing the engine's, which plans requests and BlockTensor.
func (e *Engine) Memory(g int) *kvcache.KVMemory {
	if !e.started() || g < 0 || g >= len(e.memory) || e.memory[g] == nil {
		return nil
	}
	return cloneMemory(e.memory[g : g+1])[0]
}

// engineMemory is the descriptor of every group: Config.Memory, or the
// pools' own layout.
func engineMemory(r resolved, geoms []kvcache.PoolGeometry) []*kvcache.KVMemory {
	if r.Memory != nil {
		return r.Memory
	}
	out := make([]*kvcache.KVMemory, len(geoms))
	for g, geo := range geoms {
		if len(r.shape.Layers[g]) == 0 {
			continue
		}
		if m, err := kvcache.PoolMemory(r.layout, r.shape, g, geo); err == nil {
			out[g] = m
		}
	}
	return out
}

// LayoutShape is the layout c runs (its Layout or Model preset, with its
// TokensPerBlock override) and the shape its rank holds of it (Parallel
// defaulting to 1×1): what a framework needs to lay out Config.Memory
// before Start. Errors wrap ErrConfig and name the value.
func (c Config) LayoutShape() (kvcache.Layout, kvcache.Shape, error) {
	var l kvcache.Layout
	switch {
	case c.Layout != nil:
		l = c.Layout.Clone()
	case c.Model != "":
		var err error
		if l, err = kvcache.Preset(c.Model); err != nil {
			return l, kvcache.Shape{}, fmt.Errorf("%w: Model: %w", ErrConfig, err)
		}
	default:
		return l, kvcache.Shape{}, fmt.Errorf("%w: neither Model nor Layout set", ErrConfig)
	}
	if c.TokensPerBlock > 0 {
		l = l.WithTokensPerBlock(c.TokensPerBlock)
	}
	if err := l.Validate(); err != nil {
		return l, kvcache.Shape{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := checkDTypeBytes(l); err != nil {
		return l, kvcache.Shape{}, err
	}
	par := c.Parallel
	if par.TP == 0 && par.PP == 0 {
		par = kvcache.Parallel{TP: 1, PP: 1}
	}
	if err := par.Validate(l); err != nil {
		return l, kvcache.Shape{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if !par.Contains(c.Rank) {
		return l, kvcache.Shape{}, fmt.Errorf("%w: Rank %v outside %v", ErrConfig, c.Rank, par)
	}
	s, err := l.Shape(par, c.Rank)
	if err != nil {
		return l, kvcache.Shape{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return l, s, nil
}
