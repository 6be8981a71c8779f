package kvcache

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// dense is a valid non-MLA layout with the given groups (FullAttention when nil).
func testDense(layers, heads int, groups []LayerGroup) Layout {
	if groups == nil {
		groups = FullAttention(layers)
	}
	return Layout{Name: "test", Layers: layers, KVHeads: heads, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 4, Groups: groups}
}

func testMLA(layers int) Layout {
	return Layout{Name: "mla", Layers: layers, KVHeads: 1, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 4, MLA: true, Groups: FullAttention(layers)}
}

func TestParallelIndex(t *testing.T) {
	p := Parallel{TP: 4, PP: 3}
	if p.Size() != 12 {
		t.Fatalf("Size = %d, want 12", p.Size())
	}
	for i := range p.Size() {
		r := p.RankAt(i)
		if !p.Contains(r) || p.Index(r) != i {
			t.Fatalf("RankAt(%d) = %v, Index back %d", i, r, p.Index(r))
		}
	}
	if got := p.Index(Rank{TP: 1, PP: 2}); got != 9 {
		t.Fatalf("Index(tp1/pp2) = %d, want 9 (PP*TP + TP)", got)
	}
	for _, r := range []Rank{{-1, 0}, {4, 0}, {0, 3}, {0, -1}} {
		if p.Contains(r) {
			t.Errorf("Contains(%v) = true", r)
		}
	}
}

func TestStageLayers(t *testing.T) {
	for _, tc := range []struct {
		layers, pp int
		want       [][2]int
	}{
		{80, 1, [][2]int{{0, 80}}},
		{80, 2, [][2]int{{0, 40}, {40, 80}}},
		{5, 2, [][2]int{{0, 3}, {3, 5}}},
		{7, 3, [][2]int{{0, 3}, {3, 5}, {5, 7}}},
		{61, 4, [][2]int{{0, 16}, {16, 31}, {31, 46}, {46, 61}}},
		{3, 3, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
	} {
		p := Parallel{TP: 1, PP: tc.pp}
		for s, w := range tc.want {
			lo, hi := p.StageLayers(tc.layers, s)
			if lo != w[0] || hi != w[1] {
				t.Errorf("StageLayers(%d layers, PP%d, stage %d) = [%d,%d), want %v", tc.layers, tc.pp, s, lo, hi, w)
			}
		}
	}
}

func TestShape(t *testing.T) {
	llama70 := Layout{Name: "Llama-3.1-70B", Layers: 80, KVHeads: 8, HeadDim: 128, DTypeBytes: 2, TokensPerBlock: 32, Groups: FullAttention(80)}
	twoGroups := testDense(5, 4, []LayerGroup{{Name: "a", Layers: []int{0, 2, 4}}, {Name: "b", Layers: []int{1, 3}, Window: 8}})
	for _, tc := range []struct {
		name   string
		l      Layout
		p      Parallel
		r      Rank
		want   Shape
		blocks []uint64 // BlockBytes per group
	}{
		{"llama70 TP4 PP2 tp1/pp1", llama70, Parallel{TP: 4, PP: 2}, Rank{1, 1},
			Shape{Rank: Rank{1, 1}, HeadLo: 2, HeadHi: 4, LayerLo: 40, LayerHi: 80, Layers: [][]int{LayerRange(40, 80)}},
			[]uint64{40 * 2 * 2 * 32 * 128 * 2}},
		{"uneven PP2 stage 0, two groups", twoGroups, Parallel{TP: 2, PP: 2}, Rank{1, 0},
			Shape{Rank: Rank{1, 0}, HeadLo: 2, HeadHi: 4, LayerLo: 0, LayerHi: 3, Layers: [][]int{{0, 2}, {1}}},
			[]uint64{2 * 2 * 2 * 4 * 4 * 2, 1 * 2 * 2 * 4 * 4 * 2}},
		{"uneven PP2 stage 1", twoGroups, Parallel{TP: 1, PP: 2}, Rank{0, 1},
			Shape{Rank: Rank{0, 1}, HeadLo: 0, HeadHi: 4, LayerLo: 3, LayerHi: 5, Layers: [][]int{{4}, {3}}},
			[]uint64{1 * 2 * 4 * 4 * 4 * 2, 1 * 2 * 4 * 4 * 4 * 2}},
		{"group absent from stage", testDense(4, 2, []LayerGroup{{Layers: []int{0, 1}}, {Layers: []int{2, 3}}}), Parallel{TP: 1, PP: 2}, Rank{0, 1},
			Shape{Rank: Rank{0, 1}, HeadLo: 0, HeadHi: 2, LayerLo: 2, LayerHi: 4, Layers: [][]int{nil, {2, 3}}},
			[]uint64{0, 2 * 2 * 2 * 4 * 4 * 2}},
		{"MLA TP8 replicated", testMLA(6), Parallel{TP: 8, PP: 1}, Rank{5, 0},
			Shape{Rank: Rank{5, 0}, HeadLo: 0, HeadHi: 1, LayerLo: 0, LayerHi: 6, Layers: [][]int{LayerRange(0, 6)}},
			[]uint64{6 * 1 * 1 * 4 * 8 * 2}},
		{"MLA TP3 (no divisibility needed)", testMLA(6), Parallel{TP: 3, PP: 2}, Rank{2, 1},
			Shape{Rank: Rank{2, 1}, HeadLo: 0, HeadHi: 1, LayerLo: 3, LayerHi: 6, Layers: [][]int{LayerRange(3, 6)}},
			[]uint64{3 * 1 * 1 * 4 * 8 * 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.l.Shape(tc.p, tc.r)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Shape = %+v, want %+v", got, tc.want)
			}
			for g, w := range tc.blocks {
				if bb := got.BlockBytes(tc.l, g); bb != w {
					t.Errorf("BlockBytes(group %d) = %d, want %d", g, bb, w)
				}
			}
		})
	}
}

func TestShapeErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		l     Layout
		p     Parallel
		r     Rank
		err   error
		names []string
	}{
		{"heads not divisible", testDense(4, 8, nil), Parallel{TP: 3, PP: 1}, Rank{}, ErrBadParallelism, []string{"KVHeads 8", "TP 3", "a TP that divides 8"}},
		// GQA with fewer KV heads than TP ranks (vLLM would replicate
		// them): refused, saying so and what TP would do.
		{"heads fewer than TP", testDense(4, 8, nil), Parallel{TP: 16, PP: 1}, Rank{}, ErrBadParallelism,
			[]string{"KVHeads 8", "TP 16", "replicated over TP ranks are not supported", "a TP that divides 8"}},
		{"TP 0", testDense(4, 8, nil), Parallel{TP: 0, PP: 1}, Rank{}, ErrBadParallelism, []string{"TP 0"}},
		{"PP 0", testDense(4, 8, nil), Parallel{TP: 1, PP: 0}, Rank{}, ErrBadParallelism, []string{"PP 0"}},
		{"PP > Layers", testDense(4, 8, nil), Parallel{TP: 1, PP: 5}, Rank{}, ErrBadParallelism, []string{"PP 5", "Layers 4"}},
		{"rank TP outside", testDense(4, 8, nil), Parallel{TP: 2, PP: 1}, Rank{2, 0}, ErrBadParallelism, []string{"tp2/pp0"}},
		{"rank PP outside", testDense(4, 8, nil), Parallel{TP: 2, PP: 2}, Rank{0, -1}, ErrBadParallelism, []string{"tp0/pp-1"}},
		{"bad layout", testDense(0, 8, nil), Parallel{TP: 1, PP: 1}, Rank{}, ErrBadLayout, nil},
		// MLA replicates instead of dividing heads, so nothing else bounds
		// its TP: a typo'd context_tp must be an error, not a peer map of
		// 2^31 shapes (an out-of-memory end of the process).
		{"MLA TP huge", testMLA(4), Parallel{TP: 1<<31 - 1, PP: 1}, Rank{}, ErrBadParallelism, []string{"TP 2147483647", "4096"}},
		{"MLA TP past bound", testMLA(4), Parallel{TP: MaxTP + 1, PP: 1}, Rank{}, ErrBadParallelism, []string{"TP 4097"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.l.Shape(tc.p, tc.r)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %q", err, n)
				}
			}
		})
	}
	if _, err := NewPeerMap(testDense(4, 8, nil), Parallel{TP: 2, PP: 1}, Parallel{TP: 3, PP: 1}); !errors.Is(err, ErrBadParallelism) ||
		!strings.Contains(err.Error(), "generation") {
		t.Fatalf("NewPeerMap with bad gen TP: %v", err)
	}
	if _, err := NewPeerMap(testMLA(4), Parallel{TP: MaxTP, PP: 1}, Parallel{TP: 1, PP: 1}); err != nil {
		t.Fatalf("NewPeerMap with MLA context TP %d: %v", MaxTP, err)
	}
	// TP×PP = 2^64 wraps to 0: without the bound, a peer map with no ranks
	// and no error.
	if _, err := NewPeerMap(testMLA(4), Parallel{TP: 1, PP: 1}, Parallel{TP: 1 << 62, PP: 4}); !errors.Is(err, ErrBadParallelism) {
		t.Fatalf("NewPeerMap with MLA generation TP 2^62 (TP×PP overflows): %v", err)
	}
	if _, err := NewPeerMap(testDense(4, 8, nil), Parallel{TP: 1, PP: 5}, Parallel{TP: 1, PP: 1}); !errors.Is(err, ErrBadParallelism) ||
		!strings.Contains(err.Error(), "context") {
		t.Fatalf("NewPeerMap with bad ctx PP: %v", err)
	}
}

