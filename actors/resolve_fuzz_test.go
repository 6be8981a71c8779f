package actors

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// resolveFuzzTopo is a TP2 context rank of a two-group layout (full
// attention and a window) whose group 0 lives in NHD memory and group 1 in
// its pool.
func resolveFuzzTopo(tb testing.TB) (Topology, uint64) {
	tb.Helper()
	l := kvcache.Layout{Name: "fuzz", Layers: 4, KVHeads: 4, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 4,
		Groups: []kvcache.LayerGroup{{Name: "full", Layers: []int{0, 1}}, {Name: "swa", Layers: []int{2, 3}, Window: 8}}}
	par := kvcache.Parallel{TP: 2, PP: 1}
	cs, err := l.Shape(par, kvcache.Rank{})
	if err != nil {
		tb.Fatal(err)
	}
	const blocks = 8
	tensor := uint64(2 * blocks * l.TokensPerBlock * cs.Heads() * l.HeadDim * l.DTypeBytes)
	mem, err := kvcache.NHDMemory(l, cs, 0, blocks, []uint64{0, tensor}, 2*tensor)
	if err != nil {
		tb.Fatal(err)
	}
	bb := cs.BlockBytes(l, 1)
	pool := kvcache.PoolGeometry{Offset: 2 * tensor, BlockBytes: bb, Blocks: blocks}
	return Topology{Layout: l, LayoutHash: l.Hash(), Parallel: par, Rank: cs.Rank,
		Pools:  []kvcache.PoolGeometry{{BlockBytes: mem.BlockStride, Blocks: blocks}, pool},
		Memory: []*kvcache.KVMemory{mem}, Plans: NewPlanCache()}, 2*tensor + blocks*bb
}

// resolveFuzzSeeds are encoded (Hello, RequestData) pairs of a TP1
// generation rank: its pools alone, and its group 1 in an HND descriptor.
func resolveFuzzSeeds(tb testing.TB, topo Topology) [][2][]byte {
	tb.Helper()
	l := topo.Layout
	gs, err := l.Shape(kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{})
	if err != nil {
		tb.Fatal(err)
	}
	const blocks = 6
	b0, b1 := gs.BlockBytes(l, 0), gs.BlockBytes(l, 1)
	hello := &messages.Hello{From: messages.PeerID{Instance: "gen", Rank: 0}, Backend: "loopback",
		AgentAddr: []byte{1}, Region: messages.RemoteRegion{Key: []byte{1}, Len: 16 + blocks*(b0+b1)},
		LayoutHash: topo.LayoutHash, Parallel: messages.Parallel{TP: 1, PP: 1},
		Pools: []messages.PoolGeometry{{Offset: 16, BlockBytes: b0, Blocks: blocks}, {Offset: 16 + blocks*b0, BlockBytes: b1, Blocks: blocks}}}
	rd := &messages.RequestData{RequestID: "r1", Epoch: 1, From: hello.From, GenParallel: hello.Parallel, PromptLen: 15,
		Groups: []messages.GroupDest{{First: 0, Blocks: []int32{5, 0, 3, 1}}, {First: 2, Blocks: []int32{4, 2}}},
		Remap:  []messages.Extent{{View: 20, File: 400, Len: 30}}}
	tensor := uint64(2 * blocks * l.TokensPerBlock * gs.Heads() * l.HeadDim * l.DTypeBytes)
	hnd, err := kvcache.HNDMemory(l, gs, 1, blocks, []uint64{16 + blocks*b0, 16 + blocks*b0 + tensor}, hello.Region.Len+tensor)
	if err != nil {
		tb.Fatal(err)
	}
	withMem := *hello
	withMem.Region.Len += tensor
	withMem.Memory = helloMemory([]*kvcache.KVMemory{nil, hnd})
	var seeds [][2][]byte
	for _, h := range []*messages.Hello{hello, &withMem} {
		hb, err := messages.Encode(h)
		if err != nil {
			tb.Fatal(err)
		}
		rb, err := messages.Encode(rd)
		if err != nil {
			tb.Fatal(err)
		}
		seeds = append(seeds, [2][]byte{hb, rb})
	}
	return seeds
}

// FuzzResolveRequest: whatever Hello and RequestData a generation rank
// sends (any pair that decodes), ResolveRequest refuses it with
// ErrBadRequest and no route, or its route plans the request's whole
// destination without error, every segment inside both regions, moving
// the bytes the planner counts.
func FuzzResolveRequest(f *testing.F) {
	topo, srcLen := resolveFuzzTopo(f)
	for _, s := range resolveFuzzSeeds(f, topo) {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, hb, rb []byte) {
		hf, err := messages.Decode(hb)
		hello, ok := hf.(*messages.Hello)
		if err != nil || !ok {
			return
		}
		rf, err := messages.Decode(rb)
		rd, ok := rf.(*messages.RequestData)
		if err != nil || !ok {
			return
		}
		route, _, err := ResolveRequest(topo, hello, rd)
		if err != nil {
			if route != nil || !errors.Is(err, ErrBadRequest) {
				t.Fatalf("ResolveRequest = %v, %v; want no route and ErrBadRequest", route, err)
			}
			return
		}
		rp := route.Planner.(*routePlanner)
		tpb := topo.Layout.TokensPerBlock
		lo, hi := -1, 0
		for _, d := range rp.dst {
			if len(d.IDs) > 0 {
				if lo < 0 || d.First < lo {
					lo = d.First
				}
				hi = max(hi, d.End())
			}
		}
		if lo < 0 {
			return
		}
		c := kvcache.Chunk{Start: lo * tpb, End: min(hi*tpb, int(rd.PromptLen)), FirstBlock: lo}
		c.Last = c.End == int(rd.PromptLen)
		// Each group's sources are the blocks its destination names.
		src := make([]kvcache.BlockRun, len(rp.dst))
		for g, d := range rp.dst {
			src[g].First = d.First
			for b := range d.IDs {
				src[g].IDs = append(src[g].IDs, kvcache.BlockID((d.First+b)%topo.Pools[g].Blocks))
			}
		}
		segs, n, err := route.Planner.Plan(c, src, nil)
		if err != nil {
			t.Fatalf("a resolved route fails to plan %v: %v", c, err)
		}
		var moved uint64
		for _, s := range segs {
			if s.Len == 0 || s.Src+s.Len < s.Src || s.Src+s.Len > srcLen || s.Dst+s.Len < s.Dst || s.Dst+s.Len > route.RegionLen {
				t.Fatalf("segment %+v outside the source region of %d bytes or the destination's of %d", s, srcLen, route.RegionLen)
			}
			moved += s.Len
		}
		if moved != n {
			t.Fatalf("segments move %d bytes, the planner says %d", moved, n)
		}
	})
}
