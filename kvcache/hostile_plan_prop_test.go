package kvcache

import (
	"errors"
	"testing"

	"pgregory.net/rapid"
)

// TestPropertyHostileDestinationPlanStaysInRegions draws a valid source
// memory and a destination descriptor as a peer might send it: the link's
// shape, but random strides, bases, block count and region length (small
// enough to map every byte). NewMemoryPlan either refuses it with an
// ErrBadPlan, or every segment it emits for valid block ids lies inside
// both regions, no destination byte is written twice, and the bytes land
// exactly where an element-by-element copy puts them.
func TestPropertyHostileDestinationPlanStaysInRegions(t *testing.T) {
	accepted := 0
	rapid.Check(t, func(t *rapid.T) {
		s := drawPlanScenario(t)
		l := s.l
		pm, err := NewPeerMap(l, s.ctx, s.gen)
		if err != nil {
			t.Fatal(err)
		}
		links := pm.Links()
		link := links[rapid.IntRange(0, len(links)-1).Draw(t, "link")]
		g := rapid.IntRange(0, len(l.Groups)-1).Draw(t, "group")
		cs, _ := pm.CtxShape(link.Ctx)
		gs, _ := pm.GenShape(link.Gen)
		srcPool := rapid.IntRange(1, 5).Draw(t, "srcPool")
		src := drawMemory(t, l, cs, g, srcPool, "src")

		small := func(label string, hi int) uint64 { return uint64(rapid.IntRange(0, hi).Draw(t, label)) }
		dst := &KVMemory{Kind: MemStrided, Layers: append([]int(nil), gs.Layers[g]...), HeadLo: gs.HeadLo,
			Heads: gs.Heads(), Parts: l.Parts(), HeadDim: l.HeadDim, ElemBytes: l.DTypeBytes,
			TokensPerBlock: l.TokensPerBlock, Blocks: rapid.IntRange(0, 4).Draw(t, "dstBlocks")}
		dst.ElemStride = uint64(dst.ElemBytes) + small("elemPad", 2)
		dst.TokenStride = small("tokenStride", 64)
		dst.HeadStride = small("headStride", 64)
		dst.BlockStride = small("blockStride", 512)
		dst.Base = make([][]uint64, len(dst.Layers))
		for i := range dst.Base {
			for range dst.Parts {
				dst.Base[i] = append(dst.Base[i], small("base", 2048))
			}
		}
		dst.RegionLen = small("regionLen", 4096)

		p, err := NewMemoryPlan(link, g, src, dst)
		if err != nil {
			if !errors.Is(err, ErrBadPlan) {
				t.Fatalf("NewMemoryPlan = %v, not ErrBadPlan", err)
			}
			return
		}
		accepted++
		n := rapid.IntRange(0, dst.Blocks).Draw(t, "n")
		sids := make([]BlockID, n)
		for i := range sids {
			sids[i] = BlockID(rapid.IntRange(0, srcPool-1).Draw(t, "sid"))
		}
		dids := rapid.Permutation(idRange(0, dst.Blocks)).Draw(t, "dids")[:n]
		segs, err := p.Append(nil, sids, dids)
		if err != nil {
			t.Fatal(err)
		}
		sbuf := make([]byte, src.RegionLen)
		garbage(sbuf, 1)
		fillMemory(src, sbuf, idRange(0, srcPool), 0)
		got, want := make([]byte, dst.RegionLen), make([]byte, dst.RegionLen)
		garbage(got, 2)
		copy(want, got)
		e := uint64(l.DTypeBytes)
		var srcOff []uint64
		eachElement(src, sids, 0, link.Layers[g], link.HeadLo, link.HeadHi, func(off uint64, _, _, _, _, _ int) {
			srcOff = append(srcOff, off)
		})
		k := 0
		eachElement(dst, dids, 0, link.Layers[g], link.HeadLo, link.HeadHi, func(off uint64, _, _, _, _, _ int) {
			copy(want[off:off+e], sbuf[srcOff[k]:srcOff[k]+e])
			k++
		})
		count := make([]uint8, len(got))
		moved := execute(t, segs, sbuf, got, count) // fails on a segment outside either region
		for i, c := range count {
			if c > 1 {
				t.Fatalf("destination byte %d written %d times", i, c)
			}
		}
		if moved != p.Bytes(n) || moved != uint64(k)*e {
			t.Fatalf("segments move %d bytes; Bytes says %d, the link carries %d", moved, p.Bytes(n), uint64(k)*e)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("destination byte %d = %#x, element copy gives %#x", i, got[i], want[i])
			}
		}
	})
	t.Logf("%d hostile descriptors accepted", accepted)
}

