package actors

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// descriptorFixture is a TP1 context rank in NHD memory and a TP1
// generation rank whose Hello carries an HND descriptor.
type descriptorFixture struct {
	l     kvcache.Layout
	topo  Topology
	hello *messages.Hello
	rd    *messages.RequestData
	src   *kvcache.KVMemory
	dst   *kvcache.KVMemory
}

func newDescriptorFixture(t *testing.T) *descriptorFixture {
	t.Helper()
	l := kvcache.Layout{Name: "desc", Layers: 2, KVHeads: 4, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 4,
		Groups: kvcache.FullAttention(2)}
	par := kvcache.Parallel{TP: 1, PP: 1}
	shape, err := l.Shape(par, kvcache.Rank{})
	if err != nil {
		t.Fatal(err)
	}
	const blocks = 6
	tensor := uint64(2 * blocks * l.TokensPerBlock * l.KVHeads * l.HeadDim * l.DTypeBytes)
	src, err := kvcache.NHDMemory(l, shape, 0, blocks, []uint64{0, tensor}, 2*tensor)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := kvcache.HNDMemory(l, shape, 0, blocks, []uint64{tensor, 0}, 2*tensor)
	if err != nil {
		t.Fatal(err)
	}
	topo := Topology{Layout: l, LayoutHash: l.Hash(), Parallel: par,
		Pools:  []kvcache.PoolGeometry{{BlockBytes: 1, Blocks: blocks}},
		Memory: []*kvcache.KVMemory{src}, Plans: NewPlanCache()}
	hello := &messages.Hello{From: messages.PeerID{Instance: "gen", Rank: 0}, Backend: "loopback",
		AgentAddr: []byte{1}, Region: messages.RemoteRegion{Key: []byte{1}, Len: 2 * tensor},
		LayoutHash: l.Hash(), Parallel: messages.Parallel{TP: 1, PP: 1},
		Pools:  []messages.PoolGeometry{{Offset: 0, BlockBytes: 1, Blocks: blocks}},
		Memory: helloMemory([]*kvcache.KVMemory{dst})}
	if err := hello.Validate(); err != nil {
		t.Fatal(err)
	}
	rd := &messages.RequestData{RequestID: "r1", From: hello.From, GenParallel: hello.Parallel, PromptLen: 8,
		Groups: []messages.GroupDest{{First: 0, Blocks: []int32{5, 0}}}}
	return &descriptorFixture{l: l, topo: topo, hello: hello, rd: rd, src: src, dst: dst}
}

