package actors

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// e2eKV is the model's true byte at (layer, part, head, token, byte).
func e2eKV(layer, part, head, token, b int) byte {
	x := uint64(layer)<<48 ^ uint64(part)<<44 ^ uint64(head)<<32 ^ uint64(token)<<8 ^ uint64(b)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return byte(x)
}

type e2eScenario struct {
	l        kvcache.Layout
	ctx, gen kvcache.Parallel
}

func drawE2EScenario(t *rapid.T) e2eScenario {
	var s e2eScenario
	layers := rapid.IntRange(1, 10).Draw(t, "layers")
	s.l = kvcache.Layout{Name: "rev", Layers: layers,
		HeadDim:        rapid.IntRange(1, 3).Draw(t, "headDim"),
		DTypeBytes:     rapid.IntRange(1, 2).Draw(t, "dtype"),
		TokensPerBlock: rapid.IntRange(1, 6).Draw(t, "tpb"),
		MLA:            rapid.IntRange(0, 3).Draw(t, "mla") == 0,
	}
	if s.l.MLA {
		s.l.KVHeads = 1
		s.ctx.TP = rapid.IntRange(1, 4).Draw(t, "ctxTP")
		s.gen.TP = rapid.IntRange(1, 4).Draw(t, "genTP")
	} else {
		s.l.KVHeads = rapid.SampledFrom([]int{1, 2, 4, 6}).Draw(t, "heads")
		var divs []int
		for d := 1; d <= s.l.KVHeads; d++ {
			if s.l.KVHeads%d == 0 {
				divs = append(divs, d)
			}
		}
		s.ctx.TP = rapid.SampledFrom(divs).Draw(t, "ctxTP")
		s.gen.TP = rapid.SampledFrom(divs).Draw(t, "genTP")
	}
	s.ctx.PP = rapid.IntRange(1, min(layers, 3)).Draw(t, "ctxPP")
	s.gen.PP = rapid.IntRange(1, min(layers, 3)).Draw(t, "genPP")
	window := func(label string) int {
		if rapid.Bool().Draw(t, label+"Full") {
			return 0
		}
		return rapid.IntRange(1, 30).Draw(t, label)
	}
	if layers >= 2 && rapid.Bool().Draw(t, "twoGroups") {
		var a, b []int
		for L := range layers {
			if rapid.Bool().Draw(t, "inA") {
				a = append(a, L)
			} else {
				b = append(b, L)
			}
		}
		if len(a) == 0 {
			a, b = b[:1], b[1:]
		} else if len(b) == 0 {
			a, b = a[:len(a)-1], a[len(a)-1:]
		}
		s.l.Groups = []kvcache.LayerGroup{{Name: "a", Layers: a, Window: window("wA")}, {Name: "b", Layers: b, Window: window("wB")}}
	} else {
		s.l.Groups = []kvcache.LayerGroup{{Name: "all", Layers: kvcache.LayerRange(0, layers), Window: window("w")}}
	}
	return s
}

// e2eRank is one rank's region: a pool per group and the request's blocks.
type e2eRank struct {
	shape kvcache.Shape
	geo   []kvcache.PoolGeometry
	run   []kvcache.BlockRun
	buf   []byte
	count []int
}

func (r *e2eRank) each(l kvcache.Layout, g int, f func(off uint64, layer, part, head, token, b int)) {
	tpb, tb := l.TokensPerBlock, l.TokenBytes()
	for i, id := range r.run[g].IDs {
		global := r.run[g].First + i
		off := r.geo[g].Offset + uint64(id)*r.geo[g].BlockBytes
		for _, layer := range r.shape.Layers[g] {
			for part := range l.Parts() {
				for h := r.shape.HeadLo; h < r.shape.HeadHi; h++ {
					for tok := range tpb {
						for b := range tb {
							f(off, layer, part, h, global*tpb+tok, b)
							off++
						}
					}
				}
			}
		}
	}
}

