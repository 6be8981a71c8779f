package kvcache

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// This file checks whole requests against a reference model that shares
// nothing with the code under test but Layout, Chunk, kvByte and the
// helpers that draw Stages and execute segments: which
// heads and layers each rank holds, which blocks a receiver needs, and
// where each element of each framework layout lies are all computed here
// from the documented rules and the frameworks' tensor shapes. The other
// property tests take those from Shape, NeededRange and the KVMemory a
// constructor returns, so a rule that is wrong on both sides alike (heads
// dealt in another order, a default stage split unlike the documented one,
// a constructor's strides unlike the tensor it names) passes them.

// refHeads is the model KV heads [lo, lo+n) that tensor position tp of TP
// ranks holds: contiguous equal ranges in rank order, or the one latent
// head on every rank for MLA.
func refHeads(l Layout, tp, tpRanks int) (lo, n int) {
	if l.MLA {
		return 0, 1
	}
	n = l.KVHeads / tpRanks
	return tp * n, n
}

// refStage is the global layers [lo, hi) of pipeline stage stage: the
// Stages counts when given, else layers/PP each and the first layers%PP
// stages one more.
func refStage(layers int, p Parallel, stage int) (lo, hi int) {
	counts := make([]int, p.PP)
	if p.Stages != "" {
		for i, f := range strings.Split(p.Stages, ",") {
			counts[i], _ = strconv.Atoi(f)
		}
	} else {
		for i := range counts {
			counts[i] = layers / p.PP
			if i < layers%p.PP {
				counts[i]++
			}
		}
	}
	for _, n := range counts[:stage] {
		lo += n
	}
	return lo, lo + counts[stage]
}

// refLayers is the layers of group g that stage stage holds, ascending.
func refLayers(l Layout, p Parallel, g, stage int) []int {
	lo, hi := refStage(l.Layers, p, stage)
	var out []int
	for _, L := range l.Groups[g].Layers {
		if L >= lo && L < hi {
			out = append(out, L)
		}
	}
	return out
}

// refNeeded is the global blocks [first, end) a receiver of a prompt of
// prompt tokens needs of a group with window window (0: full attention)
// after hit prefix-hit blocks: the blocks of the last window tokens (every
// token with full attention), less the hit ones.
func refNeeded(prompt, window, tpb, hit int) (first, end int) {
	end = (prompt + tpb - 1) / tpb
	firstTok := 0
	if window > 0 && prompt > window {
		firstTok = prompt - window
	}
	first = min(max(firstTok/tpb, hit), end)
	return first, end
}

// refMem is one rank's memory of one layer group laid out as a framework
// lays it out; off computes where an element lies from the framework's
// tensor shape alone.
type refMem struct {
	kind                  string
	layers                []int // global layers, ascending (the reference's)
	headLo, heads         int
	parts, tpb, dim, elem int
	blocks                int
	base, vbase           []uint64 // per local layer: tensor (K) start, V start (split)
	poolOff, poolStride   uint64
	region                uint64
	desc                  *KVMemory // what the code under test is given
	geo                   PoolGeometry
	buf                   []byte
	count                 []uint8
	run                   BlockRun
	nl, h, t, d, e, p     uint64 // dimensions as uint64 (nl: local layers)
}

var refKinds = []string{"nhd", "nhdstrided", "hnd", "split", "pool", "flashinfer", "crosslayer"}
var refMLAKinds = []string{"mla", "pool", "mlacross"}

