package actors

import (
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// BenchmarkResolveRequestPlans measures what a context rank spends per
// request to resolve a 512-token request into a generation rank's
// framework memory on Llama-3.1-70B (80 layers, bf16, 16 tokens per
// block), with a plan cache (Topology.Plans: planned once per Hello) and
// without (planned per request, as before).
func BenchmarkResolveRequestPlans(b *testing.B) {
	l, err := kvcache.Preset("Llama-3.1-70B")
	if err != nil {
		b.Fatal(err)
	}
	const blocks, prompt = 1024, 512
	for _, bc := range []struct {
		name         string
		ctxTP, genTP int
		src, dst     kvcache.MemoryKind
	}{
		{"NHD-NHD", 1, 1, kvcache.MemNHD, kvcache.MemNHD},
		{"NHD-HND", 1, 1, kvcache.MemNHD, kvcache.MemHND},
		{"TP2-TP1-NHD", 2, 1, kvcache.MemNHD, kvcache.MemNHD},
	} {
		ctxPar, genPar := kvcache.Parallel{TP: bc.ctxTP, PP: 1}, kvcache.Parallel{TP: bc.genTP, PP: 1}
		cs, err := l.Shape(ctxPar, kvcache.Rank{})
		if err != nil {
			b.Fatal(err)
		}
		gs, err := l.Shape(genPar, kvcache.Rank{})
		if err != nil {
			b.Fatal(err)
		}
		src, _ := benchMemory(b, bc.src, l, cs, blocks)
		dst, dstLen := benchMemory(b, bc.dst, l, gs, blocks)
		hello := &messages.Hello{From: messages.PeerID{Instance: "gen", Rank: 0}, Backend: "loopback",
			AgentAddr: []byte{1}, Region: messages.RemoteRegion{Key: []byte{1}, Len: dstLen},
			LayoutHash: l.Hash(), Parallel: messages.Parallel{TP: int32(genPar.TP), PP: 1},
			Pools:  []messages.PoolGeometry{{BlockBytes: 1, Blocks: blocks}},
			Memory: helloMemory([]*kvcache.KVMemory{dst})}
		if err := hello.Validate(); err != nil {
			b.Fatal(err)
		}
		ids := make([]int32, l.BlocksFor(prompt))
		for i := range ids {
			ids[i] = int32(2 * i)
		}
		rd := &messages.RequestData{RequestID: "r", From: hello.From, GenParallel: hello.Parallel, PromptLen: prompt,
			Groups: []messages.GroupDest{{Blocks: ids}}}
		// rehello: every request comes with a new Hello value saying the
		// same (a peer's repeated Hello): the cache compares descriptors.
		for _, mode := range []string{"uncached", "cached", "cached-rehello"} {
			topo := Topology{Layout: l, LayoutHash: l.Hash(), Parallel: ctxPar,
				Pools: []kvcache.PoolGeometry{{BlockBytes: 1, Blocks: blocks}}, Memory: []*kvcache.KVMemory{src}}
			if mode != "uncached" {
				topo.Plans = NewPlanCache()
			}
			hellos := [2]*messages.Hello{hello, hello}
			if mode == "cached-rehello" {
				again := *hello
				again.Memory = helloMemory([]*kvcache.KVMemory{dst})
				hellos[1] = &again
			}
			b.Run(bc.name+"/"+mode, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if _, _, err := ResolveRequest(topo, hellos[i&1], rd); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}

// benchMemory lays out group 0 of shape s as kind, one tensor per layer
// back to back, and returns it with its region length.
func benchMemory(b *testing.B, kind kvcache.MemoryKind, l kvcache.Layout, s kvcache.Shape, blocks int) (*kvcache.KVMemory, uint64) {
	b.Helper()
	tensor := uint64(2*blocks*l.TokensPerBlock*s.Heads()*l.HeadDim) * uint64(l.DTypeBytes)
	offs := make([]uint64, len(s.Layers[0]))
	for i := range offs {
		offs[i] = uint64(i) * tensor
	}
	n := uint64(len(offs)) * tensor
	var m *kvcache.KVMemory
	var err error
	if kind == kvcache.MemHND {
		m, err = kvcache.HNDMemory(l, s, 0, blocks, offs, n)
	} else {
		m, err = kvcache.NHDMemory(l, s, 0, blocks, offs, n)
	}
	if err != nil {
		b.Fatal(err)
	}
	return m, n
}