func drawE2ERank(t *rapid.T, l kvcache.Layout, s kvcache.Shape, first, end []int, label string) *e2eRank {
	r := &e2eRank{shape: s, geo: make([]kvcache.PoolGeometry, len(l.Groups)), run: make([]kvcache.BlockRun, len(l.Groups))}
	var off uint64
	for g := range l.Groups {
		n := max(end[g]-first[g], 0)
		extra := rapid.IntRange(0, 3).Draw(t, label+"extra")
		pool := n + extra
		bb := s.BlockBytes(l, g)
		if bb == 0 {
			bb = 1
		}
		geo := kvcache.PoolGeometry{Offset: off + uint64(rapid.IntRange(0, 3).Draw(t, label+"gap")), BlockBytes: bb, Blocks: pool}
		all := make([]kvcache.BlockID, pool)
		for i := range all {
			all[i] = kvcache.BlockID(i)
		}
		perm := rapid.Permutation(all).Draw(t, label+"perm")
		r.geo[g] = geo
		r.run[g] = kvcache.BlockRun{First: first[g], IDs: perm[:n]}
		off = geo.Offset + uint64(pool)*geo.BlockBytes
	}
	r.buf = make([]byte, off+1)
	r.count = make([]int, len(r.buf))
	return r
}

// TestProperty_EndToEndBytes drives RxTable.Start (the receiver's plan and
// expected bytes), ResolveRequest and the route's Planner over every chunk
// and layer part, and checks every needed destination byte is written once
// with the right value and each writer moves exactly the bytes expected.
func TestProperty_EndToEndBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawE2EScenario(t)
		l := s.l
		tpb := l.TokensPerBlock
		pm, err := kvcache.NewPeerMap(l, s.ctx, s.gen)
		if err != nil {
			t.Fatal(err)
		}
		prompt := rapid.IntRange(1, 40).Draw(t, "prompt")
		nBlocks := (prompt + tpb - 1) / tpb
		hits := make([]int, len(l.Groups))
		for g := range hits {
			hits[g] = rapid.IntRange(0, nBlocks).Draw(t, "hit")
		}
		chunkTokens := tpb * rapid.IntRange(1, nBlocks).Draw(t, "chunkBlocks")
		nParts := rapid.IntRange(0, l.Layers).Draw(t, "parts")

		// Context ranks: each holds at least the group's resident range.
		ends := make([]int, len(l.Groups))
		srcFirst := make([]int, len(l.Groups))
		for g, grp := range l.Groups {
			rf, re := kvcache.ResidentRange(prompt, grp.Window, tpb)
			ends[g] = re
			srcFirst[g] = rapid.IntRange(0, rf).Draw(t, "srcFirst")
		}
		ctxRanks := make([]*e2eRank, s.ctx.Size())
		for i := range ctxRanks {
			cs, _ := pm.CtxShape(s.ctx.RankAt(i))
			r := drawE2ERank(t, l, cs, srcFirst, ends, "ctx")
			for j := range r.buf {
				r.buf[j] = byte(0x5a ^ j)
			}
			for g := range l.Groups {
				r.each(l, g, func(off uint64, layer, part, head, token, b int) { r.buf[off] = e2eKV(layer, part, head, token, b) })
			}
			ctxRanks[i] = r
		}

		for gi := range s.gen.Size() {
			grank := s.gen.RankAt(gi)
			gs, _ := pm.GenShape(grank)
			first := make([]int, len(l.Groups))
			end := make([]int, len(l.Groups))
			for g, grp := range l.Groups {
				if len(gs.Layers[g]) == 0 {
					continue
				}
				first[g], end[g] = kvcache.NeededRange(prompt, grp.Window, tpb, hits[g])
			}
			gr := drawE2ERank(t, l, gs, first, end, "gen")
			self := messages.PeerID{Instance: "gen", Rank: int32(gi)}
			table := core.NewRxTable(self, l, s.gen, grank, 2)
			blocks := make([][]kvcache.BlockID, len(l.Groups))
			for g := range blocks {
				blocks[g] = gr.run[g].IDs
			}
			_, writers, err := table.Start(core.RxOpen{Request: "r", PromptLen: prompt, Context: "ctx", ContextParallel: s.ctx,
				PrefixHitBlocks: hits}, blocks, time.Unix(1, 0))
			if err != nil {
				t.Fatal(err)
			}
			pools := make([]messages.PoolGeometry, len(l.Groups))
			for g, geo := range gr.geo {
				pools[g] = messages.PoolGeometry{Offset: geo.Offset, BlockBytes: geo.BlockBytes, Blocks: int32(geo.Blocks)}
			}
			hello := &messages.Hello{From: self, Backend: "loopback", AgentAddr: []byte{1},
				Region: messages.RemoteRegion{Key: []byte{1}, Len: uint64(len(gr.buf))}, LayoutHash: l.Hash(),
				Parallel: messages.Parallel{TP: int32(s.gen.TP), PP: int32(s.gen.PP)}, TP: int32(grank.TP), PP: int32(grank.PP),
				Pools: pools}
			for _, w := range writers {
				ci := int(w.Peer.Rank)
				cr := ctxRanks[ci]
				topo := Topology{Layout: l, LayoutHash: l.Hash(), Parallel: s.ctx, Rank: s.ctx.RankAt(ci), Pools: cr.geo, Plans: NewPlanCache()}
				route, _, err := ResolveRequest(topo, hello, w.Request)
				if err != nil {
					t.Fatalf("ResolveRequest ctx %d gen %v: %v", ci, grank, err)
				}
				order := kvcache.NewChunkOrder(prompt, tpb, l.Layers)
				var moved, planned uint64
				for start := 0; start < prompt; start += chunkTokens {
					e := min(start+chunkTokens, prompt)
					c := kvcache.Chunk{Start: start, End: e, FirstBlock: start / tpb, Last: e == prompt}
					b0, b1 := c.Blocks(tpb)
					src := make([]kvcache.BlockRun, len(l.Groups))
					for g := range l.Groups {
						lo := max(b0, cr.run[g].First)
						if lo < b1 {
							src[g] = kvcache.BlockRun{First: lo, IDs: cr.run[g].IDs[lo-cr.run[g].First : b1-cr.run[g].First]}
						}
					}
					for _, part := range kvcache.SplitLayers(l.Layers, nParts) {
						pc := c
						pc.Layers = part
						if err := order.Check(pc, src); err != nil {
							t.Fatalf("order: %v", err)
						}
						order.Took(pc, src)
						segs, n, err := route.Planner.Plan(pc, src, nil)
						if err != nil {
							t.Fatalf("Plan %v ctx %d gen %v: %v", pc, ci, grank, err)
						}
						planned += n
						moved += applySegments(segs, cr.buf, gr.buf, gr.count)
					}
				}
				if moved != planned || moved != w.Bytes {
					t.Fatalf("ctx %d -> gen %v: segments moved %d, planner said %d, receiver expects %d", ci, grank, moved, planned, w.Bytes)
				}
			}
			needed := make([]bool, len(gr.buf))
			for g := range l.Groups {
				gr.each(l, g, func(off uint64, layer, part, head, token, b int) {
					needed[off] = true
					if gr.count[off] != 1 {
						t.Fatalf("gen %v group %d: layer %d part %d head %d token %d byte %d written %d times", grank, g, layer, part, head, token, b, gr.count[off])
					}
					if want := e2eKV(layer, part, head, token, b); gr.buf[off] != want {
						t.Fatalf("gen %v group %d: layer %d part %d head %d token %d: wrong byte", grank, g, layer, part, head, token)
					}
				})
			}
			for off, c := range gr.count {
				if !needed[off] && c != 0 {
					t.Fatalf("gen %v: byte %d outside needed blocks written", grank, off)
				}
			}
		}
	})
}

