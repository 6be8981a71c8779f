package kvcache

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// planFor builds the plan of the link ctx->gen of m for group g with pools
// of n blocks, block stride = rank-local block bytes + pad.
func planFor(t testing.TB, m *PeerMap, ctx, gen Rank, g, n int, pad uint64) *Plan {
	t.Helper()
	link, ok := m.Link(ctx, gen)
	if !ok {
		t.Fatalf("no link %v->%v", ctx, gen)
	}
	cs, _ := m.CtxShape(ctx)
	gs, _ := m.GenShape(gen)
	p, err := m.Plan(link, g,
		PoolGeometry{Offset: 0, BlockBytes: cs.BlockBytes(m.Layout(), g) + pad, Blocks: n},
		PoolGeometry{Offset: 0, BlockBytes: gs.BlockBytes(m.Layout(), g) + pad, Blocks: n})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlanWholeBlocks(t *testing.T) {
	l := testDense(2, 4, nil) // block: 2 layers × 2 parts × heads × 4 tokens × 8 bytes
	m, err := NewPeerMap(l, Parallel{TP: 2, PP: 1}, Parallel{TP: 2, PP: 1})
	if err != nil {
		t.Fatal(err)
	}
	p := planFor(t, m, rnk(1, 0), rnk(1, 0), 0, 16, 0)
	const bb = 2 * 2 * 2 * 4 * 8
	if st := p.Stats(); !st.WholeBlock || st.PiecesPerBlock != 1 || st.BytesPerBlock != bb || st.MinPiece != bb || st.MaxPiece != bb {
		t.Fatalf("Stats = %+v", st)
	}
	for _, tc := range []struct {
		name     string
		src, dst []BlockID
		want     []Segment
	}{
		{"contiguous both sides", idRange(0, 4), idRange(8, 12), []Segment{{0, 8 * bb, 4 * bb}}},
		{"contiguous source only", idRange(0, 3), []BlockID{5, 3, 4}, []Segment{{0, 5 * bb, bb}, {bb, 3 * bb, 2 * bb}}},
		{"descending", []BlockID{3, 2}, []BlockID{3, 2}, []Segment{{3 * bb, 3 * bb, bb}, {2 * bb, 2 * bb, bb}}},
		{"runs", []BlockID{0, 1, 7, 8, 9, 2}, []BlockID{4, 5, 6, 7, 8, 0},
			[]Segment{{0, 4 * bb, 2 * bb}, {7 * bb, 6 * bb, 3 * bb}, {2 * bb, 0, bb}}},
		{"empty", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Append(nil, tc.src, tc.dst)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("segments %v, want %v", got, tc.want)
			}
			if n, err := p.Count(tc.src, tc.dst); err != nil || n != len(tc.want) {
				t.Fatalf("Count = %d, %v; want %d", n, err, len(tc.want))
			}
			if p.Bytes(len(tc.src)) != uint64(len(tc.src))*bb {
				t.Fatalf("Bytes(%d) = %d", len(tc.src), p.Bytes(len(tc.src)))
			}
		})
	}
}

