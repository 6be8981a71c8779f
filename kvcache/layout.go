package kvcache

// Layout describes a model's KV cache as one rank of one instance sees it
// before parallelism is applied: the whole model, all heads, all layers.
// Rank-local shapes come from Shape.
type Layout struct {
	// Name is informational (a preset name); it is part of Hash.
	Name string
	// Layers is the number of attention layers.
	Layers int
	// KVHeads is the number of KV heads per layer (1 for MLA).
	KVHeads int
	// HeadDim is the number of elements per head per token.
	HeadDim int
	// DTypeBytes is the size of one element (2 for bf16).
	DTypeBytes int
	// TokensPerBlock is the number of tokens one block holds.
	TokensPerBlock int
	// MLA marks a latent-attention layout (DeepSeek-V3): one latent "head"
	// with a single part (no separate K and V), replicated across TP ranks
	// rather than split.
	MLA bool
	// Groups partitions the layers into layer groups. Every layer belongs to
	// exactly one group. A layout with no groups is invalid; FullAttention
	// builds the common single-group case.
	Groups []LayerGroup
}

// LayerGroup is a set of layers that share an attention window and
// therefore a block table.
type LayerGroup struct {
	// Name is informational ("full", "swa-1024").
	Name string
	// Layers are global layer indices, strictly ascending.
	Layers []int
	// Window is the attention window in tokens; 0 means full attention.
	Window int
}

// Parts is the number of per-head tensors per layer: 2 (K and V), or 1 for MLA.
func (l Layout) Parts() int {
	if l.MLA {
		return 1
	}
	return 2
}

// TokenBytes is the size of one token's KV for one head of one layer part.
func (l Layout) TokenBytes() int { return l.HeadDim * l.DTypeBytes }

// BytesPerTokenPerLayer is Parts × KVHeads × HeadDim × DTypeBytes.
func (l Layout) BytesPerTokenPerLayer() int {
	return l.Parts() * l.KVHeads * l.HeadDim * l.DTypeBytes
}

// BytesPerToken is the KV size of one token across all layers.
func (l Layout) BytesPerToken() int { return l.BytesPerTokenPerLayer() * l.Layers }

// BlockBytes is the size of one whole-model block of group g
// (all heads, all of the group's layers).
func (l Layout) BlockBytes(g int) int {
	return len(l.Groups[g].Layers) * l.BytesPerTokenPerLayer() * l.TokensPerBlock
}

// BlocksFor is the number of blocks that hold n tokens (rounded up).
func (l Layout) BlocksFor(n int) int {
	return (n + l.TokensPerBlock - 1) / l.TokensPerBlock
}

// FullAttention returns the single group of layers 0..layers-1 with no window.
func FullAttention(layers int) []LayerGroup {
	return []LayerGroup{{Name: "full", Layers: LayerRange(0, layers), Window: 0}}
}

// LayerRange returns [lo, hi) as a slice of layer indices.
func LayerRange(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}
