package kvcache

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// memRank is one rank's memory for one group: descriptor, bytes, the
// request's blocks, and (destination) writes per byte.
type memRank struct {
	m     *KVMemory
	buf   []byte
	run   BlockRun
	count []uint8
}

// transferAll plans and executes every link of pm for group g, chunk c,
// between the ranks' memories, checking Count, Bytes and maximality.
func transferAll(t testing.TB, pm *PeerMap, g int, c Chunk, ctx, gen []*memRank) {
	t.Helper()
	for _, link := range pm.Links() {
		sp, dp := ctx[pm.Ctx().Index(link.Ctx)], gen[pm.Gen().Index(link.Gen)]
		sids, dids, err := Project(c, sp.m.TokensPerBlock, sp.run, dp.run)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewMemoryPlan(link, g, sp.m, dp.m)
		if err != nil {
			t.Fatal(err)
		}
		segs, err := p.Append(nil, sids, dids)
		if err != nil {
			t.Fatal(err)
		}
		checkMaximal(t, segs)
		if n, err := p.Count(sids, dids); err != nil || n != len(segs) {
			t.Fatalf("link %v->%v: Count = %d, %v; Append gave %d", link.Ctx, link.Gen, n, err, len(segs))
		}
		if moved := execute(t, segs, sp.buf, dp.buf, dp.count); moved != p.Bytes(len(sids)) ||
			moved != uint64(len(sids))*link.BytesPerBlock(pm.Layout(), g) {
			t.Fatalf("link %v->%v: segments move %d bytes, Bytes %d, link %d per block × %d",
				link.Ctx, link.Gen, moved, p.Bytes(len(sids)), link.BytesPerBlock(pm.Layout(), g), len(sids))
		}
	}
}

// verifyGen checks that every element of every destination block of gen
// rank r holds its pattern and was written exactly once, and that nothing
// else in the region was written.
func verifyGen(t testing.TB, r Rank, rp *memRank) {
	t.Helper()
	needed := make([]bool, len(rp.buf))
	e := rp.m.ElemBytes
	eachElement(rp.m, rp.run.IDs, rp.run.First, rp.m.Layers, rp.m.HeadLo, rp.m.HeadLo+rp.m.Heads,
		func(off uint64, layer, part, head, token, elem int) {
			for b := range e {
				o := off + uint64(b)
				needed[o] = true
				if rp.count[o] != 1 {
					t.Fatalf("gen %v: layer %d part %d head %d token %d elem %d byte %d written %d times",
						r, layer, part, head, token, elem, b, rp.count[o])
				}
				if want := kvByte(layer, part, head, token, elem*e+b); rp.buf[o] != want {
					t.Fatalf("gen %v: layer %d part %d head %d token %d elem %d byte %d = %#x, want %#x",
						r, layer, part, head, token, elem, b, rp.buf[o], want)
				}
			}
		})
	for off, c := range rp.count {
		if !needed[off] && c != 0 {
			t.Fatalf("gen %v: byte %d outside the needed elements written %d times", r, off, c)
		}
	}
}