func TestPlanHeadSplit(t *testing.T) {
	// 2 layers, 4 heads; ctx TP1 holds all 4 heads, gen TP2 rank 1 holds
	// heads [2,4). unit = 4 tokens × 4 dims × 2 bytes = 32 bytes per head.
	l := testDense(2, 4, nil)
	m, err := NewPeerMap(l, Parallel{TP: 1, PP: 1}, Parallel{TP: 2, PP: 1})
	if err != nil {
		t.Fatal(err)
	}
	const unit = 32
	p := planFor(t, m, rnk(0, 0), rnk(1, 0), 0, 8, 0)
	const sbb, dbb = 2 * 2 * 4 * unit, 2 * 2 * 2 * unit
	// Per (layer, part): src offset ((li*2+part)*4 + 2)*unit, dst ((li*2+part)*2)*unit;
	// destination pieces abut, source pieces do not.
	got, err := p.Append(nil, []BlockID{1}, []BlockID{3})
	if err != nil {
		t.Fatal(err)
	}
	var want []Segment
	for lp := range uint64(4) {
		want = append(want, Segment{Src: sbb + (lp*4+2)*unit, Dst: 3*dbb + lp*2*unit, Len: 2 * unit})
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("segments %v, want %v", got, want)
	}
	if st := p.Stats(); st.WholeBlock || st.PiecesPerBlock != 4 || st.BytesPerBlock != 8*unit {
		t.Fatalf("Stats = %+v", st)
	}

	// Gather: ctx TP2 rank 1 (heads [2,4)) into gen TP1 (heads [0,4)):
	// source pieces abut, destination pieces do not.
	m2, err := NewPeerMap(l, Parallel{TP: 2, PP: 1}, Parallel{TP: 1, PP: 1})
	if err != nil {
		t.Fatal(err)
	}
	p2 := planFor(t, m2, rnk(1, 0), rnk(0, 0), 0, 8, 0)
	got, err = p2.Append(nil, []BlockID{0, 1}, []BlockID{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("gather of 2 blocks: %d segments, want 8: %v", len(got), got)
	}
}

// TestPlanPartialLayers covers a pipeline link that carries some of the
// source block's layers: layers 2,3 are the second half of each source
// block (ctx PP1 holds 0..3) and the whole destination block (gen PP2 stage
// 1 holds 2..3). Block ids consecutive on both sides do not merge: the first
// half of the next source block lies between.
//
// Pieces can only abut across blocks when a link carries whole blocks (a
// piece that starts at both blocks' starts and one that ends at both blocks'
// ends imply the link covers both shapes entirely), so cross-block merging
// of sub-range pieces is left to the reference comparison in
// TestPropertyCoalescingIsMaximal.
func TestPlanPartialLayers(t *testing.T) {
	l := testDense(4, 2, nil)
	m, err := NewPeerMap(l, Parallel{TP: 1, PP: 1}, Parallel{TP: 1, PP: 2})
	if err != nil {
		t.Fatal(err)
	}
	p := planFor(t, m, rnk(0, 0), rnk(0, 1), 0, 4, 0)
	got, err := p.Append(nil, []BlockID{0, 1}, []BlockID{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	half := p.BytesPerBlock()
	want := []Segment{{half, 0, half}, {3 * half, half, half}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("segments %v, want %v", got, want)
	}
	if st := p.Stats(); st.WholeBlock || st.PiecesPerBlock != 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestPlanAppendReusesAndDoesNotMergeIntoCallerSegments(t *testing.T) {
	l := testDense(2, 4, nil)
	m, _ := NewPeerMap(l, Parallel{TP: 1, PP: 1}, Parallel{TP: 1, PP: 1})
	p := planFor(t, m, rnk(0, 0), rnk(0, 0), 0, 8, 0)
	bb := p.BytesPerBlock()
	prior := []Segment{{Src: 0, Dst: 0, Len: bb}} // ends exactly where block 1 starts
	got, err := p.Append(prior, []BlockID{1}, []BlockID{1})
	if err != nil {
		t.Fatal(err)
	}
	if want := []Segment{{0, 0, bb}, {bb, bb, bb}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("segments %v, want %v (no merge into the caller's segment)", got, want)
	}
	buf := make([]Segment, 0, 8)
	allocs := testing.AllocsPerRun(100, func() {
		buf, _ = p.Append(buf[:0], []BlockID{0, 1, 3, 4}, []BlockID{5, 6, 0, 1})
	})
	if allocs != 0 || len(buf) != 2 {
		t.Fatalf("Append with capacity: %v allocs, %d segments", allocs, len(buf))
	}
}

func TestPlanErrors(t *testing.T) {
	l := testDense(4, 4, nil)
	m, err := NewPeerMap(l, Parallel{TP: 2, PP: 2}, Parallel{TP: 4, PP: 1})
	if err != nil {
		t.Fatal(err)
	}
	link, _ := m.Link(rnk(1, 0), rnk(2, 0))
	cs, _ := m.CtxShape(rnk(1, 0))
	gs, _ := m.GenShape(rnk(2, 0))
	src := PoolGeometry{Offset: 64, BlockBytes: cs.BlockBytes(l, 0), Blocks: 4}
	dst := PoolGeometry{Offset: 0, BlockBytes: gs.BlockBytes(l, 0), Blocks: 6}
	p, err := NewPlan(l, cs, gs, link, 0, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		src, dst []BlockID
		names    []string
	}{
		{"source id past pool", []BlockID{0, 4}, []BlockID{0, 1}, []string{"source block id 4", "[0,4)"}},
		{"negative source id", []BlockID{NoBlock}, []BlockID{0}, []string{"source block id -1"}},
		{"destination id past pool", []BlockID{0, 1}, []BlockID{0, 6}, []string{"destination block id 6", "[0,6)"}},
		{"mismatched lengths", []BlockID{0, 1}, []BlockID{0}, []string{"2 source ids", "1 destination ids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prior := []Segment{{1, 2, 3}}
			out, err := p.Append(prior, tc.src, tc.dst)
			if !errors.Is(err, ErrBadPlan) {
				t.Fatalf("Append err = %v", err)
			}
			if !reflect.DeepEqual(out, prior) {
				t.Fatalf("Append on error returned %v, want the caller's %v", out, prior)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %q", err, n)
				}
			}
			if _, err := p.Count(tc.src, tc.dst); !errors.Is(err, ErrBadPlan) {
				t.Fatalf("Count err = %v", err)
			}
		})
	}

	other, _ := m.Link(rnk(0, 0), rnk(0, 0))
	badHeads := link
	badHeads.HeadLo, badHeads.HeadHi = 0, 4
	badLayers := link
	badLayers.Layers = [][]int{{0, 1, 2}}
	unsorted := link
	unsorted.Layers = [][]int{{1, 0}}
	for _, tc := range []struct {
		name     string
		link     PeerLink
		g        int
		src, dst PoolGeometry
		names    []string
	}{
		{"link of other ranks", other, 0, src, dst, []string{"tp0/pp0"}},
		{"heads outside shapes", badHeads, 0, src, dst, []string{"heads [0,4)"}},
		{"layer outside stage", badLayers, 0, src, dst, []string{"layer 2"}},
		{"layers not ascending", unsorted, 0, src, dst, []string{"at 0"}},
		{"group out of range", link, 1, src, dst, []string{"group 1"}},
		{"short source stride", link, 0, PoolGeometry{BlockBytes: src.BlockBytes - 1, Blocks: 4}, dst, []string{"source block stride"}},
		{"negative pool", link, 0, src, PoolGeometry{BlockBytes: dst.BlockBytes, Blocks: -1}, []string{"-1 blocks"}},
		{"overflowing pool", link, 0, PoolGeometry{Offset: 1 << 63, BlockBytes: 1 << 62, Blocks: 2}, dst, []string{"overflows"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPlan(l, cs, gs, tc.link, tc.g, tc.src, tc.dst)
			if !errors.Is(err, ErrBadPlan) {
				t.Fatalf("NewPlan err = %v", err)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %q", err, n)
				}
			}
		})
	}
	if _, err := m.Plan(PeerLink{Ctx: rnk(5, 0), Gen: rnk(0, 0)}, 0, src, dst); !errors.Is(err, ErrBadPlan) {
		t.Fatalf("PeerMap.Plan with unknown rank: %v", err)
	}
}

func TestCostModel(t *testing.T) {
	m := CostModel{PerSegment: time.Microsecond, LinkBytesPerSec: 1e9, CopyBytesPerSec: 1e10}
	if got := m.Direct(10, 1000); got != 10*time.Microsecond+time.Microsecond {
		t.Fatalf("Direct = %v", got)
	}
	// 1000 tiny segments of 64 bytes: staging pays.
	if !m.StagingPays(1000, 64000) {
		t.Fatalf("staging 1000×64 B should pay: direct %v staged %v", m.Direct(1000, 64000), m.Staged(1000, 64000))
	}
	// One segment of 1 GB: staging only adds copies.
	if m.StagingPays(1, 1<<30) {
		t.Fatal("staging one large segment should not pay")
	}
	if (CostModel{}).Direct(5, 5) != 0 {
		t.Fatal("zero model must estimate zero")
	}
}

// --- properties ---

// planScenario is a random layout, parallelism pair and request.
type planScenario struct {
	l        Layout
	ctx, gen Parallel
}

func drawPlanScenario(t *rapid.T) planScenario {
	var s planScenario
	layers := rapid.IntRange(1, 12).Draw(t, "layers")
	s.l = Layout{
		Name:           "prop",
		Layers:         layers,
		HeadDim:        rapid.IntRange(1, 8).Draw(t, "headDim"),
		DTypeBytes:     rapid.IntRange(1, 2).Draw(t, "dtype"),
		TokensPerBlock: rapid.IntRange(1, 8).Draw(t, "tpb"),
		MLA:            rapid.IntRange(0, 4).Draw(t, "mla") == 0,
	}
	if s.l.MLA {
		s.l.KVHeads = 1
		s.ctx.TP = rapid.IntRange(1, 8).Draw(t, "ctxTP")
		s.gen.TP = rapid.IntRange(1, 8).Draw(t, "genTP")
	} else {
		s.l.KVHeads = rapid.SampledFrom([]int{1, 2, 3, 4, 6, 8}).Draw(t, "heads")
		var divs []int
		for d := 1; d <= s.l.KVHeads; d++ {
			if s.l.KVHeads%d == 0 {
				divs = append(divs, d)
			}
		}
		s.ctx.TP = rapid.SampledFrom(divs).Draw(t, "ctxTP")
		s.gen.TP = rapid.SampledFrom(divs).Draw(t, "genTP")
	}
	s.ctx.PP = rapid.IntRange(1, min(layers, 4)).Draw(t, "ctxPP")
	s.gen.PP = rapid.IntRange(1, min(layers, 4)).Draw(t, "genPP")
	window := func(label string) int {
		if rapid.Bool().Draw(t, label+"Full") {
			return 0
		}
		return rapid.IntRange(1, 40).Draw(t, label)
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
		s.l.Groups = []LayerGroup{{Name: "a", Layers: a, Window: window("windowA")}, {Name: "b", Layers: b, Window: window("windowB")}}
	} else {
		s.l.Groups = []LayerGroup{{Name: "all", Layers: LayerRange(0, layers), Window: window("window")}}
	}
	return s
}

// kvByte is the model's true KV byte at (layer, part, model head, token,
// byte within the token's head vector): a hash, so that misplaced bytes are
// caught with overwhelming probability.
func kvByte(layer, part, head, token, b int) byte {
	x := uint64(layer)<<48 ^ uint64(part)<<44 ^ uint64(head)<<32 ^ uint64(token)<<8 ^ uint64(b)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return byte(x)
}

// rankPools is one rank's region: a pool per group at geo[g], and the
// request's run of blocks in each.
type rankPools struct {
	shape Shape
	geo   []PoolGeometry
	run   []BlockRun
	buf   []byte
	count []uint8 // destination: writes per byte
}

// eachContentByte calls f for every content byte of the blocks of run in
// group g of a rank with shape s: its region offset and what it holds.
func eachContentByte(l Layout, s Shape, g int, geo PoolGeometry, run BlockRun,
	f func(off uint64, layer, part, head, token, b int)) {
	tpb, tb, parts := l.TokensPerBlock, l.TokenBytes(), l.Parts()
	for i, id := range run.IDs {
		global := run.First + i
		off := geo.Offset + uint64(id)*geo.BlockBytes
		for _, layer := range s.Layers[g] {
			for part := range parts {
				for h := s.HeadLo; h < s.HeadHi; h++ {
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

// drawPools lays out one rank's pools (random gaps and padding) and draws
// physical ids for blocks [first, end) of each group: sometimes consecutive,
// otherwise a shuffled, non-contiguous subset of a larger pool.
func drawPools(t *rapid.T, l Layout, s Shape, first, end []int, label string) *rankPools {
	rp := &rankPools{shape: s, geo: make([]PoolGeometry, len(l.Groups)), run: make([]BlockRun, len(l.Groups))}
	var off uint64
	for g := range l.Groups {
		n := end[g] - first[g]
		extra := rapid.IntRange(0, 4).Draw(t, label+"extra")
		pool := n + extra
		geo := PoolGeometry{
			Offset:     off + uint64(rapid.IntRange(0, 7).Draw(t, label+"gap")),
			BlockBytes: s.BlockBytes(l, g) + uint64(rapid.SampledFrom([]int{0, 0, 1, 5}).Draw(t, label+"pad")),
			Blocks:     pool,
		}
		ids := make([]BlockID, n)
		if rapid.Bool().Draw(t, label+"consecutive") {
			base := rapid.IntRange(0, extra).Draw(t, label+"base")
			for i := range ids {
				ids[i] = BlockID(base + i)
			}
		} else {
			all := make([]BlockID, pool)
			for i := range all {
				all[i] = BlockID(i)
			}
			perm := rapid.Permutation(all).Draw(t, label+"perm")
			copy(ids, perm)
		}
		rp.geo[g] = geo
		rp.run[g] = BlockRun{First: first[g], IDs: ids}
		off = geo.Offset + uint64(pool)*geo.BlockBytes
	}
	rp.buf = make([]byte, off+uint64(rapid.IntRange(0, 7).Draw(t, label+"tail")))
	return rp
}

// TestPropertyEveryNeededByteWrittenOnce runs whole random requests through
// PeerMap, Project and Plan into real byte buffers and checks that every byte
// of every needed destination block of every generation rank is written
// exactly once with the right value, and nothing else is touched.
func TestPropertyEveryNeededByteWrittenOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawPlanScenario(t)
		l := s.l
		m, err := NewPeerMap(l, s.ctx, s.gen)
		if err != nil {
			t.Fatal(err)
		}
		tpb := l.TokensPerBlock
		prompt := rapid.IntRange(1, 64).Draw(t, "prompt")
		nBlocks := (prompt + tpb - 1) / tpb
		hit := rapid.IntRange(0, nBlocks).Draw(t, "prefixHitBlocks")
		needFirst := make([]int, len(l.Groups))
		srcFirst := make([]int, len(l.Groups))
		ends := make([]int, len(l.Groups))
		for g, grp := range l.Groups {
			needFirst[g] = hit
			if w := grp.Window; w > 0 && prompt > w {
				needFirst[g] = max(hit, (prompt-w)/tpb)
			}
			needFirst[g] = min(needFirst[g], nBlocks)
			srcFirst[g] = rapid.IntRange(0, needFirst[g]).Draw(t, "srcFirst")
			ends[g] = nBlocks
		}

		ctxPools := make([]*rankPools, s.ctx.Size())
		for i := range ctxPools {
			cs, _ := m.CtxShape(s.ctx.RankAt(i))
			rp := drawPools(t, l, cs, srcFirst, ends, "ctx")
			for j := range rp.buf {
				rp.buf[j] = byte(0xA5 ^ j*7) // garbage outside content
			}
			for g := range l.Groups {
				eachContentByte(l, cs, g, rp.geo[g], rp.run[g], func(off uint64, layer, part, head, token, b int) {
					rp.buf[off] = kvByte(layer, part, head, token, b)
				})
			}
			ctxPools[i] = rp
		}
		genPools := make([]*rankPools, s.gen.Size())
		for i := range genPools {
			gs, _ := m.GenShape(s.gen.RankAt(i))
			rp := drawPools(t, l, gs, needFirst, ends, "gen")
			rp.count = make([]uint8, len(rp.buf))
			genPools[i] = rp
		}

		chunkTokens := tpb * rapid.IntRange(1, nBlocks).Draw(t, "chunkBlocks")
		plans := map[string]*Plan{}
		var segs []Segment
		for start := 0; start < prompt; start += chunkTokens {
			end := min(start+chunkTokens, prompt)
			c := Chunk{Start: start, End: end, FirstBlock: start / tpb, Last: end == prompt}
			for g := range l.Groups {
				for li, link := range m.Links() {
					sp, dp := ctxPools[s.ctx.Index(link.Ctx)], genPools[s.gen.Index(link.Gen)]
					sids, dids, err := Project(c, tpb, sp.run[g], dp.run[g])
					if err != nil {
						t.Fatalf("Project(%v, group %d, %v->%v): %v", c, g, link.Ctx, link.Gen, err)
					}
					key := fmt.Sprint(li, "/", g)
					p := plans[key]
					if p == nil {
						if p, err = m.Plan(link, g, sp.geo[g], dp.geo[g]); err != nil {
							t.Fatal(err)
						}
						plans[key] = p
					}
					if segs, err = p.Append(segs[:0], sids, dids); err != nil {
						t.Fatal(err)
					}
					if n, err := p.Count(sids, dids); err != nil || n != len(segs) {
						t.Fatalf("Count = %d, %v; Append gave %d", n, err, len(segs))
					}
					var total uint64
					for _, sg := range segs {
						if sg.Len == 0 || sg.Src+sg.Len > uint64(len(sp.buf)) || sg.Dst+sg.Len > uint64(len(dp.buf)) {
							t.Fatalf("segment %+v outside regions (%d, %d)", sg, len(sp.buf), len(dp.buf))
						}
						copy(dp.buf[sg.Dst:sg.Dst+sg.Len], sp.buf[sg.Src:sg.Src+sg.Len])
						for j := sg.Dst; j < sg.Dst+sg.Len; j++ {
							dp.count[j]++
						}
						total += sg.Len
					}
					if total != p.Bytes(len(sids)) {
						t.Fatalf("segments move %d bytes, Bytes says %d", total, p.Bytes(len(sids)))
					}
				}
			}
		}

		for i, rp := range genPools {
			gr := s.gen.RankAt(i)
			needed := make([]bool, len(rp.buf))
			for g := range l.Groups {
				eachContentByte(l, rp.shape, g, rp.geo[g], rp.run[g], func(off uint64, layer, part, head, token, b int) {
					needed[off] = true
					if rp.count[off] != 1 {
						t.Fatalf("gen %v group %d: byte at %d (layer %d part %d head %d token %d byte %d) written %d times",
							gr, g, off, layer, part, head, token, b, rp.count[off])
					}
					if want := kvByte(layer, part, head, token, b); rp.buf[off] != want {
						t.Fatalf("gen %v group %d: byte at %d (layer %d part %d head %d token %d byte %d) = %#x, want %#x",
							gr, g, off, layer, part, head, token, b, rp.buf[off], want)
					}
				})
			}
			for off, c := range rp.count {
				if !needed[off] && c != 0 {
					t.Fatalf("gen %v: byte %d outside needed blocks written %d times", gr, off, c)
				}
			}
		}
	})
}

// TestPropertyCoalescingIsMaximal checks Append against a reference: one
// unit segment per (block, layer, part, head), merged greedily when
// contiguous on both sides. Append must give exactly the merged list, and no
// two consecutive segments of it may be contiguous on both sides.
func TestPropertyCoalescingIsMaximal(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawPlanScenario(t)
		l := s.l
		m, err := NewPeerMap(l, s.ctx, s.gen)
		if err != nil {
			t.Fatal(err)
		}
		links := m.Links()
		link := links[rapid.IntRange(0, len(links)-1).Draw(t, "link")]
		g := rapid.IntRange(0, len(l.Groups)-1).Draw(t, "group")
		cs, _ := m.CtxShape(link.Ctx)
		gs, _ := m.GenShape(link.Gen)
		const pool = 24
		pad := func(label string) uint64 { return uint64(rapid.SampledFrom([]int{0, 0, 0, 3}).Draw(t, label)) }
		src := PoolGeometry{Offset: uint64(rapid.IntRange(0, 9).Draw(t, "srcOff")), BlockBytes: cs.BlockBytes(l, g) + pad("srcPad"), Blocks: pool}
		dst := PoolGeometry{Offset: uint64(rapid.IntRange(0, 9).Draw(t, "dstOff")), BlockBytes: gs.BlockBytes(l, g) + pad("dstPad"), Blocks: pool}
		p, err := m.Plan(link, g, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		n := rapid.IntRange(0, 30).Draw(t, "blocks")
		sids, dids := make([]BlockID, n), make([]BlockID, n)
		for i := range n {
			if i > 0 && rapid.Bool().Draw(t, "nextSrc") && sids[i-1] < pool-1 {
				sids[i] = sids[i-1] + 1
			} else {
				sids[i] = BlockID(rapid.IntRange(0, pool-1).Draw(t, "src"))
			}
			if i > 0 && rapid.Bool().Draw(t, "nextDst") && dids[i-1] < pool-1 {
				dids[i] = dids[i-1] + 1
			} else {
				dids[i] = BlockID(rapid.IntRange(0, pool-1).Draw(t, "dst"))
			}
		}

		unit := uint64(l.TokensPerBlock * l.TokenBytes())
		parts := l.Parts()
		var want []Segment
		for i := range n {
			for _, layer := range link.Layers[g] {
				for part := range parts {
					for h := link.HeadLo; h < link.HeadHi; h++ {
						so := src.Offset + uint64(sids[i])*src.BlockBytes +
							uint64((cs.LayerIndex(g, layer)*parts+part)*cs.Heads()+h-cs.HeadLo)*unit
						do := dst.Offset + uint64(dids[i])*dst.BlockBytes +
							uint64((gs.LayerIndex(g, layer)*parts+part)*gs.Heads()+h-gs.HeadLo)*unit
						if k := len(want) - 1; k >= 0 && want[k].Src+want[k].Len == so && want[k].Dst+want[k].Len == do {
							want[k].Len += unit
						} else {
							want = append(want, Segment{Src: so, Dst: do, Len: unit})
						}
					}
				}
			}
		}
		got, err := p.Append(nil, sids, dids)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Append =\n%v\nreference =\n%v", got, want)
		}
		for i := 1; i < len(got); i++ {
			a, b := got[i-1], got[i]
			if a.Src+a.Len == b.Src && a.Dst+a.Len == b.Dst {
				t.Fatalf("segments %d and %d are contiguous on both sides: %v %v", i-1, i, a, b)
			}
		}
		if c, err := p.Count(sids, dids); err != nil || c != len(got) {
			t.Fatalf("Count = %d, %v; want %d", c, err, len(got))
		}
	})
}
