package kvcache

import (
	"math/rand/v2"
	"testing"
)

// benchLlama70B is Llama-3.1-70B (DESIGN.md §10) with 32-token blocks,
// built literally so that the benchmark does not depend on presets.
func benchLlama70B() Layout {
	return Layout{Name: "Llama-3.1-70B", Layers: 80, KVHeads: 8, HeadDim: 128, DTypeBytes: 2,
		TokensPerBlock: 32, Groups: FullAttention(80)}
}

// BenchmarkPlan plans a 128k-token Llama-3.1-70B request (4096 blocks) for
// context rank tp0 as one chunk: Project plus Append into a reused buffer.
func BenchmarkPlan(b *testing.B) {
	for _, bc := range []struct {
		name       string
		ctxTP      int
		genTP      int
		fragmented bool
	}{
		{"TP4-TP4/contiguous", 4, 4, false},
		{"TP4-TP4/fragmented", 4, 4, true},
		{"TP4-TP8/split", 4, 8, false},
		{"TP4-TP8/split-fragmented", 4, 8, true},
		{"TP8-TP4/gather", 8, 4, false},
	} {
		b.Run(bc.name, func(b *testing.B) { benchPlan(b, bc.ctxTP, bc.genTP, bc.fragmented) })
	}
}

func benchPlan(b *testing.B, ctxTP, genTP int, fragmented bool) {
	l := benchLlama70B()
	const tokens = 128 << 10
	n := l.BlocksFor(tokens)
	m, err := NewPeerMap(l, Parallel{TP: ctxTP, PP: 1}, Parallel{TP: genTP, PP: 1})
	if err != nil {
		b.Fatal(err)
	}
	link := m.From(Rank{})[0]
	cs, _ := m.CtxShape(link.Ctx)
	gs, _ := m.GenShape(link.Gen)
	p, err := m.Plan(link, 0,
		PoolGeometry{BlockBytes: cs.BlockBytes(l, 0), Blocks: n},
		PoolGeometry{BlockBytes: gs.BlockBytes(l, 0), Blocks: n})
	if err != nil {
		b.Fatal(err)
	}
	src, dst := BlockRun{IDs: idRange(0, n)}, BlockRun{IDs: idRange(0, n)}
	if fragmented {
		rng := rand.New(rand.NewPCG(1, 2))
		rng.Shuffle(n, func(i, j int) { src.IDs[i], src.IDs[j] = src.IDs[j], src.IDs[i] })
		rng.Shuffle(n, func(i, j int) { dst.IDs[i], dst.IDs[j] = dst.IDs[j], dst.IDs[i] })
	}
	c := Chunk{Start: 0, End: tokens, FirstBlock: 0, Last: true}

	// Expected segment count: pieces per block × blocks, less one per block
	// whose whole-block piece continues the previous block's on both sides.
	st := p.Stats()
	want := st.PiecesPerBlock * n
	if st.WholeBlock {
		for i := 1; i < n; i++ {
			if src.IDs[i] == src.IDs[i-1]+1 && dst.IDs[i] == dst.IDs[i-1]+1 {
				want--
			}
		}
	}
	buf := make([]Segment, 0, want)
	b.SetBytes(int64(p.Bytes(n)))
	b.ReportAllocs()
	for b.Loop() {
		sids, dids, err := Project(c, l.TokensPerBlock, src, dst)
		if err != nil {
			b.Fatal(err)
		}
		if buf, err = p.Append(buf[:0], sids, dids); err != nil {
			b.Fatal(err)
		}
	}
	if len(buf) != want {
		b.Fatalf("%d segments, want %d (maximal runs)", len(buf), want)
	}
	b.ReportMetric(float64(len(buf)), "segments")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(buf)), "ns/segment")
}
