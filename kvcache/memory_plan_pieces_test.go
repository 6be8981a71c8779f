package kvcache

import (
	"errors"
	"strings"
	"testing"
)

// padded scales every offset of m by k: the same tensors with k-1 elements'
// worth of holes after each element (ElemStride k × ElemBytes).
func padded(m *KVMemory, k uint64) *KVMemory {
	p := *m
	p.ElemStride *= k
	p.TokenStride *= k
	p.HeadStride *= k
	p.BlockStride *= k
	p.RegionLen *= k
	p.Base = make([][]uint64, len(m.Base))
	for i, parts := range m.Base {
		for _, b := range parts {
			p.Base[i] = append(p.Base[i], b*k)
		}
	}
	return &p
}

// TestMemoryPlanRefusesElementPieces: a peer's descriptor that pads its
// elements (ElemStride > ElemBytes, one field of its Hello) made the plan
// one piece per element — about 2 M pieces a block of Llama-3.1-8B, ~770 MB
// of segments for one 512-token chunk — before it was bounded: a plan of
// more than maxSmallPieces pieces a block averaging under minPieceBytes is
// refused, naming both sides, before the pieces are built. Small test
// layouts, and real ones (a piece is at least a head vector), still plan.
func TestMemoryPlanRefusesElementPieces(t *testing.T) {
	l, err := Preset("Llama-3.1-8B")
	if err != nil {
		t.Fatal(err)
	}
	pm, err := NewPeerMap(l, Parallel{TP: 1, PP: 1}, Parallel{TP: 1, PP: 1})
	if err != nil {
		t.Fatal(err)
	}
	link := pm.Links()[0]
	cs, _ := pm.CtxShape(link.Ctx)
	gs, _ := pm.GenShape(link.Gen)
	src := packedMemory(t, MemNHD, l, cs, 0, 2, 0, 0)
	dst := packedMemory(t, MemHND, l, gs, 0, 2, 0, 0)
	if _, err := NewMemoryPlan(link, 0, src, dst); err != nil {
		t.Fatalf("NHD to HND, Llama-3.1-8B: %v", err)
	}
	bad := padded(dst, 2)
	if err := bad.Validate(); err != nil {
		t.Fatalf("the padded descriptor is a valid one: %v", err)
	}
	_, err = NewMemoryPlan(link, 0, src, bad)
	if !errors.Is(err, ErrBadPlan) || !errors.Is(err, ErrBadMemory) {
		t.Fatalf("padded destination: err = %v, want ErrBadPlan and ErrBadMemory", err)
	}
	for _, want := range []string{"element stride 4", "pieces a block", "bytes on average"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %q", err, want)
		}
	}
	// A small layout padded the same way still plans (few pieces).
	sl := testDense(2, 4, nil)
	spm, _ := NewPeerMap(sl, Parallel{TP: 1, PP: 1}, Parallel{TP: 1, PP: 1})
	slink := spm.Links()[0]
	scs, _ := spm.CtxShape(slink.Ctx)
	sgs, _ := spm.GenShape(slink.Gen)
	if _, err := NewMemoryPlan(slink, 0, packedMemory(t, MemNHD, sl, scs, 0, 4, 0, 0),
		padded(packedMemory(t, MemHND, sl, sgs, 0, 4, 0, 0), 2)); err != nil {
		t.Fatalf("a small padded layout: %v", err)
	}
}