// off is the region offset of element d of token t of local head h of
// part p of the i-th local layer in block b.
func (m *refMem) off(i, p, h, b, t, d int) uint64 {
	I, P, H, B, T, D := uint64(i), uint64(p), uint64(h), uint64(b), uint64(t), uint64(d)
	vec := m.d * m.e
	switch m.kind {
	case "nhd", "nhdstrided": // per layer [2, blocks, tpb, heads, dim]
		return m.base[i] + (((P*uint64(m.blocks)+B)*m.t+T)*m.h+H)*vec + D*m.e
	case "hnd": // per layer [2, blocks, heads, tpb, dim]
		return m.base[i] + (((P*uint64(m.blocks)+B)*m.h+H)*m.t+T)*vec + D*m.e
	case "split": // per layer K and V, each [blocks, tpb, heads, dim]
		o := m.base[i]
		if p == 1 {
			o = m.vbase[i]
		}
		return o + ((B*m.t+T)*m.h+H)*vec + D*m.e
	case "mla": // per layer [blocks, tpb, dim]
		return m.base[i] + (B*m.t+T)*vec + D*m.e
	case "pool": // TensorRT-LLM: [blocks, layers, parts, heads, tpb, dim], blocks padded
		return m.poolOff + B*m.poolStride + (((I*m.p+P)*m.h+H)*m.t+T)*vec + D*m.e
	case "flashinfer": // per layer [blocks, 2, tpb, heads, dim]
		return m.base[i] + (((B*2+P)*m.t+T)*m.h+H)*vec + D*m.e
	case "crosslayer": // vLLM cross-layer, FlashAttention HND: [blocks, heads, layers, 2, tpb, dim]
		return m.base[0] + ((((B*m.h+H)*m.nl+I)*2+P)*m.t+T)*vec + D*m.e
	case "mlacross": // one tensor [blocks, layers, tpb, dim]
		return m.base[0] + ((B*m.nl+I)*m.t+T)*vec + D*m.e
	}
	panic(m.kind)
}

// newRefMem lays out kind for layers and heads [headLo, headLo+heads) of
// l, blocks blocks, and builds the descriptor the code under test gets
// from s (Shape's answer for the rank) through the constructor a framework
// adapter would call.
func newRefMem(t *rapid.T, l Layout, s Shape, g int, kind string, layers []int, headLo, heads, blocks int, label string) *refMem {
	m := &refMem{kind: kind, layers: layers, headLo: headLo, heads: heads, parts: l.Parts(), tpb: l.TokensPerBlock,
		dim: l.HeadDim, elem: l.DTypeBytes, blocks: blocks}
	m.nl, m.h, m.t, m.d, m.e, m.p = uint64(len(layers)), uint64(heads), uint64(m.tpb), uint64(m.dim), uint64(m.elem), uint64(m.parts)
	gap := func(what string) uint64 { return uint64(rapid.IntRange(0, 7).Draw(t, label+what)) }
	vec := m.d * m.e
	blk := m.h * m.t * vec // one block of one (layer, part) tensor
	B := uint64(blocks)
	end := gap("offset")
	var err error
	switch kind {
	case "nhd", "nhdstrided", "hnd", "flashinfer", "mla":
		per := 2 * B * blk
		if kind == "mla" {
			per = B * blk
		}
		for range layers {
			m.base = append(m.base, end)
			end += per + gap("gap")
		}
		m.region = end + gap("tail")
		switch kind {
		case "nhd":
			m.desc, err = NHDMemory(l, s, g, blocks, m.base, m.region)
		case "hnd":
			m.desc, err = HNDMemory(l, s, g, blocks, m.base, m.region)
		case "mla":
			m.desc, err = MLAMemory(l, s, g, blocks, m.base, m.region)
		case "nhdstrided": // PyTorch's strides, V after K by default (KV 0)
			m.desc, err = FrameworkMemoryStrided("nhd", l, s, g, blocks, m.base, nil,
				TensorStrides{Block: blk, Token: m.h * vec, Head: vec, Elem: m.e}, m.region)
		case "flashinfer":
			m.desc, err = FrameworkMemoryStrided("nhd", l, s, g, blocks, m.base, nil,
				TensorStrides{Block: 2 * blk, Token: m.h * vec, Head: vec, Elem: m.e, KV: blk}, m.region)
		}
	case "split":
		m.base, m.vbase = make([]uint64, len(layers)), make([]uint64, len(layers))
		for _, which := range rapid.Permutation([]int{0, 1}).Draw(t, label+"kvOrder") {
			for i := range layers {
				if which == 0 {
					m.base[i] = end
				} else {
					m.vbase[i] = end
				}
				end += B*blk + gap("gap")
			}
		}
		m.region = end + gap("tail")
		m.desc, err = SplitKVMemory(l, s, g, blocks, m.base, m.vbase, m.region)
	case "pool":
		m.poolOff = end
		m.poolStride = m.nl*m.p*blk + uint64(rapid.SampledFrom([]int{0, 0, 1, 5}).Draw(t, label+"pad"))
		m.geo = PoolGeometry{Offset: m.poolOff, BlockBytes: m.poolStride, Blocks: blocks}
		m.region = m.poolOff + B*m.poolStride // PoolMemory's region ends with the pool
		m.desc, err = PoolMemory(l, s, g, m.geo)
	case "crosslayer":
		row := m.t * vec
		m.base = []uint64{end}
		offs := make([]uint64, len(layers))
		for i := range offs {
			offs[i] = end + uint64(i)*2*row
		}
		m.region = end + B*m.h*m.nl*2*row + gap("tail")
		m.desc, err = FrameworkMemoryStrided("hnd", l, s, g, blocks, offs, nil,
			TensorStrides{Block: m.h * m.nl * 2 * row, Token: vec, Head: m.nl * 2 * row, Elem: m.e, KV: row}, m.region)
	case "mlacross":
		m.base = []uint64{end}
		offs := make([]uint64, len(layers))
		for i := range offs {
			offs[i] = end + uint64(i)*blk
		}
		m.region = end + B*m.nl*blk + gap("tail")
		m.desc, err = FrameworkMemoryStrided("mla", l, s, g, blocks, offs, nil,
			TensorStrides{Block: m.nl * blk, Token: vec, Head: blk, Elem: m.e}, m.region)
	}
	if err != nil {
		t.Fatalf("%s memory of layers %v heads [%d,+%d): %v", kind, layers, headLo, heads, err)
	}
	m.buf, m.count = make([]byte, m.region), make([]uint8, m.region)
	return m
}