// TestMemoryPlanBytes moves a 5-block request between every pair of memory
// kinds (same layout and cross layout) at TP1→TP1, TP2→TP1 (gather heads)
// and TP1→TP2 (split heads), with block ids that are partly consecutive,
// and checks every destination byte.
func TestMemoryPlanBytes(t *testing.T) {
	dense := testDense(3, 4, nil)
	dense.TokensPerBlock = 3
	mla := testMLA(3)
	denseKinds := []MemoryKind{MemNHD, MemHND, MemSplitKV, MemGroupPool}
	mlaKinds := []MemoryKind{MemMLA, MemGroupPool}
	tps := [][2]int{{1, 1}, {2, 1}, {1, 2}}
	srcIDs := []BlockID{2, 3, 4, 0, 6} // pool of 8
	dstIDs := []BlockID{5, 6, 1, 2, 3} // pool of 7
	for _, lc := range []struct {
		l     Layout
		kinds []MemoryKind
	}{{dense, denseKinds}, {mla, mlaKinds}} {
		for _, sk := range lc.kinds {
			for _, dk := range lc.kinds {
				for _, tp := range tps {
					name := fmt.Sprintf("%s/%v-%v/TP%d-TP%d", lc.l.Name, sk, dk, tp[0], tp[1])
					t.Run(name, func(t *testing.T) {
						pm, err := NewPeerMap(lc.l, Parallel{TP: tp[0], PP: 1}, Parallel{TP: tp[1], PP: 1})
						if err != nil {
							t.Fatal(err)
						}
						ctx := make([]*memRank, tp[0])
						for i := range ctx {
							s, _ := pm.CtxShape(pm.Ctx().RankAt(i))
							m := packedMemory(t, sk, lc.l, s, 0, 8, 7, 3)
							rp := &memRank{m: m, buf: make([]byte, m.RegionLen+5), run: BlockRun{First: 0, IDs: srcIDs}}
							garbage(rp.buf, i)
							fillMemory(m, rp.buf, srcIDs, 0)
							ctx[i] = rp
						}
						gen := make([]*memRank, tp[1])
						for i := range gen {
							s, _ := pm.GenShape(pm.Gen().RankAt(i))
							m := packedMemory(t, dk, lc.l, s, 0, 7, 11, 1)
							rp := &memRank{m: m, buf: make([]byte, m.RegionLen+3), run: BlockRun{First: 0, IDs: dstIDs}}
							rp.count = make([]uint8, len(rp.buf))
							gen[i] = rp
						}
						// Two chunks: blocks [0,3) and the final partial [3,5).
						tpb := lc.l.TokensPerBlock
						transferAll(t, pm, 0, Chunk{Start: 0, End: 3 * tpb, FirstBlock: 0}, ctx, gen)
						transferAll(t, pm, 0, Chunk{Start: 3 * tpb, End: 5*tpb - 1, FirstBlock: 3, Last: true}, ctx, gen)
						for i, rp := range gen {
							verifyGen(t, pm.Gen().RankAt(i), rp)
						}
					})
				}
			}
		}
	}
}