// e2eMem is one rank's framework memory: a descriptor per group (nil: the
// group is the rank's pool), and the request's blocks.
type e2eMem struct {
	mem   []*kvcache.KVMemory
	run   []kvcache.BlockRun
	buf   []byte
	count []int
}

func (r *e2eMem) each(g int, f func(off uint64, layer, part, head, token, b int)) {
	m := r.mem[g]
	if m == nil {
		return
	}
	for i, id := range r.run[g].IDs {
		global := r.run[g].First + i
		for li, layer := range m.Layers {
			for p := range m.Parts {
				for h := range m.Heads {
					for tok := range m.TokensPerBlock {
						for e := range m.HeadDim {
							off := m.Base[li][p] + uint64(id)*m.BlockStride + uint64(tok)*m.TokenStride + uint64(h)*m.HeadStride + uint64(e)*m.ElemStride
							for b := range m.ElemBytes {
								f(off+uint64(b), layer, p, m.HeadLo+h, global*m.TokensPerBlock+tok, e*m.ElemBytes+b)
							}
						}
					}
				}
			}
		}
	}
}

func drawE2EMem(t *rapid.T, l kvcache.Layout, s kvcache.Shape, first, end []int, label string) *e2eMem {
	r := &e2eMem{mem: make([]*kvcache.KVMemory, len(l.Groups)), run: make([]kvcache.BlockRun, len(l.Groups))}
	type pending struct {
		g, blocks int
		kind      string
	}
	var off uint64
	var ps []pending
	for g := range l.Groups {
		n := max(end[g]-first[g], 0)
		pool := n + rapid.IntRange(0, 2).Draw(t, label+"extra")
		if pool == 0 {
			pool = 1
		}
		all := make([]kvcache.BlockID, pool)
		for i := range all {
			all[i] = kvcache.BlockID(i)
		}
		perm := rapid.Permutation(all).Draw(t, label+"perm")
		r.run[g] = kvcache.BlockRun{First: first[g], IDs: perm[:n]}
		kinds := []string{"nhd", "hnd", "split_kv"}
		if l.MLA {
			kinds = []string{"mla"}
		}
		ps = append(ps, pending{g, pool, rapid.SampledFrom(kinds).Draw(t, label+"kind")})
	}
	// Lay tensors one after another; compute sizes with a throwaway descriptor.
	var offs [][]uint64
	var voffs [][]uint64
	for _, p := range ps {
		vec := uint64(l.HeadDim * l.DTypeBytes)
		block := vec * uint64(s.Heads()) * uint64(l.TokensPerBlock)
		var o, v []uint64
		for range s.Layers[p.g] {
			off += uint64(rapid.IntRange(0, 3).Draw(t, label+"gap"))
			o = append(o, off)
			switch p.kind {
			case "nhd", "hnd":
				off += 2 * uint64(p.blocks) * block
			case "split_kv":
				off += uint64(p.blocks) * block
				v = append(v, off)
				off += uint64(p.blocks) * block
			case "mla":
				off += uint64(p.blocks) * block
			}
		}
		offs = append(offs, o)
		voffs = append(voffs, v)
	}
	regionLen := off + 1
	for i, p := range ps {
		if len(s.Layers[p.g]) == 0 {
			continue
		}
		m, err := kvcache.FrameworkMemory(p.kind, l, s, p.g, p.blocks, offs[i], voffs[i], regionLen)
		if err != nil {
			t.Fatalf("memory: %v", err)
		}
		r.mem[p.g] = m
	}
	r.buf = make([]byte, regionLen)
	r.count = make([]int, regionLen)
	return r
}

