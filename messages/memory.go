package messages

import "github.com/kvxfer/kvxfer/messages/pb"

// Bounds on a Hello's memory descriptors (KVMemory). They mirror kvcache's
// layout limits, which this package does not import; the writer validates
// a descriptor fully (overlap, strides, region) before it plans into it.
const (
	MaxMemoryLayers    = 4096
	MaxMemoryHeads     = 4096
	MaxMemoryHeadDim   = 65536
	MaxMemoryElemBytes = 16
	MaxMemoryTPB       = 65536
)

// KVMemory describes one layer group's KV memory on the sender's rank as
// its serving framework lays it out (kvcache.KVMemory on the wire): element
// (Layers[i], part p, block b, token t, local head h, element e) lies at
// region offset
//
//	Base[i*Parts+p] + b*BlockStride + t*TokenStride + h*HeadStride + e*ElemStride
//
// of the Hello's Region. Validate bounds every count and size and checks
// that Base has one offset per (layer, part); whether the strides place
// the elements without overlap inside the region is the writer's check,
// before it plans.
type KVMemory struct {
	// Group is the layer group described.
	Group int32
	// Kind is informational (kvcache.MemoryKind).
	Kind uint32
	// Layers are the global layers held, strictly ascending.
	Layers                                   []int32
	HeadLo, Heads, Parts, HeadDim, ElemBytes int32
	TokensPerBlock, Blocks                   int32
	// Base holds Parts offsets per layer, layer-major.
	Base                                             []uint64
	BlockStride, TokenStride, HeadStride, ElemStride uint64
}

// validate bounds m, descriptor i of a Hello from a sender with pools
// layer groups; errors name the sender, the group and the value.
func (m *KVMemory) validate(from PeerID, i, pools int, prev int32) error {
	if m.Group < 0 || int(m.Group) >= pools || (i > 0 && m.Group <= prev) {
		return invalid("hello from %s: memory[%d] names group %d, want strictly ascending groups in 0..%d",
			from, i, m.Group, pools-1)
	}
	for _, f := range []struct {
		name          string
		val, min, max int32
	}{
		{"head_lo", m.HeadLo, 0, MaxMemoryHeads - 1}, {"heads", m.Heads, 1, MaxMemoryHeads},
		{"parts", m.Parts, 1, 2}, {"head_dim", m.HeadDim, 1, MaxMemoryHeadDim},
		{"elem_bytes", m.ElemBytes, 1, MaxMemoryElemBytes}, {"tokens_per_block", m.TokensPerBlock, 1, MaxMemoryTPB},
		{"blocks", m.Blocks, 0, MaxBlocks},
	} {
		if f.val < f.min || f.val > f.max {
			return invalid("hello from %s: memory of group %d: %s = %d, want %d..%d",
				from, m.Group, f.name, f.val, f.min, f.max)
		}
	}
	if m.Kind > 255 {
		return invalid("hello from %s: memory of group %d: kind %d, want 0..255", from, m.Group, m.Kind)
	}
	if len(m.Layers) > MaxMemoryLayers {
		return invalid("hello from %s: memory of group %d: %d layers, want at most %d",
			from, m.Group, len(m.Layers), MaxMemoryLayers)
	}
	for j, L := range m.Layers {
		if L < 0 || (j > 0 && L <= m.Layers[j-1]) {
			return invalid("hello from %s: memory of group %d: layers[%d] = %d, want ≥ 0 and strictly ascending",
				from, m.Group, j, L)
		}
	}
	if len(m.Base) != len(m.Layers)*int(m.Parts) {
		return invalid("hello from %s: memory of group %d: %d base offsets for %d layers × %d parts",
			from, m.Group, len(m.Base), len(m.Layers), m.Parts)
	}
	return nil
}

// validateMemory bounds a Hello's descriptors: at most one per pool, in
// ascending group order, each bounded.
func (m *Hello) validateMemory() error {
	if len(m.Memory) > len(m.Pools) {
		return invalid("hello from %s: %d memory descriptors for %d layer groups", m.From, len(m.Memory), len(m.Pools))
	}
	var prev int32
	for i := range m.Memory {
		d := &m.Memory[i]
		if err := d.validate(m.From, i, len(m.Pools), prev); err != nil {
			return err
		}
		prev = d.Group
	}
	return nil
}

func memoryToWire(ms []KVMemory) []*pb.KVMemory {
	if len(ms) == 0 {
		return nil
	}
	out := make([]*pb.KVMemory, len(ms))
	for i, m := range ms {
		out[i] = &pb.KVMemory{Group: m.Group, Kind: m.Kind, Layers: m.Layers, HeadLo: m.HeadLo, Heads: m.Heads,
			Parts: m.Parts, HeadDim: m.HeadDim, ElemBytes: m.ElemBytes, TokensPerBlock: m.TokensPerBlock,
			Blocks: m.Blocks, Base: m.Base, BlockStride: m.BlockStride, TokenStride: m.TokenStride,
			HeadStride: m.HeadStride, ElemStride: m.ElemStride}
	}
	return out
}

// memoryFromWire converts decoded descriptors; the decoded message is ours
// alone, so its slices are aliased.
func memoryFromWire(ms []*pb.KVMemory) []KVMemory {
	if len(ms) == 0 {
		return nil
	}
	out := make([]KVMemory, len(ms))
	for i, m := range ms {
		out[i] = KVMemory{Group: m.GetGroup(), Kind: m.GetKind(), Layers: nonEmpty(m.GetLayers()), HeadLo: m.GetHeadLo(),
			Heads: m.GetHeads(), Parts: m.GetParts(), HeadDim: m.GetHeadDim(), ElemBytes: m.GetElemBytes(),
			TokensPerBlock: m.GetTokensPerBlock(), Blocks: m.GetBlocks(), Base: nonEmpty(m.GetBase()),
			BlockStride: m.GetBlockStride(), TokenStride: m.GetTokenStride(), HeadStride: m.GetHeadStride(),
			ElemStride: m.GetElemStride()}
	}
	return out
}
