package actors

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// memoryByte is the pattern byte b of element (layer, part, model head,
// token, dim).
func memoryByte(layer, part, head, token, dim, b int) byte {
	return byte(layer*131 + part*71 + head*37 + token*11 + dim*5 + b*3 + 1)
}

// TestResolveRequestPlansFromFrameworkMemory configures two TP2 context
// ranks with their KV in vLLM's NHD layout (Topology.Memory) and resolves a
// TP1 generation rank's request into its kvcache pool: executing both
// routes' segments must leave every destination element, in the pool's
// byte order, equal to the source element, written once.
func TestResolveRequestPlansFromFrameworkMemory(t *testing.T) {
	l := kvcache.Layout{Name: "nhd", Layers: 2, KVHeads: 4, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 4,
		Groups: kvcache.FullAttention(2)}
	ctxPar, genPar := kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}
	pm, err := kvcache.NewPeerMap(l, ctxPar, genPar)
	if err != nil {
		t.Fatal(err)
	}
	gs, _ := pm.GenShape(kvcache.Rank{})
	const blocks, prompt = 6, 11 // 3 blocks, the last partial
	srcIDs := []kvcache.BlockID{4, 5, 0}
	dstIDs := []int32{1, 2, 5}
	bb := gs.BlockBytes(l, 0)
	dst := make([]byte, 16+blocks*bb)
	count := make([]int, len(dst))
	dstParts, countParts := make([]byte, len(dst)), make([]int, len(dst))
	hello := &messages.Hello{From: messages.PeerID{Instance: "gen", Rank: 0}, LayoutHash: l.Hash(),
		Parallel: messages.Parallel{TP: 1, PP: 1}, Region: messages.RemoteRegion{Key: []byte("key")},
		Pools: []messages.PoolGeometry{{Offset: 16, BlockBytes: bb, Blocks: blocks}}}
	rd := &messages.RequestData{RequestID: "r1", From: hello.From, GenParallel: hello.Parallel, PromptLen: prompt,
		Groups: []messages.GroupDest{{First: 0, Blocks: dstIDs}}}

	for tp := range ctxPar.TP {
		cs, _ := pm.CtxShape(kvcache.Rank{TP: tp})
		tensor := uint64(2 * blocks * l.TokensPerBlock * cs.Heads() * l.HeadDim * l.DTypeBytes)
		mem, err := kvcache.NHDMemory(l, cs, 0, blocks, []uint64{0, tensor}, 2*tensor)
		if err != nil {
			t.Fatal(err)
		}
		src := make([]byte, 2*tensor)
		for i, id := range srcIDs {
			for layer := range l.Layers {
				for part := range 2 {
					for tok := range l.TokensPerBlock {
						for h := range cs.Heads() {
							for d := range l.HeadDim {
								off := mem.Base[layer][part] + uint64(id)*mem.BlockStride + uint64(tok)*mem.TokenStride +
									uint64(h)*mem.HeadStride + uint64(d)*mem.ElemStride
								for b := range 2 {
									src[off+uint64(b)] = memoryByte(layer, part, cs.HeadLo+h, i*l.TokensPerBlock+tok, d, b)
								}
							}
						}
					}
				}
			}
		}
		topo := Topology{Layout: l, LayoutHash: l.Hash(), Parallel: ctxPar, Rank: cs.Rank,
			Pools:  []kvcache.PoolGeometry{{BlockBytes: cs.BlockBytes(l, 0), Blocks: blocks}},
			Memory: []*kvcache.KVMemory{mem}}
		route, _, err := ResolveRequest(topo, hello, rd)
		if err != nil {
			t.Fatal(err)
		}
		segs, n, err := route.Planner.Plan(kvcache.Chunk{Start: 0, End: prompt, FirstBlock: 0, Last: true},
			[]kvcache.BlockRun{{First: 0, IDs: srcIDs}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		moved := applySegments(segs, src, dst, count)
		if moved != n || n != uint64(len(srcIDs))*bb/2 {
			t.Fatalf("ctx tp%d: segments move %d bytes, planner says %d, want half of %d blocks of %d", tp, moved, n, len(srcIDs), bb)
		}
		// The same chunk in two layer parts writes the same bytes, once.
		var partBytes uint64
		for _, part := range []kvcache.LayerPart{{Lo: 0, Hi: 1, Of: 2}, {Lo: 1, Hi: 2, Of: 2}} {
			segs, n, err := route.Planner.Plan(kvcache.Chunk{Start: 0, End: prompt, FirstBlock: 0, Last: true, Layers: part},
				[]kvcache.BlockRun{{First: 0, IDs: srcIDs}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if moved := applySegments(segs, src, dstParts, countParts); moved != n {
				t.Fatalf("ctx tp%d %+v: segments move %d bytes, planner says %d", tp, part, moved, n)
			}
			partBytes += n
		}
		if partBytes != n {
			t.Fatalf("ctx tp%d: layer parts move %d bytes, the whole chunk %d", tp, partBytes, n)
		}
	}
	if !bytes.Equal(dst, dstParts) || !slices.Equal(count, countParts) {
		t.Fatal("the chunk in layer parts wrote other bytes than the whole chunk")
	}

	// The pool's byte order: layer, part, head, token, dim.
	needed := make([]bool, len(dst))
	for i, id := range dstIDs {
		for layer := range l.Layers {
			for part := range 2 {
				for h := range l.KVHeads {
					for tok := range l.TokensPerBlock {
						for d := range l.HeadDim {
							for b := range 2 {
								off := 16 + uint64(id)*bb + uint64((((layer*2+part)*l.KVHeads+h)*l.TokensPerBlock+tok)*l.HeadDim+d)*2 + uint64(b)
								needed[off] = true
								want := memoryByte(layer, part, h, i*l.TokensPerBlock+tok, d, b)
								if dst[off] != want || count[off] != 1 {
									t.Fatalf("block %d layer %d part %d head %d token %d dim %d byte %d = %#x written %d times, want %#x once",
										id, layer, part, h, tok, d, b, dst[off], count[off], want)
								}
							}
						}
					}
				}
			}
		}
	}
	for off, c := range count {
		if !needed[off] && c != 0 {
			t.Fatalf("byte %d outside the destination blocks written %d times", off, c)
		}
	}
}

// applySegments copies segs from src into dst, counts the writes of each
// destination byte in count, and returns the bytes moved.
func applySegments(segs []kvcache.Segment, src, dst []byte, count []int) uint64 {
	var moved uint64
	for _, sg := range segs {
		copy(dst[sg.Dst:sg.Dst+sg.Len], src[sg.Src:sg.Src+sg.Len])
		for j := sg.Dst; j < sg.Dst+sg.Len; j++ {
			count[j]++
		}
		moved += sg.Len
	}
	return moved
}

// A layout mismatch between two ranks that name the same model is a
// setting, not the model: the message says so and names this rank's tokens
// per block; two models are named as two models. (Checked to fail: without
// the same-name clause the message reads like a model mismatch.)
func TestLayoutMismatchOfOneModelNamesTheSetting(t *testing.T) {
	self := Topology{Layout: kvcache.Layout{Name: "Llama-3.1-8B", TokensPerBlock: 16}, LayoutHash: 1}
	err := LayoutMismatch(self, &messages.Hello{Model: "Llama-3.1-8B", LayoutHash: 2})
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "same model laid out differently") ||
		!strings.Contains(err.Error(), "tokens per block (here 16)") {
		t.Fatalf("same model, another layout: %v", err)
	}
	err = LayoutMismatch(self, &messages.Hello{Model: "Qwen3-8B", LayoutHash: 2})
	if !errors.Is(err, ErrMismatch) || strings.Contains(err.Error(), "same model") {
		t.Fatalf("two models: %v", err)
	}
	if err := LayoutMismatch(self, &messages.Hello{Model: "x", LayoutHash: 1}); err != nil {
		t.Fatalf("one layout hash: %v", err)
	}
}

// A peer whose layout differs from this rank's by its tokens per block or
// its KV element size alone is named by that setting, with both values:
// the Hello carries only the layout's hash, so before, the message named
// this rank's tokens per block and left the peer's to guess.
func TestLayoutMismatchNamesThePeersSetting(t *testing.T) {
	l := kvcache.Layout{Name: "Llama-3.1-8B", Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2, TokensPerBlock: 32}
	self := Topology{Layout: l, LayoutHash: l.Hash()}
	for _, c := range []struct {
		edit func(*kvcache.Layout)
		want string
	}{
		{func(p *kvcache.Layout) { p.TokensPerBlock = 16 }, "the peer's blocks hold 16 tokens, this rank's 32"},
		{func(p *kvcache.Layout) { p.DTypeBytes = 1 }, "the peer's KV elements are 1 bytes, this rank's 2"},
		{func(p *kvcache.Layout) { p.KVHeads = 4 }, "compare both sides' tokens per block (here 32)"},
	} {
		peer := l
		c.edit(&peer)
		err := LayoutMismatch(self, &messages.Hello{Model: "Llama-3.1-8B", LayoutHash: peer.Hash()})
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("peer %+v: %v, want it to say %q", peer, err, c.want)
		}
	}
}