// TestMemoryPlanCoalescing checks the segment counts that make descriptors
// worth having: same layouts copy whole runs, cross layouts one head vector
// per segment, a TP gather as much as both sides keep contiguous.
func TestMemoryPlanCoalescing(t *testing.T) {
	l := testDense(2, 4, nil) // 4 heads, 4 tokens per block, head vector 8 bytes
	const blocks = 6
	all := idRange(0, blocks)
	type side struct {
		kind MemoryKind
		tp   int
		gap  uint64
	}
	for _, tc := range []struct {
		name     string
		src, dst side
		sids     []BlockID
		dids     []BlockID
		pieces   int    // per block pair
		piece    uint64 // length of every piece
		segments int
	}{
		// Whole pool, tensors packed: K and V of both layers are one run.
		{"NHD-NHD whole pool", side{MemNHD, 1, 0}, side{MemNHD, 1, 0}, all, all, 4, 128, 1},
		// A gap after each layer's tensor: one run per layer.
		{"NHD-NHD gaps", side{MemNHD, 1, 8}, side{MemNHD, 1, 0}, all, all, 4, 128, 2},
		// Ids consecutive in pairs: a run per (layer, part, pair).
		{"HND-HND pairs", side{MemHND, 1, 0}, side{MemHND, 1, 0},
			[]BlockID{0, 1, 4, 5}, []BlockID{2, 3, 0, 1}, 4, 128, 8},
		// Split K/V (V tensors first) to NHD: one run per tensor.
		{"split-NHD", side{MemSplitKV, 1, 0}, side{MemNHD, 1, 0}, all, all, 4, 128, 4},
		// Cross layout: every head vector its own segment.
		{"NHD-HND", side{MemNHD, 1, 0}, side{MemHND, 1, 0}, all, all, 4 * 16, 8, blocks * 4 * 16},
		// TP2 -> TP1: per token the source's 2 heads, in NHD.
		{"NHD-NHD TP2-TP1", side{MemNHD, 2, 0}, side{MemNHD, 1, 0}, all, all, 4 * 4, 16, blocks * 4 * 4},
		// TP2 -> TP1 in HND: the source's 2 heads × 4 tokens are contiguous
		// on both sides.
		{"HND-HND TP2-TP1", side{MemHND, 2, 0}, side{MemHND, 1, 0}, all, all, 4, 64, blocks * 4},
		// Today's pools: one segment for the whole run.
		{"pool-pool", side{MemGroupPool, 1, 0}, side{MemGroupPool, 1, 0}, all, all, 1, 512, 1},
		// Pool -> NHD: a (layer, part) of a pool block is HND-ordered.
		{"pool-HND", side{MemGroupPool, 1, 0}, side{MemHND, 1, 0}, all, all, 4, 128, blocks * 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pm, err := NewPeerMap(l, Parallel{TP: tc.src.tp, PP: 1}, Parallel{TP: tc.dst.tp, PP: 1})
			if err != nil {
				t.Fatal(err)
			}
			link := pm.Links()[0]
			cs, _ := pm.CtxShape(link.Ctx)
			gs, _ := pm.GenShape(link.Gen)
			src := packedMemory(t, tc.src.kind, l, cs, 0, blocks, 0, tc.src.gap)
			dst := packedMemory(t, tc.dst.kind, l, gs, 0, blocks, 0, tc.dst.gap)
			p, err := NewMemoryPlan(link, 0, src, dst)
			if err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			if st.PiecesPerBlock != tc.pieces || st.MinPiece != tc.piece || st.MaxPiece != tc.piece {
				t.Fatalf("Stats = %+v, want %d pieces of %d bytes", st, tc.pieces, tc.piece)
			}
			segs, err := p.Append(nil, tc.sids, tc.dids)
			if err != nil {
				t.Fatal(err)
			}
			if len(segs) != tc.segments {
				t.Fatalf("%d segments, want %d: %v", len(segs), tc.segments, segs)
			}
			if n, err := p.Count(tc.sids, tc.dids); err != nil || n != tc.segments {
				t.Fatalf("Count = %d, %v; want %d", n, err, tc.segments)
			}
			checkMaximal(t, segs)
		})
	}
}

