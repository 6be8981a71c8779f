package kvcache

import (
	"math/rand/v2"
	"testing"
)

// memBenchCases are the layout pairs of the descriptor benchmarks. The
// pool-pool cases are today's layout planned by NewPlan, the figure the
// others stand beside.
var memBenchCases = []struct {
	name         string
	src, dst     MemoryKind
	ctxTP, genTP int
}{
	{"pool-pool/TP1-TP1", MemGroupPool, MemGroupPool, 1, 1},
	{"NHD-NHD/TP1-TP1", MemNHD, MemNHD, 1, 1},
	{"NHD-HND/TP1-TP1", MemNHD, MemHND, 1, 1},
	{"pool-pool/TP2-TP1", MemGroupPool, MemGroupPool, 2, 1},
	{"NHD-NHD/TP2-TP1", MemNHD, MemNHD, 2, 1},
	{"HND-HND/TP2-TP1", MemHND, MemHND, 2, 1},
	{"NHD-HND/TP2-TP1", MemNHD, MemHND, 2, 1},
}

// memBenchTokens is the request of the descriptor benchmarks: 128k tokens,
// 4096 blocks of 32.
const memBenchTokens = 128 << 10

// memBenchSetup builds, for Llama-3.1-70B with pp pipeline stages on both
// sides (pp = 1: all 80 layers; pp = 80: one layer), the plan of context
// rank tp0/pp0's first link between memories of the given kinds, each with
// a pool of 4096 blocks, and a shuffled id for each of the request's 4096
// blocks on each side.
func memBenchSetup(b *testing.B, src, dst MemoryKind, ctxTP, genTP, pp int) (*Plan, *KVMemory, *KVMemory, []BlockID, []BlockID) {
	b.Helper()
	l := benchLlama70B()
	n := l.BlocksFor(memBenchTokens)
	pm, err := NewPeerMap(l, Parallel{TP: ctxTP, PP: pp}, Parallel{TP: genTP, PP: pp})
	if err != nil {
		b.Fatal(err)
	}
	link := pm.From(Rank{})[0]
	cs, _ := pm.CtxShape(link.Ctx)
	gs, _ := pm.GenShape(link.Gen)
	sm := packedMemory(b, src, l, cs, 0, n, 0, 0)
	dm := packedMemory(b, dst, l, gs, 0, n, 0, 0)
	var p *Plan
	if src == MemGroupPool && dst == MemGroupPool {
		p, err = pm.Plan(link, 0,
			PoolGeometry{BlockBytes: cs.BlockBytes(l, 0), Blocks: n},
			PoolGeometry{BlockBytes: gs.BlockBytes(l, 0), Blocks: n})
	} else {
		p, err = NewMemoryPlan(link, 0, sm, dm)
	}
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	sids, dids := idRange(0, n), idRange(0, n)
	rng.Shuffle(n, func(i, j int) { sids[i], sids[j] = sids[j], sids[i] })
	rng.Shuffle(n, func(i, j int) { dids[i], dids[j] = dids[j], dids[i] })
	return p, sm, dm, sids, dids
}

// BenchmarkMemoryPlan plans a 128k-token Llama-3.1-70B request (all 80
// layers, 4096 blocks with shuffled ids on both sides) in chunks of 64
// blocks (2048 tokens) into a reused buffer, for today's pools and for
// descriptor layouts side by side. ns/segment is the plan cost per emitted
// segment; segments is the request's total.
func BenchmarkMemoryPlan(b *testing.B) {
	const chunk = 64
	for _, bc := range memBenchCases {
		b.Run(bc.name, func(b *testing.B) {
			p, _, _, sids, dids := memBenchSetup(b, bc.src, bc.dst, bc.ctxTP, bc.genTP, 1)
			n := len(sids)
			want, err := p.Count(sids, dids)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]Segment, 0, p.Stats().PiecesPerBlock*chunk)
			b.SetBytes(int64(p.Bytes(n)))
			b.ReportAllocs()
			segs := 0
			for b.Loop() {
				segs = 0
				for lo := 0; lo < n; lo += chunk {
					hi := min(lo+chunk, n)
					if buf, err = p.Append(buf[:0], sids[lo:hi], dids[lo:hi]); err != nil {
						b.Fatal(err)
					}
					segs += len(buf)
				}
			}
			// Chunking can only split segments that span a chunk boundary.
			if segs < want || segs > want+n/chunk*p.Stats().PiecesPerBlock {
				b.Fatalf("%d segments in chunks, %d for the whole request", segs, want)
			}
			b.ReportMetric(float64(segs), "segments")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(segs), "ns/segment")
		})
	}
}

