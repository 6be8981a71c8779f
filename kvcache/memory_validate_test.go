package kvcache

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"testing"
)

// interleavedMemory is the descriptor a hostile peer can send within the
// wire limits (layers up to 4096): layers × 2 parts, the tensors one byte
// apart, each a sparse footprint of headDim one-byte elements 8192 bytes
// apart, so that every two tensors' extents overlap.
func interleavedMemory(layers, headDim int) *KVMemory {
	const parts, stride = 2, 8192
	m := &KVMemory{Layers: make([]int, layers), Heads: 1, Parts: parts, HeadDim: headDim, ElemBytes: 1,
		TokensPerBlock: 1, Blocks: 1, Base: make([][]uint64, layers),
		BlockStride: 1 << 30, TokenStride: 1 << 30, HeadStride: 1 << 30, ElemStride: stride,
		RegionLen: uint64(layers*parts) + uint64(headDim)*stride + 1<<20}
	for i := range layers {
		m.Layers[i] = i
		m.Base[i] = []uint64{uint64(i * parts), uint64(i*parts + 1)}
	}
	return m
}

// TestValidateRefusesInterleavedExtents: a peer's descriptor whose 8192
// tensors all interleave is refused, naming the tensor count, instead of
// being checked pair by pair (hours for the widest head).
func TestValidateRefusesInterleavedExtents(t *testing.T) {
	for _, dim := range []int{2, 8, 64, MaxHeadDim} {
		err := interleavedMemory(4096, dim).Validate()
		if !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "interleave") ||
			!strings.Contains(err.Error(), "8192 tensors") {
			t.Fatalf("head dim %d: Validate = %v, want ErrBadMemory naming 8192 interleaving tensors", dim, err)
		}
	}
}

// TestValidateRefusesSparseInterleavedFootprints: fewer interleaving
// tensors, but each footprint so wide that comparing them for every shift
// is too much work, are refused naming the footprint.
func TestValidateRefusesSparseInterleavedFootprints(t *testing.T) {
	err := interleavedMemory(128, MaxHeadDim).Validate()
	if !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "interleave") ||
		!strings.Contains(err.Error(), "256 tensors of 65536 ranges per block") {
		t.Fatalf("Validate = %v, want ErrBadMemory naming 256 tensors of 65536 ranges", err)
	}
}

// TestValidateOverlapWorkBounded: the work of the overlap check stays under
// its bound for interleaved descriptors of every size, refused or not, and
// is small for a group pool (every tensor interleaving every other) of a
// real model.
func TestValidateOverlapWorkBounded(t *testing.T) {
	work := func(m *KVMemory) (int, error) {
		t.Helper()
		fp, err := m.blockFootprint()
		if err != nil {
			t.Fatal(err)
		}
		var ts []tensorExtent
		for i := range m.Layers {
			for p, base := range m.Base[i] {
				ts = append(ts, tensorExtent{i, p, base, base + uint64(m.Blocks-1)*m.BlockStride + fp[len(fp)-1].hi})
			}
		}
		w, err := m.checkDisjoint(ts, fp, fp[len(fp)-1].hi)
		if bound := maxInterleavedPairs + maxOverlapSteps + len(ts)*bits.Len(uint(len(ts))); w > bound {
			t.Fatalf("%d tensors, footprint of %d ranges: work %d, more than %d", len(ts), len(fp), w, bound)
		}
		return w, err
	}
	for _, layers := range []int{1, 2, 64, 128, 362, 4096} {
		for _, dim := range []int{1, 2, 8, 64, 1024, MaxHeadDim} {
			m := interleavedMemory(layers, dim)
			_, err := work(m)
			if err2 := m.Validate(); (err == nil) != (err2 == nil) {
				t.Fatalf("%d layers, head dim %d: checkDisjoint = %v but Validate = %v", layers, dim, err, err2)
			}
		}
	}
	l := Layout{Name: "pool-128", Layers: 128, KVHeads: 8, HeadDim: 128, DTypeBytes: 2,
		TokensPerBlock: 16, Groups: FullAttention(128)}
	s := Shape{Layers: [][]int{l.Groups[0].Layers}, HeadHi: 8, LayerHi: 128}
	m := packedMemory(t, MemGroupPool, l, s, 0, 64, 4096, 64)
	if w, err := work(m); err != nil || w > 1<<16 {
		t.Fatalf("128-layer group pool: work %d, error %v", w, err)
	}
}

// BenchmarkMemoryValidate validates descriptors of all 80 layers of
// Llama-3.1-70B at TP1 (4096 blocks), in each framework layout (the group
// pool's 160 tensors all interleave), and the hostile interleaved
// descriptor of TestValidateRefusesInterleavedExtents.
func BenchmarkMemoryValidate(b *testing.B) {
	l := benchLlama70B()
	n := l.BlocksFor(memBenchTokens)
	pm, err := NewPeerMap(l, Parallel{TP: 1, PP: 1}, Parallel{TP: 1, PP: 1})
	if err != nil {
		b.Fatal(err)
	}
	cs, _ := pm.CtxShape(pm.From(Rank{})[0].Ctx)
	for _, kind := range []MemoryKind{MemNHD, MemHND, MemSplitKV, MemGroupPool} {
		b.Run(kind.String(), func(b *testing.B) {
			m := packedMemory(b, kind, l, cs, 0, n, 0, 0)
			for b.Loop() {
				if err := m.Validate(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, dim := range []int{2, MaxHeadDim} {
		b.Run(fmt.Sprintf("interleaved/dim%d", dim), func(b *testing.B) {
			if dim > 2 && testing.Short() {
				b.Skip("hours before the work bound")
			}
			m := interleavedMemory(4096, dim)
			for b.Loop() {
				_ = m.Validate()
			}
		})
	}
}