func TestMemoryPlanErrors(t *testing.T) {
	l := testDense(2, 4, nil)
	pm, _ := NewPeerMap(l, Parallel{TP: 2, PP: 1}, Parallel{TP: 1, PP: 1})
	link := pm.Links()[1] // tp1 -> tp0, heads [2,4)
	cs, _ := pm.CtxShape(link.Ctx)
	gs, _ := pm.GenShape(link.Gen)
	src := func() *KVMemory { return packedMemory(t, MemNHD, l, cs, 0, 4, 0, 0) }
	dst := func() *KVMemory { return packedMemory(t, MemHND, l, gs, 0, 4, 0, 0) }
	other := testDense(2, 4, nil)
	other.TokensPerBlock = 8
	for _, tc := range []struct {
		name     string
		link     PeerLink
		src, dst *KVMemory
		memory   bool
		names    []string
	}{
		{"nil source", link, nil, dst(), false, []string{"nil memory descriptor"}},
		{"invalid source", link, func() *KVMemory { m := src(); m.HeadStride = 0; return m }(), dst(), true,
			[]string{"source kvcache: bad memory descriptor", "head stride 0"}},
		{"invalid destination", link, src(), func() *KVMemory { m := dst(); m.RegionLen = 10; return m }(), true,
			[]string{"destination kvcache: bad memory descriptor", "region length 10"}},
		{"tokens per block differ", link, src(), packedMemory(t, MemHND, other, gs, 0, 4, 0, 0), true,
			[]string{"tokens per block 4", "HND memory 8"}},
		{"heads outside source", func() PeerLink { k := link; k.HeadLo = 1; return k }(), src(), dst(), false,
			[]string{"heads [1,4) not within source [2,4)"}},
		{"group outside link", func() PeerLink { k := link; k.Layers = nil; return k }(), src(), dst(), false,
			[]string{"group 0: group outside the link's 0 groups"}},
		{"layer not held", func() PeerLink { k := link; k.Layers = [][]int{{0, 2}}; return k }(), src(), dst(), false,
			[]string{"layer 2 not held by both memories"}},
		{"layers descending", func() PeerLink { k := link; k.Layers = [][]int{{1, 0}}; return k }(), src(), dst(), false,
			[]string{"not strictly ascending at 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewMemoryPlan(tc.link, 0, tc.src, tc.dst)
			if !errors.Is(err, ErrBadPlan) || errors.Is(err, ErrBadMemory) != tc.memory {
				t.Fatalf("err = %v, want ErrBadPlan (and ErrBadMemory: %v)", err, tc.memory)
			}
			for _, n := range append(tc.names, "link tp1/pp0->tp0/pp0") {
				if !strings.Contains(err.Error(), n) {
					t.Fatalf("error %q does not name %q", err, n)
				}
			}
		})
	}
	p, err := NewMemoryPlan(link, 0, src(), dst())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src, dst []BlockID
		name     string
	}{
		{[]BlockID{0, 4}, []BlockID{0, 1}, "source block id 4"},
		{[]BlockID{0, 1}, []BlockID{0, -1}, "destination block id -1"},
		{[]BlockID{0}, []BlockID{0, 1}, "1 source ids but 2 destination ids"},
	} {
		prior := []Segment{{1, 2, 3}}
		out, err := p.Append(prior, tc.src, tc.dst)
		if !errors.Is(err, ErrBadPlan) || !strings.Contains(err.Error(), tc.name) || !reflect.DeepEqual(out, prior) {
			t.Fatalf("Append(%v, %v) = %v, %v; want %q and out unextended", tc.src, tc.dst, out, err, tc.name)
		}
		if _, err := p.Count(tc.src, tc.dst); !errors.Is(err, ErrBadPlan) || !strings.Contains(err.Error(), tc.name) {
			t.Fatalf("Count(%v, %v) = %v, want %q", tc.src, tc.dst, err, tc.name)
		}
	}
}