// TestPropertyHostilePoolGeometryPlanStaysInPool draws a destination pool
// geometry as a peer's Hello might carry it (any offset, block stride and
// block count, huge ones included): NewPlan either refuses it with an
// ErrBadPlan, or every segment Append emits for ids inside the pool lies
// inside that pool on the destination side and inside the source pool,
// and the plan moves what the link says each block carries.
func TestPropertyHostilePoolGeometryPlanStaysInPool(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawPlanScenario(t)
		l := s.l
		pm, err := NewPeerMap(l, s.ctx, s.gen)
		if err != nil {
			t.Fatal(err)
		}
		links := pm.Links()
		link := links[rapid.IntRange(0, len(links)-1).Draw(t, "link")]
		g := rapid.IntRange(0, len(l.Groups)-1).Draw(t, "group")
		cs, _ := pm.CtxShape(link.Ctx)
		src := PoolGeometry{Offset: 64, BlockBytes: cs.BlockBytes(l, g), Blocks: 4}
		huge := func(label string) uint64 {
			switch rapid.IntRange(0, 3).Draw(t, label+"Kind") {
			case 0:
				return ^uint64(0) - uint64(rapid.IntRange(0, 1000).Draw(t, label+"Top"))
			case 1:
				return uint64(1) << rapid.IntRange(32, 63).Draw(t, label+"Shift")
			}
			return uint64(rapid.IntRange(0, 4096).Draw(t, label))
		}
		dst := PoolGeometry{Offset: huge("offset"), BlockBytes: huge("blockBytes"), Blocks: rapid.IntRange(-2, 1<<20).Draw(t, "blocks")}
		if rapid.Bool().Draw(t, "manyBlocks") {
			dst.Blocks = int(huge("manyBlocks") >> 1)
		}
		p, err := pm.Plan(link, g, src, dst)
		if err != nil {
			if !errors.Is(err, ErrBadPlan) {
				t.Fatalf("Plan = %v, not ErrBadPlan", err)
			}
			return
		}
		n := rapid.IntRange(0, min(dst.Blocks, 4)).Draw(t, "n")
		sids, dids := make([]BlockID, n), make([]BlockID, n)
		for i := range n {
			sids[i] = BlockID(rapid.IntRange(0, src.Blocks-1).Draw(t, "sid"))
			dids[i] = BlockID(rapid.IntRange(0, min(dst.Blocks, 1<<31-1)-1).Draw(t, "did"))
		}
		segs, err := p.Append(nil, sids, dids)
		if err != nil {
			t.Fatal(err)
		}
		srcEnd := src.Offset + uint64(src.Blocks)*src.BlockBytes
		dstEnd := dst.Offset + uint64(dst.Blocks)*dst.BlockBytes // NewPlan refused a pool that overflows
		var total uint64
		for _, sg := range segs {
			se, de := sg.Src+sg.Len, sg.Dst+sg.Len
			if sg.Len == 0 || se < sg.Src || de < sg.Dst || sg.Src < src.Offset || se > srcEnd || sg.Dst < dst.Offset || de > dstEnd {
				t.Fatalf("segment %+v outside source pool [%d,%d) or destination pool [%d,%d)",
					sg, src.Offset, srcEnd, dst.Offset, dstEnd)
			}
			total += sg.Len
		}
		if total != p.Bytes(n) {
			t.Fatalf("segments move %d bytes, Bytes says %d", total, p.Bytes(n))
		}
		if got := p.BytesPerBlock(); got != link.BytesPerBlock(l, g) {
			t.Fatalf("plan moves %d bytes a block, the link says %d", got, link.BytesPerBlock(l, g))
		}
	})
}