// each calls f for every byte of every element of the run's blocks: its
// offset and its reference value.
func (m *refMem) each(f func(off uint64, want byte)) {
	for k, id := range m.run.IDs {
		global := m.run.First + k
		for i, L := range m.layers {
			for p := range m.parts {
				for h := range m.heads {
					for tk := range m.tpb {
						for d := range m.dim {
							o := m.off(i, p, h, int(id), tk, d)
							for x := range m.elem {
								f(o+uint64(x), kvByte(L, p, m.headLo+h, global*m.tpb+tk, d*m.elem+x))
							}
						}
					}
				}
			}
		}
	}
}

// TestPropertyRequestMatchesReferenceModel runs whole random requests —
// TP split, gather or equal, MLA replication, PP on both sides with
// uneven Stages, up to three layer groups with windows, prefix hits,
// prompts ending mid-block, chunks handed whole or in layer parts cut
// anywhere, each rank's memory in a framework's layout (vLLM NHD, by kind
// or by strides, HND, FlashInfer, cross-layer; split K/V; MLA and a
// cross-layer latent cache; TensorRT-LLM pools through
// NewPlan or NewMemoryPlan) — through NewPeerMap, Project and the plans,
// and compares every byte of every generation rank's region with the
// reference model: each byte of an element it needs holds the context's
// value and was written once; every other byte was not written.
func TestPropertyRequestMatchesReferenceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		layers := rapid.IntRange(1, 16).Draw(t, "layers")
		l := Layout{Name: "ref", Layers: layers, HeadDim: rapid.IntRange(1, 4).Draw(t, "headDim"),
			DTypeBytes: rapid.IntRange(1, 2).Draw(t, "dtype"), TokensPerBlock: rapid.SampledFrom([]int{1, 2, 3, 4, 8, 16}).Draw(t, "tpb"),
			MLA: rapid.IntRange(0, 3).Draw(t, "mla") == 0}
		var ctx, gen Parallel
		if l.MLA {
			l.KVHeads = 1
			ctx.TP, gen.TP = rapid.IntRange(1, 8).Draw(t, "ctxTP"), rapid.IntRange(1, 8).Draw(t, "genTP")
		} else {
			l.KVHeads = rapid.SampledFrom([]int{1, 2, 3, 4, 6, 8, 12, 16}).Draw(t, "heads")
			var divs []int
			for d := 1; d <= l.KVHeads; d++ {
				if l.KVHeads%d == 0 {
					divs = append(divs, d)
				}
			}
			ctx.TP, gen.TP = rapid.SampledFrom(divs).Draw(t, "ctxTP"), rapid.SampledFrom(divs).Draw(t, "genTP")
		}
		ctx.PP = rapid.IntRange(1, min(layers, max(1, 16/ctx.TP))).Draw(t, "ctxPP")
		gen.PP = rapid.IntRange(1, min(layers, max(1, 16/gen.TP))).Draw(t, "genPP")
		ctx.Stages = drawStages(t, layers, ctx.PP, "ctx")
		gen.Stages = drawStages(t, layers, gen.PP, "gen")
		ng := rapid.IntRange(1, min(3, layers)).Draw(t, "groups")
		l.Groups = make([]LayerGroup, ng)
		for L := range layers {
			g := L % ng
			if L >= ng {
				g = rapid.IntRange(0, ng-1).Draw(t, "group")
			}
			l.Groups[g].Layers = append(l.Groups[g].Layers, L)
		}
		for g := range l.Groups {
			l.Groups[g].Name = fmt.Sprint("g", g)
			if rapid.Bool().Draw(t, "windowed") {
				l.Groups[g].Window = rapid.IntRange(1, 60).Draw(t, "window")
			}
		}
		pm, err := NewPeerMap(l, ctx, gen)
		if err != nil {
			t.Fatal(err)
		}

		tpb := l.TokensPerBlock
		prompt := rapid.IntRange(1, 70).Draw(t, "prompt")
		nBlocks := (prompt + tpb - 1) / tpb
		need := make([][2]int, ng)
		srcFirst := make([]int, ng)
		for g, grp := range l.Groups {
			hit := rapid.IntRange(0, prompt/tpb).Draw(t, "hit") // whole blocks only
			need[g][0], need[g][1] = refNeeded(prompt, grp.Window, tpb, hit)
			if f, e := NeededRange(prompt, grp.Window, tpb, hit); f != need[g][0] || e != need[g][1] {
				t.Fatalf("NeededRange(%d tokens, window %d, %d a block, %d hit) = [%d,%d), want [%d,%d)",
					prompt, grp.Window, tpb, hit, f, e, need[g][0], need[g][1])
			}
			resident, _ := refNeeded(prompt, grp.Window, tpb, 0)
			srcFirst[g] = rapid.IntRange(0, resident).Draw(t, "srcFirst")
		}

		kinds := refKinds
		if l.MLA {
			kinds = refMLAKinds
		}
		// side lays out every rank's memory of every group (nil where the
		// rank holds none of the group's layers).
		side := func(p Parallel, first []int, label string) [][]*refMem {
			out := make([][]*refMem, p.Size())
			for i := range out {
				r := Rank{TP: i % p.TP, PP: i / p.TP}
				s, err := l.Shape(p, r)
				if err != nil {
					t.Fatal(err)
				}
				hlo, hn := refHeads(l, r.TP, p.TP)
				out[i] = make([]*refMem, ng)
				for g := range l.Groups {
					ls := refLayers(l, p, g, r.PP)
					if len(ls) == 0 {
						if len(s.Layers[g]) != 0 {
							t.Fatalf("%s rank %v: Shape gives group %d layers %v, the reference none", label, r, g, s.Layers[g])
						}
						continue
					}
					n := nBlocks - first[g]
					pool := n + rapid.IntRange(0, 3).Draw(t, label+"extra")
					m := newRefMem(t, l, s, g, rapid.SampledFrom(kinds).Draw(t, label+"kind"), ls, hlo, hn, pool, label)
					m.run = BlockRun{First: first[g], IDs: rapid.Permutation(idRange(0, pool)).Draw(t, label+"ids")[:n]}
					out[i][g] = m
				}
			}
			return out
		}
		firsts := make([]int, ng)
		for g := range need {
			firsts[g] = need[g][0]
		}
		src, dst := side(ctx, srcFirst, "ctx"), side(gen, firsts, "gen")
		for _, rank := range src {
			for _, m := range rank {
				if m != nil {
					garbage(m.buf, 1)
					m.each(func(off uint64, want byte) { m.buf[off] = want })
				}
			}
		}
		for _, rank := range dst {
			for _, m := range rank {
				if m != nil {
					garbage(m.buf, 2)
				}
			}
		}

		// What each generation rank expects from its writers, a block:
		// the bytes it holds of the group.
		for i, rank := range dst {
			for g, m := range rank {
				var sum, want uint64
				for _, link := range pm.Links() {
					if gen.Index(link.Gen) == i {
						sum += link.BytesPerBlock(l, g)
					}
				}
				if m != nil {
					want = m.nl * m.p * m.h * m.t * m.d * m.e
				}
				if sum != want {
					t.Fatalf("gen %v group %d: links carry %d bytes a block, the rank holds %d", gen.RankAt(i), g, sum, want)
				}
			}
		}

		chunkTokens := tpb * rapid.IntRange(1, nBlocks).Draw(t, "chunkBlocks")
		for start := 0; start < prompt; start += chunkTokens {
			end := min(start+chunkTokens, prompt)
			c := Chunk{Start: start, End: end, FirstBlock: start / tpb, Last: end == prompt}
			parts := []LayerPart{{}}
			if layers > 1 && rapid.Bool().Draw(t, "inParts") {
				parts = parts[:0]
				lo := 0
				for lo < layers {
					hi := rapid.IntRange(lo+1, layers).Draw(t, "partEnd")
					parts = append(parts, LayerPart{Lo: lo, Hi: hi, Of: layers})
					lo = hi
				}
			}
			for _, part := range parts {
				c.Layers = part
				for _, link := range pm.Links() {
					for g := range l.Groups {
						sub := link
						sub.Layers = make([][]int, ng)
						for _, L := range link.Layers[g] {
							if part.Contains(L) {
								sub.Layers[g] = append(sub.Layers[g], L)
							}
						}
						if len(sub.Layers[g]) == 0 {
							continue
						}
						sm, dm := src[ctx.Index(link.Ctx)][g], dst[gen.Index(link.Gen)][g]
						if sm == nil || dm == nil {
							t.Fatalf("link %v->%v carries group %d layers %v, which the reference gives to no memory of one end",
								link.Ctx, link.Gen, g, sub.Layers[g])
						}
						sids, dids, err := Project(c, tpb, sm.run, dm.run)
						if err != nil {
							t.Fatalf("Project(%v, group %d, %v->%v): %v", c, g, link.Ctx, link.Gen, err)
						}
						var p *Plan
						if sm.kind == "pool" && dm.kind == "pool" && rapid.Bool().Draw(t, "newPlan") {
							p, err = pm.Plan(sub, g, sm.geo, dm.geo)
						} else {
							p, err = NewMemoryPlan(sub, g, sm.desc, dm.desc)
						}
						if err != nil && errors.Is(err, ErrBadMemory) && strings.Contains(err.Error(), "pieces a block") {
							// Head vectors of a byte or two, as only a test
							// draws, crossing NHD and HND: refused by design.
							t.Skip(err)
						}
						if err != nil {
							t.Fatalf("plan %v->%v group %d (%s to %s): %v", link.Ctx, link.Gen, g, sm.kind, dm.kind, err)
						}
						segs, err := p.Append(nil, sids, dids)
						if err != nil {
							t.Fatal(err)
						}
						execute(t, segs, sm.buf, dm.buf, dm.count)
					}
				}
			}
		}

		for i, rank := range dst {
			for g, m := range rank {
				if m == nil {
					continue
				}
				needed := make([]bool, len(m.buf))
				m.each(func(off uint64, want byte) {
					needed[off] = true
					if m.count[off] != 1 || m.buf[off] != want {
						t.Fatalf("gen %v group %d (%s, layers %v, heads [%d,+%d), blocks [%d,%d)): byte %d written %d times, holds %#x, want %#x",
							gen.RankAt(i), g, m.kind, m.layers, m.headLo, m.heads, m.run.First, m.run.End(), off, m.count[off], m.buf[off], want)
					}
				})
				for off, n := range m.count {
					if !needed[off] && n != 0 {
						t.Fatalf("gen %v group %d (%s): byte %d, in no needed element, written %d times", gen.RankAt(i), g, m.kind, off, n)
					}
				}
			}
		}
	})
}