// TestResolveRequestPlansIntoPeerDescriptor: a context rank plans from its
// NHD memory into the HND descriptor the receiver's Hello carries; every
// destination element of the two blocks is written once, from the source
// element of the same (layer, part, head, token, dim).
func TestResolveRequestPlansIntoPeerDescriptor(t *testing.T) {
	f := newDescriptorFixture(t)
	route, _, err := ResolveRequest(f.topo, f.hello, f.rd)
	if err != nil {
		t.Fatal(err)
	}
	srcIDs := []kvcache.BlockID{2, 3}
	segs, n, err := route.Planner.Plan(kvcache.Chunk{Start: 0, End: 8, Last: true}, []kvcache.BlockRun{{IDs: srcIDs}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, f.src.RegionLen)
	for i := range src {
		src[i] = byte(i*7 + i/251)
	}
	dst := make([]byte, f.dst.RegionLen)
	count := make([]int, len(dst))
	moved := applySegments(segs, src, dst, count)
	if moved != n || n == 0 {
		t.Fatalf("segments move %d bytes, planner says %d", moved, n)
	}
	off := func(m *kvcache.KVMemory, layer, part, b, tok, h, d int) uint64 {
		return m.Base[layer][part] + uint64(b)*m.BlockStride + uint64(tok)*m.TokenStride + uint64(h)*m.HeadStride + uint64(d)*m.ElemStride
	}
	checked := 0
	for i, db := range []int{5, 0} {
		for layer := range 2 {
			for part := range 2 {
				for tok := range 4 {
					for h := range 4 {
						for d := range 4 {
							so, do := off(f.src, layer, part, int(srcIDs[i]), tok, h, d), off(f.dst, layer, part, db, tok, h, d)
							for b := range uint64(2) {
								if dst[do+b] != src[so+b] || count[do+b] != 1 {
									t.Fatalf("block %d layer %d part %d token %d head %d dim %d: %#x written %d times, want %#x once",
										db, layer, part, tok, h, d, dst[do+b], count[do+b], src[so+b])
								}
								checked++
							}
						}
					}
				}
			}
		}
	}
	if uint64(checked) != moved {
		t.Fatalf("checked %d bytes, moved %d", checked, moved)
	}
}

// TestPlanCacheKeyedByHello: the second request with the same Hello, and
// one with an equal Hello (a repeated Hello), reuse the plan; a Hello whose
// descriptor changed (a new incarnation laid out differently) rebuilds it,
// and a block id beyond the new descriptor is refused.
func TestPlanCacheKeyedByHello(t *testing.T) {
	f := newDescriptorFixture(t)
	resolve := func(h *messages.Hello) *kvcache.Plan {
		t.Helper()
		route, _, err := ResolveRequest(f.topo, h, f.rd)
		if err != nil {
			t.Fatal(err)
		}
		return route.Planner.(*routePlanner).plans[0]
	}
	first := resolve(f.hello)
	if again := resolve(f.hello); again != first {
		t.Fatal("same Hello: plan rebuilt")
	}
	repeat := *f.hello
	repeat.Memory = helloMemory([]*kvcache.KVMemory{f.dst})
	if again := resolve(&repeat); again != first {
		t.Fatal("an equal Hello: plan rebuilt")
	}
	if hits, misses := f.topo.Plans.Stats(); hits != 2 || misses != 1 {
		t.Fatalf("hits %d misses %d, want 2 and 1", hits, misses)
	}
	// The peer comes back with NHD memory of 4 blocks.
	shape, _ := f.l.Shape(f.topo.Parallel, kvcache.Rank{})
	tensor := uint64(2 * 4 * 4 * 4 * 4 * 2)
	nhd, err := kvcache.NHDMemory(f.l, shape, 0, 4, []uint64{0, tensor}, f.hello.Region.Len)
	if err != nil {
		t.Fatal(err)
	}
	next := *f.hello
	next.Memory = helloMemory([]*kvcache.KVMemory{nhd})
	if _, _, err := ResolveRequest(f.topo, &next, f.rd); !errors.Is(err, ErrBadRequest) ||
		!strings.Contains(err.Error(), "destination block 5 outside NHD memory of 4 blocks") {
		t.Fatalf("block 5 of a 4-block descriptor: %v", err)
	}
	rd := *f.rd
	rd.Groups = []messages.GroupDest{{Blocks: []int32{3, 0}}}
	route, _, err := ResolveRequest(f.topo, &next, &rd)
	if err != nil {
		t.Fatal(err)
	}
	if p := route.Planner.(*routePlanner).plans[0]; p == first {
		t.Fatal("a Hello with another descriptor reused the old plan")
	}
	if _, misses := f.topo.Plans.Stats(); misses != 2 {
		t.Fatalf("misses %d, want 2", misses)
	}
}

// TestResolveRequestRefusesBadPeerDescriptor: descriptors within the
// Hello's bounds but unusable (overlapping strides, past the region, a
// different head width or block size, missing layers) fail the request
// with ErrBadRequest naming the receiver, the group and the value.
func TestResolveRequestRefusesBadPeerDescriptor(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(m *messages.KVMemory)
		want string
	}{
		{"overlapping heads", func(m *messages.KVMemory) { m.HeadStride = 2 }, "overlap"},
		{"past region", func(m *messages.KVMemory) { m.Base[1] = 1 << 40 }, "past region length"},
		{"blocks interleave", func(m *messages.KVMemory) { m.BlockStride = 8 }, "block stride 8"},
		{"head dim", func(m *messages.KVMemory) { m.HeadDim = 2 }, "head dim"},
		{"tokens per block", func(m *messages.KVMemory) { m.TokensPerBlock = 2 }, "tokens per block"},
		{"missing layer", func(m *messages.KVMemory) { m.Layers, m.Base = m.Layers[:1], m.Base[:2] }, "layer 1 not held"},
		{"heads outside", func(m *messages.KVMemory) { m.HeadLo = 2 }, "heads [0,4)"},
		{"two tensors share", func(m *messages.KVMemory) { m.Base[2] = m.Base[0] }, "overlaps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newDescriptorFixture(t)
			tc.edit(&f.hello.Memory[0])
			for range 2 { // the second from the cache
				route, _, err := ResolveRequest(f.topo, f.hello, f.rd)
				if route != nil || !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "receiver gen/0 group 0") ||
					!strings.Contains(err.Error(), tc.want) {
					t.Fatalf("ResolveRequest = %v, %v; want ErrBadRequest naming gen/0 group 0 and %q", route, err, tc.want)
				}
			}
		})
	}
}

