package actors

import (
	"slices"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// helloMemory is what a Hello says of this rank's descriptors
// (Topology.Memory): one entry per described layer group, ascending.
func helloMemory(mem []*kvcache.KVMemory) []messages.KVMemory {
	var out []messages.KVMemory
	for g, m := range mem {
		if m == nil {
			continue
		}
		layers := make([]int32, len(m.Layers))
		for i, L := range m.Layers {
			layers[i] = int32(L)
		}
		base := make([]uint64, 0, len(m.Layers)*m.Parts)
		for _, b := range m.Base {
			base = append(base, b...)
		}
		out = append(out, messages.KVMemory{Group: int32(g), Kind: uint32(m.Kind), Layers: layers,
			HeadLo: int32(m.HeadLo), Heads: int32(m.Heads), Parts: int32(m.Parts), HeadDim: int32(m.HeadDim),
			ElemBytes: int32(m.ElemBytes), TokensPerBlock: int32(m.TokensPerBlock), Blocks: int32(m.Blocks),
			Base: base, BlockStride: m.BlockStride, TokenStride: m.TokenStride, HeadStride: m.HeadStride,
			ElemStride: m.ElemStride})
	}
	return out
}

// peerMemory is a Hello's descriptor of layer group g, or nil when the
// peer's group g is its pool.
func peerMemory(hello *messages.Hello, g int) *messages.KVMemory {
	for i := range hello.Memory {
		if int(hello.Memory[i].Group) == g {
			return &hello.Memory[i]
		}
	}
	return nil
}

// kvMemory converts a peer's descriptor into kvcache's, its offsets
// relative to a region of regionLen bytes. The result is not validated;
// NewMemoryPlan validates it. A Base list that does not hold one offset
// per (layer, part) (which messages.Hello.Validate refuses) converts to a
// short Base that Validate refuses.
func kvMemory(m *messages.KVMemory, regionLen uint64) *kvcache.KVMemory {
	out := &kvcache.KVMemory{Kind: kvcache.MemoryKind(m.Kind), Layers: make([]int, len(m.Layers)),
		HeadLo: int(m.HeadLo), Heads: int(m.Heads), Parts: int(m.Parts), HeadDim: int(m.HeadDim),
		ElemBytes: int(m.ElemBytes), TokensPerBlock: int(m.TokensPerBlock), Blocks: int(m.Blocks),
		BlockStride: m.BlockStride, TokenStride: m.TokenStride, HeadStride: m.HeadStride, ElemStride: m.ElemStride,
		RegionLen: regionLen}
	for i, L := range m.Layers {
		out.Layers[i] = int(L)
	}
	if p := int(m.Parts); p > 0 && len(m.Base) == p*len(m.Layers) {
		out.Base = make([][]uint64, len(m.Layers))
		for i := range out.Base {
			out.Base[i] = slices.Clone(m.Base[i*p : (i+1)*p])
		}
	}
	return out
}

// sameMemory reports whether two descriptors say the same thing.
func sameMemory(a, b *messages.KVMemory) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Group == b.Group && a.Kind == b.Kind && slices.Equal(a.Layers, b.Layers) && a.HeadLo == b.HeadLo &&
		a.Heads == b.Heads && a.Parts == b.Parts && a.HeadDim == b.HeadDim && a.ElemBytes == b.ElemBytes &&
		a.TokensPerBlock == b.TokensPerBlock && a.Blocks == b.Blocks && slices.Equal(a.Base, b.Base) &&
		a.BlockStride == b.BlockStride && a.TokenStride == b.TokenStride && a.HeadStride == b.HeadStride &&
		a.ElemStride == b.ElemStride
}
