package kvcache

import (
	"testing"

	"pgregory.net/rapid"
)

// TestPropertyPeerMapCoversEachHeadLayerOnce checks the peer map at sizes
// the byte-level properties cannot reach (up to 96 layers, 64 heads, TP 64,
// PP 16, uneven stage splits, MLA): for every generation rank, every
// (group, layer, head) it holds is carried by exactly one link, from a
// context rank that holds it; no link carries what either end lacks;
// WritersOf lists exactly the ranks of the links into it; and each link's
// BytesPerBlock is its carried heads × layers × parts × block of a head.
func TestPropertyPeerMapCoversEachHeadLayerOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		layers := rapid.IntRange(1, 96).Draw(t, "layers")
		l := Layout{Name: "pm", Layers: layers, HeadDim: 2, DTypeBytes: 1, TokensPerBlock: 2,
			MLA: rapid.IntRange(0, 3).Draw(t, "mla") == 0}
		var ctx, gen Parallel
		if l.MLA {
			l.KVHeads = 1
			ctx.TP, gen.TP = rapid.IntRange(1, 64).Draw(t, "ctxTP"), rapid.IntRange(1, 64).Draw(t, "genTP")
		} else {
			l.KVHeads = rapid.SampledFrom([]int{1, 2, 4, 6, 8, 12, 16, 24, 32, 64}).Draw(t, "heads")
			var divs []int
			for d := 1; d <= l.KVHeads; d++ {
				if l.KVHeads%d == 0 {
					divs = append(divs, d)
				}
			}
			ctx.TP, gen.TP = rapid.SampledFrom(divs).Draw(t, "ctxTP"), rapid.SampledFrom(divs).Draw(t, "genTP")
		}
		ctx.PP = rapid.IntRange(1, min(layers, 16)).Draw(t, "ctxPP")
		gen.PP = rapid.IntRange(1, min(layers, 16)).Draw(t, "genPP")
		// Up to three groups, layers dealt at random.
		ng := rapid.IntRange(1, min(3, layers)).Draw(t, "groups")
		l.Groups = make([]LayerGroup, ng)
		for L := range layers {
			g := L % ng // every group gets a layer
			if L >= ng {
				g = rapid.IntRange(0, ng-1).Draw(t, "group")
			}
			l.Groups[g].Layers = append(l.Groups[g].Layers, L)
		}
		pm, err := NewPeerMap(l, ctx, gen)
		if err != nil {
			t.Fatal(err)
		}
		type key struct{ g, layer, head int }
		for gi := range gen.Size() {
			gr := gen.RankAt(gi)
			gs, _ := pm.GenShape(gr)
			got := map[key]Rank{}
			writers := map[Rank]bool{}
			for _, link := range pm.Links() {
				if link.Gen != gr {
					continue
				}
				writers[link.Ctx] = true
				cs, _ := pm.CtxShape(link.Ctx)
				var carried uint64
				for g, ls := range link.Layers {
					for _, L := range ls {
						if cs.LayerIndex(g, L) < 0 || gs.LayerIndex(g, L) < 0 {
							t.Fatalf("link %v->%v carries group %d layer %d that one end lacks", link.Ctx, gr, g, L)
						}
						for h := link.HeadLo; h < link.HeadHi; h++ {
							if h < cs.HeadLo || h >= cs.HeadHi || h < gs.HeadLo || h >= gs.HeadHi {
								t.Fatalf("link %v->%v carries head %d that one end lacks", link.Ctx, gr, h)
							}
							k := key{g, L, h}
							if prev, dup := got[k]; dup {
								t.Fatalf("gen %v group %d layer %d head %d written by %v and %v", gr, g, L, h, prev, link.Ctx)
							}
							got[k] = link.Ctx
						}
					}
					want := uint64(len(ls)) * uint64(l.Parts()) * uint64(link.HeadHi-link.HeadLo) *
						uint64(l.TokensPerBlock) * uint64(l.TokenBytes())
					if b := link.BytesPerBlock(l, g); b != want {
						t.Fatalf("link %v->%v group %d: BytesPerBlock %d, want %d", link.Ctx, gr, g, b, want)
					}
					carried += want
				}
				if carried == 0 {
					t.Fatalf("link %v->%v carries nothing", link.Ctx, gr)
				}
			}
			for g, ls := range gs.Layers {
				for _, L := range ls {
					for h := gs.HeadLo; h < gs.HeadHi; h++ {
						if _, ok := got[key{g, L, h}]; !ok {
							t.Fatalf("gen %v group %d layer %d head %d written by no link", gr, g, L, h)
						}
					}
				}
			}
			ws := pm.WritersOf(gr)
			if len(ws) != len(writers) {
				t.Fatalf("WritersOf(%v) = %v, links come from %v", gr, ws, writers)
			}
			for _, w := range ws {
				if !writers[w] {
					t.Fatalf("WritersOf(%v) = %v lists %v, which has no link to it", gr, ws, w)
				}
			}
		}
	})
}