// BenchmarkMemoryCopy executes the plan of a 128k-token request with plain
// copy (memmove) between host buffers, for today's pools and descriptor
// layouts side by side. To fit a shared machine it moves one layer of
// Llama-3.1-70B (both sides PP 80, so the link carries layer 0: 512 MiB at
// TP1, 256 MiB from a TP2 rank); every layer's plan is the same, so the
// rate is the whole request's. Ids are shuffled on both sides.
func BenchmarkMemoryCopy(b *testing.B) {
	for _, bc := range memBenchCases {
		b.Run(bc.name, func(b *testing.B) {
			p, sm, dm, sids, dids := memBenchSetup(b, bc.src, bc.dst, bc.ctxTP, bc.genTP, 80)
			segs, err := p.Append(nil, sids, dids)
			if err != nil {
				b.Fatal(err)
			}
			src, dst := make([]byte, sm.RegionLen), make([]byte, dm.RegionLen)
			for i := range src { // touch every page before timing
				src[i] = byte(i)
			}
			for i := range dst {
				dst[i] = byte(i >> 8)
			}
			var moved uint64
			for _, sg := range segs {
				moved += sg.Len
			}
			if moved != p.Bytes(len(sids)) {
				b.Fatalf("segments move %d bytes, plan %d", moved, p.Bytes(len(sids)))
			}
			b.SetBytes(int64(moved))
			for b.Loop() {
				for _, sg := range segs {
					copy(dst[sg.Dst:sg.Dst+sg.Len], src[sg.Src:sg.Src+sg.Len])
				}
			}
			b.ReportMetric(float64(len(segs)), "segments")
			b.ReportMetric(float64(moved)/float64(len(segs)), "bytes/segment")
		})
	}
}

// BenchmarkNewMemoryPlan measures building a plan (validating both
// descriptors and walking one block pair's head vectors) for all 80 layers
// of Llama-3.1-70B, beside NewPlan for today's pools.
func BenchmarkNewMemoryPlan(b *testing.B) {
	for _, bc := range memBenchCases {
		b.Run(bc.name, func(b *testing.B) {
			l := benchLlama70B()
			n := l.BlocksFor(memBenchTokens)
			pm, err := NewPeerMap(l, Parallel{TP: bc.ctxTP, PP: 1}, Parallel{TP: bc.genTP, PP: 1})
			if err != nil {
				b.Fatal(err)
			}
			link := pm.From(Rank{})[0]
			cs, _ := pm.CtxShape(link.Ctx)
			gs, _ := pm.GenShape(link.Gen)
			sm := packedMemory(b, bc.src, l, cs, 0, n, 0, 0)
			dm := packedMemory(b, bc.dst, l, gs, 0, n, 0, 0)
			sg := PoolGeometry{BlockBytes: cs.BlockBytes(l, 0), Blocks: n}
			dg := PoolGeometry{BlockBytes: gs.BlockBytes(l, 0), Blocks: n}
			legacy := bc.src == MemGroupPool && bc.dst == MemGroupPool
			b.ReportAllocs()
			var p *Plan
			for b.Loop() {
				if legacy {
					p, err = pm.Plan(link, 0, sg, dg)
				} else {
					p, err = NewMemoryPlan(link, 0, sm, dm)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(p.Stats().PiecesPerBlock), "pieces/block")
		})
	}
}
