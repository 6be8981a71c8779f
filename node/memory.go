package node

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Memory lays the framework's KV tensors out inside the node's pool, the
// memory its backend lets peers write (JSON "memory"): one tensor per layer
// the rank holds, back to back from pool offset 0 in ascending layer order,
// each Kind-shaped with NumBlocks blocks:
//
//   - "nhd": vLLM's [2, num_blocks, block_size, kv_heads, head_dim];
//   - "hnd": [2, num_blocks, kv_heads, block_size, head_dim];
//   - "split_kv": a K tensor then a V tensor, each [num_blocks, block_size,
//     kv_heads, head_dim];
//   - "mla": [num_blocks, block_size, latent].
//
// The framework builds its tensors over those bytes (Node.Engine().Memory
// gives each group's descriptor, Engine.BlockTensor a block's bytes), block
// ids are its own, and peers plan into the layout (it travels in the
// Hello). PoolBytes, when set, must hold the tensors; zero sizes the pool
// to them.
type Memory struct {
	Kind      string `json:"kind"`
	NumBlocks int    `json:"num_blocks"`
}

// layout returns the descriptors of m for cfg's rank over a region of
// regionLen bytes (0: only the bytes needed), and the bytes needed.
func (m *Memory) layout(cfg kvxfer.Config, regionLen uint64) ([]*kvcache.KVMemory, uint64, error) {
	l, s, err := cfg.LayoutShape()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: memory: %w", ErrConfig, err)
	}
	if m.NumBlocks < 1 || m.NumBlocks > math.MaxInt32 {
		return nil, 0, fmt.Errorf("%w: memory.num_blocks = %d, must be ≥ 1", ErrConfig, m.NumBlocks)
	}
	block := uint64(l.TokensPerBlock) * uint64(s.Heads()) * uint64(l.HeadDim) * uint64(l.DTypeBytes)
	part := block * uint64(m.NumBlocks)
	var need uint64
	for g := range l.Groups {
		need += uint64(len(s.Layers[g])) * uint64(l.Parts()) * part
	}
	if regionLen == 0 {
		regionLen = need
	}
	if need > regionLen {
		return nil, need, fmt.Errorf("%w: memory: %d %s blocks of every layer need %d bytes, pool_bytes is %d",
			ErrConfig, m.NumBlocks, m.Kind, need, regionLen)
	}
	out := make([]*kvcache.KVMemory, len(l.Groups))
	for g := range l.Groups {
		n := len(s.Layers[g])
		if n == 0 {
			continue
		}
		offs := make([]uint64, n)
		var voffs []uint64
		for i, L := range s.Layers[g] {
			// Ascending layer order over the stage's layers, whichever
			// group each is in: layer L's tensor is the (L-LayerLo)-th.
			off := uint64(L-s.LayerLo) * uint64(l.Parts()) * part
			offs[i] = off
			if m.Kind == "split_kv" {
				voffs = append(voffs, off+part)
			}
		}
		if !slices.Contains(kvcache.FrameworkKinds, m.Kind) {
			return nil, need, fmt.Errorf("%w: memory.kind = %q, want %s", ErrConfig, m.Kind, strings.Join(kvcache.FrameworkKinds, ", "))
		}
		d, err := kvcache.FrameworkMemory(m.Kind, l, s, g, m.NumBlocks, offs, voffs, regionLen)
		if err != nil {
			return nil, need, fmt.Errorf("%w: memory of group %d: %w", ErrConfig, g, err)
		}
		out[g] = d
	}
	return out, need, nil
}
