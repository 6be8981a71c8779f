package kvcache

import (
	"testing"

	"pgregory.net/rapid"
)

// drawStages draws, half the time, a Stages value splitting layers over
// pp stages (each at least one layer) that need not be the default split.
func drawStages(t *rapid.T, layers, pp int, label string) string {
	if pp < 2 || rapid.Bool().Draw(t, label+"defaultStages") {
		return ""
	}
	counts := make([]int, pp)
	for i := range counts {
		counts[i] = 1
	}
	for range layers - pp {
		counts[rapid.IntRange(0, pp-1).Draw(t, label+"stage")]++
	}
	return Parallel{TP: 1, PP: pp, Stages: FormatStages(counts)}.Normal(layers).Stages
}

// memGroup is one rank's memory of one layer group: its descriptor, its
// region's bytes, the request's blocks in it, and writes per byte.
type memGroup struct {
	m     *KVMemory
	buf   []byte
	run   BlockRun
	count []uint8
}

// TestPropertyRequestWrittenOnceAcrossWriters runs whole requests end to
// end, over every writer: a random layout (one or two layer groups, either
// possibly sliding-window), context and generation parallelism (TP split or
// gather, MLA replication, PP on both sides, uneven Stages), a memory of
// any kind per rank and group, prefix hits per group, the blocks each
// group needs from NeededRange, chunks of whole blocks with a short last
// one, each chunk handed whole or in layer parts (the link's layers that a
// part holds, as a sender plans a part). For every generation rank and
// group, every element of every needed block is written exactly once, with
// the context's bytes, by all writers together, and no other byte of its
// region is written.
func TestPropertyRequestWrittenOnceAcrossWriters(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawPlanScenario(t)
		l := s.l
		s.ctx.Stages = drawStages(t, l.Layers, s.ctx.PP, "ctx")
		s.gen.Stages = drawStages(t, l.Layers, s.gen.PP, "gen")
		pm, err := NewPeerMap(l, s.ctx, s.gen)
		if err != nil {
			t.Fatal(err)
		}
		tpb := l.TokensPerBlock
		prompt := rapid.IntRange(1, 40).Draw(t, "prompt")
		nBlocks := l.BlocksFor(prompt)
		need := make([][2]int, len(l.Groups)) // [first, end) per group
		srcFirst := make([]int, len(l.Groups))
		for g, grp := range l.Groups {
			hit := rapid.IntRange(0, prompt/tpb).Draw(t, "hitBlocks") // full blocks only
			need[g][0], need[g][1] = NeededRange(prompt, grp.Window, tpb, hit)
			if need[g][1] != nBlocks {
				t.Fatalf("NeededRange end %d, prompt has %d blocks", need[g][1], nBlocks)
			}
			rf, _ := ResidentRange(prompt, grp.Window, tpb)
			srcFirst[g] = rapid.IntRange(0, rf).Draw(t, "srcFirst") // the sender keeps its window at least
		}
		side := func(p Parallel, shape func(Rank) (Shape, error), first []int, label string) [][]*memGroup {
			out := make([][]*memGroup, p.Size())
			for i := range out {
				sh, err := shape(p.RankAt(i))
				if err != nil {
					t.Fatal(err)
				}
				out[i] = make([]*memGroup, len(l.Groups))
				for g := range l.Groups {
					n := nBlocks - first[g]
					pool := n + rapid.IntRange(0, 3).Draw(t, label+"extra")
					m := drawMemory(t, l, sh, g, pool, label)
					ids := rapid.Permutation(idRange(0, pool)).Draw(t, label+"ids")[:n]
					out[i][g] = &memGroup{m: m, buf: make([]byte, m.RegionLen), run: BlockRun{First: first[g], IDs: ids},
						count: make([]uint8, m.RegionLen)}
				}
			}
			return out
		}
		firsts := func(k int) []int {
			out := make([]int, len(need))
			for g := range need {
				out[g] = need[g][k]
			}
			return out
		}
		ctx := side(s.ctx, pm.CtxShape, srcFirst, "ctx")
		gen := side(s.gen, pm.GenShape, firsts(0), "gen")
		for _, rank := range ctx {
			for _, mg := range rank {
				garbage(mg.buf, 1)
				fillMemory(mg.m, mg.buf, mg.run.IDs, mg.run.First)
			}
		}
		for _, rank := range gen {
			for _, mg := range rank {
				garbage(mg.buf, 2)
			}
		}

		chunks, err := Chunks(prompt, tpb*rapid.IntRange(1, nBlocks).Draw(t, "chunkBlocks"), tpb)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chunks {
			for _, part := range SplitLayers(l.Layers, rapid.IntRange(0, min(l.Layers, 3)).Draw(t, "parts")) {
				for _, link := range pm.Links() {
					for g := range l.Groups {
						sub := link
						sub.Layers = make([][]int, len(link.Layers))
						for _, L := range link.Layers[g] {
							if part.Contains(L) {
								sub.Layers[g] = append(sub.Layers[g], L)
							}
						}
						if len(sub.Layers[g]) == 0 {
							continue
						}
						sp, dp := ctx[s.ctx.Index(link.Ctx)][g], gen[s.gen.Index(link.Gen)][g]
						sids, dids, err := Project(c, tpb, sp.run, dp.run)
						if err != nil {
							t.Fatalf("Project(%v, group %d, %v->%v): %v", c, g, link.Ctx, link.Gen, err)
						}
						p, err := NewMemoryPlan(sub, g, sp.m, dp.m)
						if err != nil {
							skipPieceBound(t, err, sp.m, dp.m)
							t.Fatal(err)
						}
						segs, err := p.Append(nil, sids, dids)
						if err != nil {
							t.Fatal(err)
						}
						if moved := execute(t, segs, sp.buf, dp.buf, dp.count); moved != uint64(len(sids))*sub.BytesPerBlock(l, g) {
							t.Fatalf("link %v->%v group %d %v: moved %d bytes, the link carries %d a block × %d",
								link.Ctx, link.Gen, g, c, moved, sub.BytesPerBlock(l, g), len(sids))
						}
					}
				}
			}
		}

		for i, rank := range gen {
			gr := s.gen.RankAt(i)
			for g, mg := range rank {
				needed := make([]bool, len(mg.buf))
				e := mg.m.ElemBytes
				eachElement(mg.m, mg.run.IDs, mg.run.First, mg.m.Layers, mg.m.HeadLo, mg.m.HeadLo+mg.m.Heads,
					func(off uint64, layer, part, head, token, elem int) {
						for b := range e {
							o := off + uint64(b)
							needed[o] = true
							if mg.count[o] != 1 {
								t.Fatalf("gen %v group %d: layer %d part %d head %d token %d elem %d byte %d written %d times",
									gr, g, layer, part, head, token, elem, b, mg.count[o])
							}
							if want := kvByte(layer, part, head, token, elem*e+b); mg.buf[o] != want {
								t.Fatalf("gen %v group %d: layer %d part %d head %d token %d elem %d byte %d = %#x, want %#x",
									gr, g, layer, part, head, token, elem, b, mg.buf[o], want)
							}
						}
					})
				for off, c := range mg.count {
					if !needed[off] && c != 0 {
						t.Fatalf("gen %v group %d: byte %d outside the needed elements written %d times", gr, g, off, c)
					}
				}
			}
		}
	})
}