// TestResolveRequestBoundsPeerDescriptorWork: a receiver's descriptor is
// checked against this rank's layout before it is validated, whose work
// grows with the descriptor's tokens, heads and elements. One of another
// tokens per block, or of heads past the model's, is refused naming the
// value, without enumerating its footprint: before, the first case built
// 4M byte ranges (64 MiB) twice, about 100 ms of the parent that resolves
// every request of this rank, and the second was accepted.
func TestResolveRequestBoundsPeerDescriptorWork(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tpb     int32
		elemPad uint64
		want    string
	}{
		{"tokens per block", 1024, 0, "tokens per block 1024, this rank's 4"},
		{"heads past the model", 4, 2, "heads [0,4096), outside the model's KV heads [0,4)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newDescriptorFixture(t)
			m := &f.hello.Memory[0]
			m.HeadLo, m.Heads, m.TokensPerBlock = 0, 4096, tc.tpb
			m.ElemStride = uint64(m.ElemBytes) + tc.elemPad
			m.HeadStride = uint64(m.HeadDim) * m.ElemStride
			m.TokenStride = 4096 * m.HeadStride
			m.BlockStride = uint64(m.TokensPerBlock) * m.TokenStride
			m.Base = []uint64{0, 1 << 30, 2 << 30, 3 << 30}
			f.hello.Region.Len = 4 << 30
			if err := f.hello.Validate(); err != nil {
				t.Fatal(err)
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			before := ms.TotalAlloc
			route, _, err := ResolveRequest(f.topo, f.hello, f.rd)
			runtime.ReadMemStats(&ms)
			if n := ms.TotalAlloc - before; n > 1<<20 {
				t.Errorf("resolving the request allocated %d bytes, want at most 1 MiB", n)
			}
			if route != nil || !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "receiver gen/0 group 0") ||
				!strings.Contains(err.Error(), tc.want) {
				t.Errorf("ResolveRequest = %v, %v; want ErrBadRequest naming gen/0 group 0 and %q", route, err, tc.want)
			}
		})
	}
}

// TestResolveRequestNeverPanicsOnPeerDescriptor: any descriptor a Hello
// lets through either plans or is refused with ErrBadRequest.
func TestResolveRequestNeverPanicsOnPeerDescriptor(t *testing.T) {
	f := newDescriptorFixture(t)
	rapid.Check(t, func(rt *rapid.T) {
		h := *f.hello
		m := h.Memory[0]
		m.HeadLo = rapid.Int32Range(0, 8).Draw(rt, "headLo")
		m.Heads = rapid.Int32Range(1, 8).Draw(rt, "heads")
		m.Parts = rapid.Int32Range(1, 2).Draw(rt, "parts")
		m.HeadDim = rapid.Int32Range(1, 8).Draw(rt, "headDim")
		m.ElemBytes = rapid.Int32Range(1, 4).Draw(rt, "elemBytes")
		m.TokensPerBlock = rapid.Int32Range(1, 8).Draw(rt, "tpb")
		m.Blocks = rapid.Int32Range(0, 8).Draw(rt, "blocks")
		m.Base = rapid.SliceOfN(rapid.Uint64(), 2*int(m.Parts), 2*int(m.Parts)).Draw(rt, "base")
		m.BlockStride = rapid.Uint64().Draw(rt, "blockStride")
		m.TokenStride = rapid.Uint64Range(0, 1<<12).Draw(rt, "tokenStride")
		m.HeadStride = rapid.Uint64().Draw(rt, "headStride")
		m.ElemStride = rapid.Uint64Range(0, 64).Draw(rt, "elemStride")
		h.Memory = []messages.KVMemory{m}
		if err := h.Validate(); err != nil {
			return
		}
		route, _, err := ResolveRequest(f.topo, &h, f.rd)
		if err != nil && (route != nil || !errors.Is(err, ErrBadRequest)) {
			rt.Fatalf("ResolveRequest = %v, %v", route, err)
		}
		if err == nil {
			if _, _, err := route.Planner.Plan(kvcache.Chunk{Start: 0, End: 8, Last: true},
				[]kvcache.BlockRun{{IDs: []kvcache.BlockID{0, 1}}}, nil); err != nil && !errors.Is(err, kvcache.ErrBadPlan) {
				rt.Logf("plan: %v", err)
			}
		}
	})
}

