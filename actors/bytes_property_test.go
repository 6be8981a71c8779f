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

// e2eRegion is one rank's region under test, laid out as pools (e2eRank)
// or as framework memory (e2eMem).
type e2eRegion interface {
	bytes() *e2eBytes
	// each calls f for every byte of group g's request blocks: its offset in
	// the region and the model coordinates of the byte it holds.
	each(g int, f func(off uint64, layer, part, head, token, b int))
	// geometry is what the rank declares of its region (Topology.Pools and
	// .Memory, Hello.Pools and .Memory); memory is nil for pools.
	geometry() (pools []kvcache.PoolGeometry, memory []*kvcache.KVMemory)
}

// e2eBytes is what both layouts share: the request's blocks per group, the
// region's bytes and the number of writes to each byte.
type e2eBytes struct {
	run   []kvcache.BlockRun
	buf   []byte
	count []int
}

func (r *e2eBytes) bytes() *e2eBytes { return r }

// e2eRank is one rank's region: a pool per group and the request's blocks.
type e2eRank struct {
	e2eBytes
	l     kvcache.Layout
	shape kvcache.Shape
	geo   []kvcache.PoolGeometry
}

func (r *e2eRank) geometry() ([]kvcache.PoolGeometry, []*kvcache.KVMemory) { return r.geo, nil }