// drawMemory draws a valid memory of rank shape s for group g with blocks
// blocks: one of the constructors with random placement and padding, or a
// strided layout with random dimension order, padded strides, padded
// elements and tensors either interleaved within a block (as a pool) or
// each outermost (as per-layer tensors), in random order.
func drawMemory(t *rapid.T, l Layout, s Shape, g, blocks int, label string) *KVMemory {
	kinds := []MemoryKind{MemGroupPool, MemStrided}
	if l.MLA {
		kinds = append(kinds, MemMLA)
	} else {
		kinds = append(kinds, MemNHD, MemHND, MemSplitKV)
	}
	kind := rapid.SampledFrom(kinds).Draw(t, label+"kind")
	gap := func(what string) uint64 { return uint64(rapid.SampledFrom([]int{0, 0, 1, 6}).Draw(t, label+what)) }
	if kind != MemStrided {
		m := packedMemory(t, kind, l, s, g, blocks, gap("offset"), gap("gap"))
		m.RegionLen += gap("tail")
		return m
	}
	m := &KVMemory{Kind: MemStrided, Layers: append([]int(nil), s.Layers[g]...), HeadLo: s.HeadLo, Heads: s.Heads(),
		Parts: l.Parts(), HeadDim: l.HeadDim, ElemBytes: l.DTypeBytes, TokensPerBlock: l.TokensPerBlock, Blocks: blocks}
	m.ElemStride = uint64(m.ElemBytes) + gap("elemPad")
	vecSpan := uint64(m.HeadDim-1)*m.ElemStride + uint64(m.ElemBytes)
	innerN, outerN := uint64(m.Heads), uint64(m.TokensPerBlock)
	headOuter := rapid.Bool().Draw(t, label+"headOuter")
	if headOuter {
		innerN, outerN = outerN, innerN
	}
	inner := vecSpan + gap("innerPad")
	outer := (innerN-1)*inner + vecSpan + gap("outerPad")
	if headOuter {
		m.HeadStride, m.TokenStride = outer, inner
	} else {
		m.TokenStride, m.HeadStride = outer, inner
	}
	width := (outerN-1)*outer + (innerN-1)*inner + vecSpan
	n := len(m.Layers) * m.Parts
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if n > 0 {
		order = rapid.Permutation(order).Draw(t, label+"order")
	}
	slot := make([]uint64, n) // tensor i*Parts+p goes to slot[...]
	off := gap("offset")
	if rapid.Bool().Draw(t, label+"interleaved") {
		w := width + gap("slotPad")
		for k, ti := range order {
			slot[ti] = off + uint64(k)*w
		}
		m.BlockStride = uint64(n)*w + gap("blockPad")
		m.RegionLen = off + uint64(blocks)*m.BlockStride
	} else {
		m.BlockStride = width + gap("blockPad")
		end := off
		for _, ti := range order {
			slot[ti] = end
			end += uint64(max(blocks-1, 0))*m.BlockStride + width + gap("tensorGap")
		}
		m.RegionLen = end
	}
	m.RegionLen += gap("tail")
	m.Base = make([][]uint64, len(m.Layers))
	for i := range m.Base {
		m.Base[i] = slot[i*m.Parts : (i+1)*m.Parts]
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("drawn strided memory: %v", err)
	}
	return m
}

// skipPieceBound skips a drawn case that NewMemoryPlan refuses by design:
// a memory with padded elements (drawMemory draws them) makes a piece of
// every element, and more than maxSmallPieces of them a block is refused
// (ErrBadMemory). Any other error is the caller's to fail on.
func skipPieceBound(t *rapid.T, err error, src, dst *KVMemory) {
	padded := src.ElemStride != uint64(src.ElemBytes) || dst.ElemStride != uint64(dst.ElemBytes)
	if padded && errors.Is(err, ErrBadMemory) && strings.Contains(err.Error(), "pieces a block") {
		t.Skip(err)
	}
}