// TestPlanCachePeerMap: a peer map is computed once per pair of
// parallelisms and layout, an error is returned and not cached, and a nil
// cache computes every time.
func TestPlanCachePeerMap(t *testing.T) {
	l := kvcache.Layout{Name: "t", Layers: 4, KVHeads: 8, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(4)}
	ctx, gen := kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 4, PP: 1}
	c := NewPlanCache()
	a, err := c.peerMap(l, 7, ctx, gen)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := c.peerMap(l, 7, ctx, gen); err != nil || b != a {
		t.Fatalf("second lookup: %p, %v; want the cached %p", b, err, a)
	}
	if b, err := c.peerMap(l, 7, ctx, kvcache.Parallel{TP: 2, PP: 1}); err != nil || b == a {
		t.Fatalf("another generation parallelism: %p, %v; want a map of its own", b, err)
	}
	bad := kvcache.Parallel{TP: 3, PP: 1}
	if _, err := c.peerMap(l, 7, ctx, bad); !errors.Is(err, kvcache.ErrBadParallelism) {
		t.Fatalf("TP 3 over 8 KV heads: %v", err)
	}
	if _, ok := c.maps[mapKey{7, ctx, bad}]; ok {
		t.Fatal("an error was cached")
	}
	var none *PlanCache
	x, err := none.peerMap(l, 7, ctx, gen)
	if err != nil || x == nil || x == a {
		t.Fatalf("nil cache: %p, %v; want a fresh map", x, err)
	}
}

// The cache keeps a bounded number of peer maps (a map of a large pair of
// parallelisms is megabytes), however many pairs it is asked for.
func TestPlanCachePeerMapsBounded(t *testing.T) {
	l := kvcache.Layout{Name: "t", Layers: 64, KVHeads: 64, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(64)}
	c := NewPlanCache()
	for tp := 1; tp <= 64; tp *= 2 {
		for pp := 1; pp <= 64; pp *= 2 {
			if _, err := c.peerMap(l, 7, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: tp, PP: pp}); err != nil {
				t.Fatalf("TP%d/PP%d: %v", tp, pp, err)
			}
			if n := len(c.maps); n > maxCachedPeerMaps {
				t.Fatalf("%d peer maps cached, bound %d", n, maxCachedPeerMaps)
			}
		}
	}
}

// A RequestData whose place of its receiver disagrees with its sender's
// Hello is refused before a peer map is built from it: the map of a
// hostile parallelism (TP1024/PP61 of an MLA model) is tens of megabytes,
// and the refusal names both.
func TestResolveRequestChecksPlaceAgainstHello(t *testing.T) {
	f := newDescriptorFixture(t)
	for _, tc := range []struct {
		name   string
		mutate func(rd *messages.RequestData)
		want   string
	}{
		{"parallelism", func(rd *messages.RequestData) { rd.GenParallel = messages.Parallel{TP: 1024, PP: 61}; rd.GenTP = 1 },
			"names generation rank tp1/pp0 of TP1024/PP61, its sender's Hello says tp0/pp0 of TP1/PP1"},
		{"rank", func(rd *messages.RequestData) { rd.GenPP = 1; rd.GenParallel.PP = 2 },
			"of TP1/PP2, its sender's Hello says tp0/pp0 of TP1/PP1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.topo.Plans = NewPlanCache()
			rd := *f.rd
			tc.mutate(&rd)
			_, _, err := ResolveRequest(f.topo, f.hello, &rd)
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want ErrBadRequest naming %q", err, tc.want)
			}
			if n := len(f.topo.Plans.maps); n != 0 {
				t.Fatalf("%d peer maps built for a refused RequestData", n)
			}
		})
	}
	// The same frame with the Hello's place resolves.
	f.topo.Plans = NewPlanCache()
	if _, _, err := ResolveRequest(f.topo, f.hello, f.rd); err != nil {
		t.Fatal(err)
	}
}

// A RequestData from a rank whose Hello says FeatureSendOnly (its key a
// placeholder), or names no region key, is refused naming it, with the ranks this
// rank writes to still listed: there is nothing to write into, and a
// route with an empty key would only fail at the worker's Post.
func TestResolveRequestRefusesSendOnlyReceiver(t *testing.T) {
	f := newDescriptorFixture(t)
	for name, mutate := range map[string]func(h *messages.Hello){
		"FeatureSendOnly": func(h *messages.Hello) {
			h.Features |= messages.FeatureSendOnly
			h.Region.Key = messages.SendOnlyKey
		},
		"no key": func(h *messages.Hello) { h.Region.Key = nil },
	} {
		hello := *f.hello
		mutate(&hello)
		route, expected, err := ResolveRequest(f.topo, &hello, f.rd)
		if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "receives no writes") || route != nil {
			t.Fatalf("%s: route %v, err %v; want ErrBadRequest saying the rank receives no writes", name, route, err)
		}
		if len(expected) == 0 {
			t.Errorf("%s: no expected writer ranks with the refusal", name)
		}
	}
}