func (r *e2eRank) each(g int, f func(off uint64, layer, part, head, token, b int)) {
	tpb, tb := r.l.TokensPerBlock, r.l.TokenBytes()
	for i, id := range r.run[g].IDs {
		global := r.run[g].First + i
		off := r.geo[g].Offset + uint64(id)*r.geo[g].BlockBytes
		for _, layer := range r.shape.Layers[g] {
			for part := range r.l.Parts() {
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
	r := &e2eRank{l: l, shape: s, geo: make([]kvcache.PoolGeometry, len(l.Groups))}
	r.run = make([]kvcache.BlockRun, len(l.Groups))
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

// e2eMem is one rank's framework memory: a descriptor per group (nil: the
// group is the rank's pool), and the request's blocks.
type e2eMem struct {
	e2eBytes
	mem []*kvcache.KVMemory
}

// geometry declares placeholder pools of one-byte blocks beside the
// descriptors, which place the bytes; Blocks still bounds the block ids.
func (r *e2eMem) geometry() ([]kvcache.PoolGeometry, []*kvcache.KVMemory) {
	pools := make([]kvcache.PoolGeometry, len(r.mem))
	for g, m := range r.mem {
		n := 1
		if m != nil {
			n = m.Blocks
		}
		pools[g] = kvcache.PoolGeometry{Offset: 0, BlockBytes: 1, Blocks: n}
	}
	return pools, r.mem
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
	r := &e2eMem{mem: make([]*kvcache.KVMemory, len(l.Groups))}
	r.run = make([]kvcache.BlockRun, len(l.Groups))
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

// e2eRequest is one drawn request over a scenario: the prompt, the
// receiver's prefix hits per group, the sender's chunks (chunkTokens tokens,
// each split into parts layer parts) and the blocks every context rank holds
// per group, srcFirst[g] up to srcEnd[g] (at least the resident range).
type e2eRequest struct {
	e2eScenario
	pm               *kvcache.PeerMap
	prompt           int
	hits             []int
	chunkTokens      int
	parts            int
	srcFirst, srcEnd []int
}

func drawE2ERequest(t *rapid.T, maxPrompt int) e2eRequest {
	q := e2eRequest{e2eScenario: drawE2EScenario(t)}
	l, tpb := q.l, q.l.TokensPerBlock
	pm, err := kvcache.NewPeerMap(l, q.ctx, q.gen)
	if err != nil {
		t.Fatal(err)
	}
	q.pm = pm
	q.prompt = rapid.IntRange(1, maxPrompt).Draw(t, "prompt")
	nBlocks := (q.prompt + tpb - 1) / tpb
	q.hits = make([]int, len(l.Groups))
	for g := range q.hits {
		q.hits[g] = rapid.IntRange(0, nBlocks).Draw(t, "hit")
	}
	q.chunkTokens = tpb * rapid.IntRange(1, nBlocks).Draw(t, "chunkBlocks")
	q.parts = rapid.IntRange(0, l.Layers).Draw(t, "parts")
	q.srcFirst = make([]int, len(l.Groups))
	q.srcEnd = make([]int, len(l.Groups))
	for g, grp := range l.Groups {
		rf, re := kvcache.ResidentRange(q.prompt, grp.Window, tpb)
		q.srcEnd[g] = re
		q.srcFirst[g] = rapid.IntRange(0, rf).Draw(t, "srcFirst")
	}
	return q
}

// checkE2E draws every rank's region with draw, sends q from each context
// rank to each generation rank and checks the bytes each one receives.
func checkE2E[R e2eRegion](t *rapid.T, q e2eRequest, draw func(t *rapid.T, l kvcache.Layout, s kvcache.Shape, first, end []int, label string) R) {
	l := q.l
	ctxRanks := make([]R, q.ctx.Size())
	for i := range ctxRanks {
		cs, _ := q.pm.CtxShape(q.ctx.RankAt(i))
		r := draw(t, l, cs, q.srcFirst, q.srcEnd, "ctx")
		rb := r.bytes()
		for j := range rb.buf {
			rb.buf[j] = byte(0x5a ^ j)
		}
		for g := range l.Groups {
			r.each(g, func(off uint64, layer, part, head, token, b int) { rb.buf[off] = e2eKV(layer, part, head, token, b) })
		}
		ctxRanks[i] = r
	}
	for gi := range q.gen.Size() {
		grank := q.gen.RankAt(gi)
		gs, _ := q.pm.GenShape(grank)
		first := make([]int, len(l.Groups))
		end := make([]int, len(l.Groups))
		for g, grp := range l.Groups {
			if len(gs.Layers[g]) == 0 {
				continue
			}
			first[g], end[g] = kvcache.NeededRange(q.prompt, grp.Window, l.TokensPerBlock, q.hits[g])
		}
		gr := draw(t, l, gs, first, end, "gen")
		hello, writers := openE2E(t, q, gi, gr)
		for _, w := range writers {
			sendE2E(t, q, hello, w, ctxRanks[w.Peer.Rank], gr, grank)
		}
		checkE2EReceived(t, l, grank, gr)
	}
}

// openE2E starts the request on generation rank gi (region gr): the
// receiver's plan and expected bytes per writer, and the Hello it sends.
func openE2E(t *rapid.T, q e2eRequest, gi int, gr e2eRegion) (*messages.Hello, []core.RxWriter) {
	l, grank := q.l, q.gen.RankAt(gi)
	self := messages.PeerID{Instance: "gen", Rank: int32(gi)}
	table := core.NewRxTable(self, l, q.gen, grank, 2)
	blocks := make([][]kvcache.BlockID, len(l.Groups))
	for g := range blocks {
		blocks[g] = gr.bytes().run[g].IDs
	}
	_, writers, err := table.Start(core.RxOpen{Request: "r", PromptLen: q.prompt, Context: "ctx", ContextParallel: q.ctx,
		PrefixHitBlocks: q.hits}, blocks, time.Unix(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	geos, mem := gr.geometry()
	pools := make([]messages.PoolGeometry, len(geos))
	for g, geo := range geos {
		pools[g] = messages.PoolGeometry{Offset: geo.Offset, BlockBytes: geo.BlockBytes, Blocks: int32(geo.Blocks)}
	}
	hello := &messages.Hello{From: self, Backend: "loopback", AgentAddr: []byte{1},
		Region: messages.RemoteRegion{Key: []byte{1}, Len: uint64(len(gr.bytes().buf))}, LayoutHash: l.Hash(),
		Parallel: messages.Parallel{TP: int32(q.gen.TP), PP: int32(q.gen.PP)}, TP: int32(grank.TP), PP: int32(grank.PP),
		Pools: pools, Memory: helloMemory(mem)}
	if mem != nil { // the memory variant: its descriptors must pass a peer's checks
		if err := hello.Validate(); err != nil {
			t.Fatalf("hello: %v", err)
		}
	}
	return hello, writers
}

// sendE2E resolves writer w's request on its context rank (region cr) to
// generation rank grank (region gr), plans every chunk and layer part in
// order, applies the segments, and checks the bytes moved are the bytes
// planned and the bytes expected.
func sendE2E(t *rapid.T, q e2eRequest, hello *messages.Hello, w core.RxWriter, cr, gr e2eRegion, grank kvcache.Rank) {
	l, tpb, ci := q.l, q.l.TokensPerBlock, int(w.Peer.Rank)
	geos, mem := cr.geometry()
	topo := Topology{Layout: l, LayoutHash: l.Hash(), Parallel: q.ctx, Rank: q.ctx.RankAt(ci), Pools: geos, Memory: mem, Plans: NewPlanCache()}
	route, _, err := ResolveRequest(topo, hello, w.Request)
	if err != nil {
		t.Fatalf("ResolveRequest ctx %d gen %v: %v", ci, grank, err)
	}
	cb, gb := cr.bytes(), gr.bytes()
	order := kvcache.NewChunkOrder(q.prompt, tpb, l.Layers)
	var moved, planned uint64
	for start := 0; start < q.prompt; start += q.chunkTokens {
		e := min(start+q.chunkTokens, q.prompt)
		c := kvcache.Chunk{Start: start, End: e, FirstBlock: start / tpb, Last: e == q.prompt}
		b0, b1 := c.Blocks(tpb)
		src := make([]kvcache.BlockRun, len(l.Groups))
		for g, run := range cb.run {
			lo := max(b0, run.First)
			if lo < b1 && len(run.IDs) > 0 {
				src[g] = kvcache.BlockRun{First: lo, IDs: run.IDs[lo-run.First : b1-run.First]}
			}
		}
		for _, part := range kvcache.SplitLayers(l.Layers, q.parts) {
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
			moved += applySegments(segs, cb.buf, gb.buf, gb.count)
		}
	}
	if moved != planned || moved != w.Bytes {
		t.Fatalf("ctx %d -> gen %v: segments moved %d, planner said %d, receiver expects %d", ci, grank, moved, planned, w.Bytes)
	}
}

// checkE2EReceived checks every needed byte of generation rank grank's
// region gr was written once with its true value and no other byte was.
func checkE2EReceived(t *rapid.T, l kvcache.Layout, grank kvcache.Rank, gr e2eRegion) {
	gb := gr.bytes()
	needed := make([]bool, len(gb.buf))
	for g := range l.Groups {
		gr.each(g, func(off uint64, layer, part, head, token, b int) {
			needed[off] = true
			if gb.count[off] != 1 {
				t.Fatalf("gen %v group %d: layer %d part %d head %d token %d byte %d written %d times", grank, g, layer, part, head, token, b, gb.count[off])
			}
			if want := e2eKV(layer, part, head, token, b); gb.buf[off] != want {
				t.Fatalf("gen %v group %d: layer %d part %d head %d token %d: wrong byte", grank, g, layer, part, head, token)
			}
		})
	}
	for off, c := range gb.count {
		if !needed[off] && c != 0 {
			t.Fatalf("gen %v: byte %d outside needed blocks written", grank, off)
		}
	}
}

// TestProperty_EndToEndBytes drives RxTable.Start (the receiver's plan and
// expected bytes), ResolveRequest and the route's Planner over every chunk
// and layer part, and checks every needed destination byte is written once
// with the right value and each writer moves exactly the bytes expected.
func TestProperty_EndToEndBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { checkE2E(t, drawE2ERequest(t, 40), drawE2ERank) })
}

// TestProperty_EndToEndBytesMemory is TestProperty_EndToEndBytes over framework
// memory descriptors on both sides (the receiver's in its Hello).
func TestProperty_EndToEndBytesMemory(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { checkE2E(t, drawE2ERequest(t, 30), drawE2EMem) })
}