// TestProperty_EndToEndBytesMemory is TestProperty_EndToEndBytes over framework
// memory descriptors on both sides (the receiver's in its Hello).
func TestProperty_EndToEndBytesMemory(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawE2EScenario(t)
		l := s.l
		tpb := l.TokensPerBlock
		pm, err := kvcache.NewPeerMap(l, s.ctx, s.gen)
		if err != nil {
			t.Fatal(err)
		}
		prompt := rapid.IntRange(1, 30).Draw(t, "prompt")
		nBlocks := (prompt + tpb - 1) / tpb
		hits := make([]int, len(l.Groups))
		for g := range hits {
			hits[g] = rapid.IntRange(0, nBlocks).Draw(t, "hit")
		}
		chunkTokens := tpb * rapid.IntRange(1, nBlocks).Draw(t, "chunkBlocks")
		nParts := rapid.IntRange(0, l.Layers).Draw(t, "parts")
		ends := make([]int, len(l.Groups))
		srcFirst := make([]int, len(l.Groups))
		for g, grp := range l.Groups {
			rf, re := kvcache.ResidentRange(prompt, grp.Window, tpb)
			ends[g] = re
			srcFirst[g] = rapid.IntRange(0, rf).Draw(t, "srcFirst")
		}
		ctxRanks := make([]*e2eMem, s.ctx.Size())
		for i := range ctxRanks {
			cs, _ := pm.CtxShape(s.ctx.RankAt(i))
			r := drawE2EMem(t, l, cs, srcFirst, ends, "ctx")
			for j := range r.buf {
				r.buf[j] = byte(0x5a ^ j)
			}
			for g := range l.Groups {
				r.each(g, func(off uint64, layer, part, head, token, b int) { r.buf[off] = e2eKV(layer, part, head, token, b) })
			}
			ctxRanks[i] = r
		}
		for gi := range s.gen.Size() {
			grank := s.gen.RankAt(gi)
			gs, _ := pm.GenShape(grank)
			first := make([]int, len(l.Groups))
			end := make([]int, len(l.Groups))
			for g, grp := range l.Groups {
				if len(gs.Layers[g]) == 0 {
					continue
				}
				first[g], end[g] = kvcache.NeededRange(prompt, grp.Window, tpb, hits[g])
			}
			gr := drawE2EMem(t, l, gs, first, end, "gen")
			self := messages.PeerID{Instance: "gen", Rank: int32(gi)}
			table := core.NewRxTable(self, l, s.gen, grank, 2)
			blocks := make([][]kvcache.BlockID, len(l.Groups))
			for g := range blocks {
				blocks[g] = gr.run[g].IDs
			}
			_, writers, err := table.Start(core.RxOpen{Request: "r", PromptLen: prompt, Context: "ctx", ContextParallel: s.ctx,
				PrefixHitBlocks: hits}, blocks, time.Unix(1, 0))
			if err != nil {
				t.Fatal(err)
			}
			pools := make([]messages.PoolGeometry, len(l.Groups))
			for g, m := range gr.mem {
				n := 1
				if m != nil {
					n = m.Blocks
				}
				pools[g] = messages.PoolGeometry{Offset: 0, BlockBytes: 1, Blocks: int32(n)}
			}
			hello := &messages.Hello{From: self, Backend: "loopback", AgentAddr: []byte{1},
				Region: messages.RemoteRegion{Key: []byte{1}, Len: uint64(len(gr.buf))}, LayoutHash: l.Hash(),
				Parallel: messages.Parallel{TP: int32(s.gen.TP), PP: int32(s.gen.PP)}, TP: int32(grank.TP), PP: int32(grank.PP),
				Pools: pools, Memory: helloMemory(gr.mem)}
			if err := hello.Validate(); err != nil {
				t.Fatalf("hello: %v", err)
			}
			for _, w := range writers {
				ci := int(w.Peer.Rank)
				cr := ctxRanks[ci]
				geos := make([]kvcache.PoolGeometry, len(l.Groups))
				for g, m := range cr.mem {
					n := 1
					if m != nil {
						n = m.Blocks
					}
					geos[g] = kvcache.PoolGeometry{Offset: 0, BlockBytes: 1, Blocks: n}
				}
				topo := Topology{Layout: l, LayoutHash: l.Hash(), Parallel: s.ctx, Rank: s.ctx.RankAt(ci), Pools: geos, Memory: cr.mem, Plans: NewPlanCache()}
				route, _, err := ResolveRequest(topo, hello, w.Request)
				if err != nil {
					t.Fatalf("ResolveRequest ctx %d gen %v: %v", ci, grank, err)
				}
				order := kvcache.NewChunkOrder(prompt, tpb, l.Layers)
				var moved, planned uint64
				for start := 0; start < prompt; start += chunkTokens {
					e := min(start+chunkTokens, prompt)
					c := kvcache.Chunk{Start: start, End: e, FirstBlock: start / tpb, Last: e == prompt}
					b0, b1 := c.Blocks(tpb)
					src := make([]kvcache.BlockRun, len(l.Groups))
					for g := range l.Groups {
						lo := max(b0, cr.run[g].First)
						if lo < b1 && len(cr.run[g].IDs) > 0 {
							src[g] = kvcache.BlockRun{First: lo, IDs: cr.run[g].IDs[lo-cr.run[g].First : b1-cr.run[g].First]}
						}
					}
					for _, part := range kvcache.SplitLayers(l.Layers, nParts) {
						pc := c
						pc.Layers = part
						if err := order.Check(pc, src); err != nil {
							t.Fatalf("order: %v", err)
						}
						order.Took(pc, src)
						segs, n, err := route.Planner.Plan(pc, src, nil)
						if err != nil {
							t.Fatalf("Plan %v ctx %d gen %v: %v", pc, ci, grank, err)
						}
						planned += n
						moved += applySegments(segs, cr.buf, gr.buf, gr.count)
					}
				}
				if moved != planned || moved != w.Bytes {
					t.Fatalf("ctx %d -> gen %v: segments moved %d, planner said %d, receiver expects %d", ci, grank, moved, planned, w.Bytes)
				}
			}
			needed := make([]bool, len(gr.buf))
			for g := range l.Groups {
				gr.each(g, func(off uint64, layer, part, head, token, b int) {
					needed[off] = true
					if gr.count[off] != 1 {
						t.Fatalf("gen %v group %d: layer %d part %d head %d token %d byte %d written %d times", grank, g, layer, part, head, token, b, gr.count[off])
					}
					if want := e2eKV(layer, part, head, token, b); gr.buf[off] != want {
						t.Fatalf("gen %v group %d: layer %d part %d head %d token %d: wrong byte", grank, g, layer, part, head, token)
					}
				})
			}
			for off, c := range gr.count {
				if !needed[off] && c != 0 {
					t.Fatalf("gen %v: byte %d outside needed blocks written", grank, off)
				}
			}
		}
	})
}