// TestPropertyMemoryPlanMatchesElementCopy draws a layout, parallelism on
// both sides, a link and a group, a memory per side of any kind, and block
// ids; executes the plan's segments; and compares the destination with a
// naive element-by-element copy of what the link carries, byte for byte,
// including the bytes nothing may write.
func TestPropertyMemoryPlanMatchesElementCopy(t *testing.T) {
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
		srcPool, dstPool := rapid.IntRange(1, 9).Draw(t, "srcPool"), rapid.IntRange(1, 9).Draw(t, "dstPool")
		src := drawMemory(t, l, cs, g, srcPool, "src")
		dst := drawMemory(t, l, gs, g, dstPool, "dst")
		// Source ids may repeat (a block read twice); destination ids are
		// distinct, as a framework's are: a run of consecutive ids or a
		// shuffled subset of the pool.
		n := rapid.IntRange(0, dstPool).Draw(t, "blocks")
		sids := make([]BlockID, n)
		for i := range n {
			if i > 0 && rapid.Bool().Draw(t, "nextSrc") && int(sids[i-1]) < srcPool-1 {
				sids[i] = sids[i-1] + 1
			} else {
				sids[i] = BlockID(rapid.IntRange(0, srcPool-1).Draw(t, "src"))
			}
		}
		var dids []BlockID
		if rapid.Bool().Draw(t, "dstRun") {
			base := rapid.IntRange(0, dstPool-n).Draw(t, "dstBase")
			dids = idRange(base, base+n)
		} else {
			dids = rapid.Permutation(idRange(0, dstPool)).Draw(t, "dstPerm")[:n]
		}

		sbuf := make([]byte, src.RegionLen)
		garbage(sbuf, 1)
		fillMemory(src, sbuf, idRange(0, srcPool), 0)
		got, want := make([]byte, dst.RegionLen), make([]byte, dst.RegionLen)
		garbage(got, 2)
		copy(want, got)

		// Reference: one element at a time, the source element's bytes to
		// the destination element's offset.
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

		p, err := NewMemoryPlan(link, g, src, dst)
		if err != nil {
			skipPieceBound(t, err, src, dst)
			t.Fatal(err)
		}
		segs, err := p.Append(nil, sids, dids)
		if err != nil {
			t.Fatal(err)
		}
		checkMaximal(t, segs)
		if c, err := p.Count(sids, dids); err != nil || c != len(segs) {
			t.Fatalf("Count = %d, %v; Append gave %d", c, err, len(segs))
		}
		moved := execute(t, segs, sbuf, got, make([]uint8, len(got)))
		if moved != p.Bytes(n) || moved != uint64(k)*e {
			t.Fatalf("segments move %d bytes; Bytes says %d, the link carries %d", moved, p.Bytes(n), uint64(k)*e)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%v->%v memory: byte %d = %#x, element copy gives %#x (%d segments)",
					src.Kind, dst.Kind, i, got[i], want[i], len(segs))
			}
		}
	})
}

// TestPropertyPoolMemoryMatchesNewPlan proves today's planner and the
// descriptor planner equal on today's layout: for random layouts,
// parallelism, links, pool geometries and ids, NewMemoryPlan over two
// PoolMemory descriptors emits exactly NewPlan's segments, with the same
// Stats and Bytes.
func TestPropertyPoolMemoryMatchesNewPlan(t *testing.T) {
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
		const pool = 16
		pad := func(label string) uint64 { return uint64(rapid.SampledFrom([]int{0, 0, 0, 3}).Draw(t, label)) }
		srcGeo := PoolGeometry{Offset: uint64(rapid.IntRange(0, 9).Draw(t, "srcOff")), BlockBytes: cs.BlockBytes(l, g) + pad("srcPad"), Blocks: pool}
		dstGeo := PoolGeometry{Offset: uint64(rapid.IntRange(0, 9).Draw(t, "dstOff")), BlockBytes: gs.BlockBytes(l, g) + pad("dstPad"), Blocks: pool}
		legacy, err := pm.Plan(link, g, srcGeo, dstGeo)
		if err != nil {
			t.Fatal(err)
		}
		src, err := PoolMemory(l, cs, g, srcGeo)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := PoolMemory(l, gs, g, dstGeo)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewMemoryPlan(link, g, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if p.Stats() != legacy.Stats() || p.BytesPerBlock() != legacy.BytesPerBlock() {
			t.Fatalf("Stats %+v / %d bytes, NewPlan %+v / %d", p.Stats(), p.BytesPerBlock(), legacy.Stats(), legacy.BytesPerBlock())
		}
		n := rapid.IntRange(0, 20).Draw(t, "blocks")
		sids, dids := make([]BlockID, n), make([]BlockID, n)
		for i := range n {
			if i > 0 && rapid.Bool().Draw(t, "next") && sids[i-1] < pool-1 && dids[i-1] < pool-1 {
				sids[i], dids[i] = sids[i-1]+1, dids[i-1]+1
				continue
			}
			sids[i] = BlockID(rapid.IntRange(0, pool-1).Draw(t, "src"))
			dids[i] = BlockID(rapid.IntRange(0, pool-1).Draw(t, "dst"))
		}
		want, err := legacy.Append(nil, sids, dids)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Append(nil, sids, dids)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("NewMemoryPlan segments\n%v\nNewPlan\n%v", got, want)
		}
	})
}