// rnk builds a Rank.
func rnk(tp, pp int) Rank { return Rank{TP: tp, PP: pp} }

func TestPeerMap(t *testing.T) {
	full := func(n int) [][]int { return [][]int{LayerRange(0, n)} }
	for _, tc := range []struct {
		name     string
		l        Layout
		ctx, gen Parallel
		want     []PeerLink
		writers  map[Rank][]Rank
	}{
		{"TP2->TP4 split", testDense(2, 8, nil), Parallel{TP: 2, PP: 1}, Parallel{TP: 4, PP: 1}, []PeerLink{
			{rnk(0, 0), rnk(0, 0), 0, 2, full(2)},
			{rnk(0, 0), rnk(1, 0), 2, 4, full(2)},
			{rnk(1, 0), rnk(2, 0), 4, 6, full(2)},
			{rnk(1, 0), rnk(3, 0), 6, 8, full(2)},
		}, map[Rank][]Rank{rnk(2, 0): {rnk(1, 0)}}},
		{"TP4->TP2 gather", testDense(2, 8, nil), Parallel{TP: 4, PP: 1}, Parallel{TP: 2, PP: 1}, []PeerLink{
			{rnk(0, 0), rnk(0, 0), 0, 2, full(2)},
			{rnk(1, 0), rnk(0, 0), 2, 4, full(2)},
			{rnk(2, 0), rnk(1, 0), 4, 6, full(2)},
			{rnk(3, 0), rnk(1, 0), 6, 8, full(2)},
		}, map[Rank][]Rank{rnk(0, 0): {rnk(0, 0), rnk(1, 0)}, rnk(1, 0): {rnk(2, 0), rnk(3, 0)}}},
		{"TP4->TP8 split", testDense(1, 8, nil), Parallel{TP: 4, PP: 1}, Parallel{TP: 8, PP: 1}, []PeerLink{
			{rnk(0, 0), rnk(0, 0), 0, 1, full(1)}, {rnk(0, 0), rnk(1, 0), 1, 2, full(1)},
			{rnk(1, 0), rnk(2, 0), 2, 3, full(1)}, {rnk(1, 0), rnk(3, 0), 3, 4, full(1)},
			{rnk(2, 0), rnk(4, 0), 4, 5, full(1)}, {rnk(2, 0), rnk(5, 0), 5, 6, full(1)},
			{rnk(3, 0), rnk(6, 0), 6, 7, full(1)}, {rnk(3, 0), rnk(7, 0), 7, 8, full(1)},
		}, map[Rank][]Rank{rnk(7, 0): {rnk(3, 0)}}},
		{"PP2->PP1 uneven", testDense(5, 2, nil), Parallel{TP: 1, PP: 2}, Parallel{TP: 1, PP: 1}, []PeerLink{
			{rnk(0, 0), rnk(0, 0), 0, 2, [][]int{{0, 1, 2}}},
			{rnk(0, 1), rnk(0, 0), 0, 2, [][]int{{3, 4}}},
		}, map[Rank][]Rank{rnk(0, 0): {rnk(0, 0), rnk(0, 1)}}},
		{"PP1->PP2 uneven, two groups", testDense(5, 2, []LayerGroup{{Layers: []int{0, 2, 4}}, {Layers: []int{1, 3}, Window: 8}}),
			Parallel{TP: 1, PP: 1}, Parallel{TP: 1, PP: 2}, []PeerLink{
				{rnk(0, 0), rnk(0, 0), 0, 2, [][]int{{0, 2}, {1}}},
				{rnk(0, 0), rnk(0, 1), 0, 2, [][]int{{4}, {3}}},
			}, map[Rank][]Rank{rnk(0, 1): {rnk(0, 0)}}},
		{"PP1->PP2, group only in stage 0", testDense(4, 2, []LayerGroup{{Layers: []int{0, 1}}, {Layers: []int{2, 3}}}),
			Parallel{TP: 1, PP: 1}, Parallel{TP: 1, PP: 2}, []PeerLink{
				{rnk(0, 0), rnk(0, 0), 0, 2, [][]int{{0, 1}, nil}},
				{rnk(0, 0), rnk(0, 1), 0, 2, [][]int{nil, {2, 3}}},
			}, nil},
		{"TP2 PP2 -> TP1 PP3", testDense(6, 2, nil), Parallel{TP: 2, PP: 2}, Parallel{TP: 1, PP: 3}, []PeerLink{
			{rnk(0, 0), rnk(0, 0), 0, 1, [][]int{{0, 1}}},
			{rnk(0, 0), rnk(0, 1), 0, 1, [][]int{{2}}},
			{rnk(1, 0), rnk(0, 0), 1, 2, [][]int{{0, 1}}},
			{rnk(1, 0), rnk(0, 1), 1, 2, [][]int{{2}}},
			{rnk(0, 1), rnk(0, 1), 0, 1, [][]int{{3}}},
			{rnk(0, 1), rnk(0, 2), 0, 1, [][]int{{4, 5}}},
			{rnk(1, 1), rnk(0, 1), 1, 2, [][]int{{3}}},
			{rnk(1, 1), rnk(0, 2), 1, 2, [][]int{{4, 5}}},
		}, map[Rank][]Rank{rnk(0, 1): {rnk(0, 0), rnk(1, 0), rnk(0, 1), rnk(1, 1)}, rnk(0, 2): {rnk(0, 1), rnk(1, 1)}}},
		{"MLA TP8->TP4 replicated", testMLA(2), Parallel{TP: 8, PP: 1}, Parallel{TP: 4, PP: 1}, []PeerLink{
			{rnk(0, 0), rnk(0, 0), 0, 1, full(2)},
			{rnk(1, 0), rnk(1, 0), 0, 1, full(2)},
			{rnk(2, 0), rnk(2, 0), 0, 1, full(2)},
			{rnk(3, 0), rnk(3, 0), 0, 1, full(2)},
		}, map[Rank][]Rank{rnk(3, 0): {rnk(3, 0)}}},
		{"MLA TP2->TP4 replicated", testMLA(2), Parallel{TP: 2, PP: 1}, Parallel{TP: 4, PP: 1}, []PeerLink{
			{rnk(0, 0), rnk(0, 0), 0, 1, full(2)},
			{rnk(0, 0), rnk(2, 0), 0, 1, full(2)},
			{rnk(1, 0), rnk(1, 0), 0, 1, full(2)},
			{rnk(1, 0), rnk(3, 0), 0, 1, full(2)},
		}, map[Rank][]Rank{rnk(2, 0): {rnk(0, 0)}, rnk(3, 0): {rnk(1, 0)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewPeerMap(tc.l, tc.ctx, tc.gen)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Links(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Links =\n%+v\nwant\n%+v", got, tc.want)
			}
			for rk, w := range tc.writers {
				if got := m.WritersOf(rk); !reflect.DeepEqual(got, w) {
					t.Errorf("WritersOf(%v) = %v, want %v", rk, got, w)
				}
			}
			// From, Link and WritersOf agree with Links.
			n := 0
			for i := range tc.ctx.Size() {
				c := tc.ctx.RankAt(i)
				for _, link := range m.From(c) {
					if link.Ctx != c || !reflect.DeepEqual(link, tc.want[n]) {
						t.Fatalf("From(%v) gives %+v, want %+v", c, link, tc.want[n])
					}
					if got, ok := m.Link(c, link.Gen); !ok || !reflect.DeepEqual(got, link) {
						t.Fatalf("Link(%v, %v) = %+v, %t", c, link.Gen, got, ok)
					}
					n++
				}
			}
			if n != len(tc.want) {
				t.Fatalf("From covers %d links, want %d", n, len(tc.want))
			}
			for i := range tc.gen.Size() {
				g := tc.gen.RankAt(i)
				var want []Rank
				for _, link := range tc.want {
					if link.Gen == g {
						want = append(want, link.Ctx)
					}
				}
				if got := m.WritersOf(g); !reflect.DeepEqual(got, want) {
					t.Errorf("WritersOf(%v) = %v, want %v", g, got, want)
				}
			}
		})
	}
}

func TestPeerMapAccessors(t *testing.T) {
	l := testDense(4, 4, nil)
	m, err := NewPeerMap(l, Parallel{TP: 2, PP: 1}, Parallel{TP: 4, PP: 2})
	if err != nil {
		t.Fatal(err)
	}
	if m.Ctx() != (Parallel{TP: 2, PP: 1}) || m.Gen() != (Parallel{TP: 4, PP: 2}) || m.Layout().Name != l.Name {
		t.Fatalf("accessors: %v %v %q", m.Ctx(), m.Gen(), m.Layout().Name)
	}
	if m.From(rnk(2, 0)) != nil || m.WritersOf(rnk(0, 2)) != nil {
		t.Fatal("unknown ranks must give nil")
	}
	if _, ok := m.Link(rnk(0, 0), rnk(3, 0)); ok {
		t.Fatal("ctx tp0 holds heads [0,2), gen tp3 holds [3,4): no link")
	}
	if _, err := m.CtxShape(rnk(0, 1)); !errors.Is(err, ErrBadParallelism) {
		t.Fatalf("CtxShape(outside) err = %v", err)
	}
	if _, err := m.GenShape(rnk(4, 0)); !errors.Is(err, ErrBadParallelism) {
		t.Fatalf("GenShape(outside) err = %v", err)
	}
	gs, err := m.GenShape(rnk(3, 1))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := l.Shape(Parallel{TP: 4, PP: 2}, rnk(3, 1))
	if !reflect.DeepEqual(gs, want) {
		t.Fatalf("GenShape = %+v, want %+v", gs, want)
	}
	if gs.LayerIndex(0, 3) != 1 || gs.LayerIndex(0, 1) != -1 {
		t.Fatalf("LayerIndex: %d %d", gs.LayerIndex(0, 3), gs.LayerIndex(0, 1))
	}
	if got := (Rank{1, 2}).String() + " " + (Parallel{TP: 4, PP: 2}).String(); got != "tp1/pp2 TP4/PP2" {
		t.Fatalf("String = %q", got)
	}
}

// TestStages: a Parallel's Stages splits the layers as it says (vLLM's
// VLLM_PP_LAYER_PARTITION format), and VLLMStages is vLLM's default split
// (its get_pp_indices' examples), "" where it is the default one too.
func TestStages(t *testing.T) {
	for _, tc := range []struct {
		layers, pp int
		want       string
	}{
		{7, 3, "2,3,2"},
		{43, 10, "4,4,4,4,4,4,5,5,5,4"},
		{61, 4, "15,15,16,15"},
		{30, 4, "7,8,8,7"},
		{80, 3, ""}, // 27,27,26: the default split too
		{61, 2, ""},
		{32, 4, ""},
		{5, 1, ""},
	} {
		if got := VLLMStages(tc.layers, tc.pp); got != tc.want {
			t.Errorf("VLLMStages(%d, %d) = %q, want %q", tc.layers, tc.pp, got, tc.want)
		}
	}

	l := testDense(30, 2, nil)
	p := Parallel{TP: 1, PP: 4, Stages: "7,8,8,7"}
	if err := p.Validate(l); err != nil {
		t.Fatal(err)
	}
	if got := p.Split(30); fmt.Sprint(got) != "[7 8 8 7]" {
		t.Errorf("Split = %v", got)
	}
	for st, want := range [][2]int{{0, 7}, {7, 15}, {15, 23}, {23, 30}} {
		if lo, hi := p.StageLayers(30, st); lo != want[0] || hi != want[1] {
			t.Errorf("stage %d: [%d,%d), want %v", st, lo, hi, want)
		}
	}
	s, err := l.Shape(p, Rank{PP: 1})
	if err != nil || s.LayerLo != 7 || s.LayerHi != 15 || fmt.Sprint(s.Layers[0]) != "[7 8 9 10 11 12 13 14]" {
		t.Errorf("Shape of stage 1: %+v, %v", s, err)
	}
	if p.String() != "TP1/PP4(7,8,8,7)" {
		t.Errorf("String = %q", p.String())
	}
	if n := (Parallel{TP: 1, PP: 4, Stages: "8,8,7,7"}).Normal(30); n != (Parallel{TP: 1, PP: 4}) {
		t.Errorf("the default split spelled out: Normal = %+v, want Stages cleared", n)
	}
	if n := p.Normal(30); n != p {
		t.Errorf("Normal of another split = %+v, want it kept", n)
	}

	for _, c := range []struct{ stages, needle string }{
		{"7,8,8", "3 stages of 23 layers in all, want PP 4 stages of the 30 layers"},
		{"7,8,8,8", "4 stages of 31 layers"},
		{"7,8,0,15", `stage 2's layer count "0"`},
		{"7, 8,8,7", `stage 1's layer count " 8"`},
		{"07,8,8,7", `stage 0's layer count "07"`},
		{"7,8,8,x", `stage 3's layer count "x"`},
		{"7,8,8,7,", `stage 4's layer count ""`},
	} {
		err := Parallel{TP: 1, PP: 4, Stages: c.stages}.Validate(l)
		if !errors.Is(err, ErrBadParallelism) || !strings.Contains(err.Error(), c.needle) {
			t.Errorf("Stages %q: %v, want ErrBadParallelism naming %q", c.stages, err, c.needle)
		}
	}

	// A context split by default (8,8,7,7) and a generation split as vLLM
	// splits (7,8,8,7): the generation's stage 0 (layers 0..6) is written
	// by the context's stage 0 (0..7) alone, its stage 1 (7..14) by stages
	// 0 and 1, its stage 2 (15..22) by stages 1 and 2, its stage 3 by 3.
	m, err := NewPeerMap(l, Parallel{TP: 1, PP: 4}, p)
	if err != nil {
		t.Fatal(err)
	}
	for gen, want := range map[int][]int{0: {0}, 1: {0, 1}, 2: {1, 2}, 3: {3}} {
		var got []int
		for _, r := range m.WritersOf(Rank{PP: gen}) {
			got = append(got, r.PP)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("generation stage %d written by context stages %v, want %v", gen, got, want)
		}
	}
}

// TestNormalOfABadParallelism: Normal runs on values nobody validated yet
// (a ReceiveRequest's ContextParallel, a node config's peer), so it must
// not panic nor allocate per PP when PP is no split of the layers: such
// a value is returned as it is, for Validate to name.
func TestNormalOfABadParallelism(t *testing.T) {
	for _, p := range []Parallel{
		{TP: 1, PP: -1, Stages: "1"},
		{TP: 1, PP: 1 << 62, Stages: "1"},
		{TP: 1, PP: 31, Stages: "1"}, // more stages than the 30 layers
		{TP: 1, PP: 0, Stages: "30"},
	} {
		if n := p.Normal(30); n != p {
			t.Errorf("Normal(30) of %+v = %+v, want it unchanged", p, n)
		}
	}
}
