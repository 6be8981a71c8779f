package node_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// memByte is the byte of (layer, part, model head, token, byte).
func memByte(layer, part, head, token, b int) byte {
	return byte(layer*71 + part*37 + head*13 + token*5 + b + 1)
}

// eachByteOf visits every byte of block id (global block blk) through the
// descriptor m.
func eachByteOf(m *kvcache.KVMemory, id kvcache.BlockID, blk int, f func(off uint64, layer, part, head, token, b int)) {
	for i, layer := range m.Layers {
		for part := range m.Parts {
			for h := range m.Heads {
				for tok := range m.TokensPerBlock {
					for b := range m.HeadDim * m.ElemBytes {
						off := m.Base[i][part] + uint64(id)*m.BlockStride + uint64(tok)*m.TokenStride +
							uint64(h)*m.HeadStride + uint64(b/m.ElemBytes)*m.ElemStride + uint64(b%m.ElemBytes)
						f(off, layer, part, m.HeadLo+h, blk*m.TokensPerBlock+tok, b)
					}
				}
			}
		}
	}
}

// TestMemoryInPool: two nodes over shm and CURVE, the context side's KV
// laid out NHD in its pool and the generation side's HND (from JSON),
// move a request into the framework's own blocks; every byte of them is
// the source's.
func TestMemoryInPool(t *testing.T) {
	cc, gc := pair(t, shm.Backend)
	cc.PoolBytes, gc.PoolBytes = 0, 0
	cc.Memory = &node.Memory{Kind: "nhd", NumBlocks: 12}
	parsed, err := node.ParseConfig([]byte(`{"model": "Llama-3.1-8B", "backend": "loopback", "memory": {"kind": "hnd", "num_blocks": 10}}`))
	if err != nil {
		t.Fatal(err)
	}
	gc.Memory = parsed.Memory
	ctxN, genN := open(t, cc), open(t, gc)
	ce, ge := ctxN.Engine(), genN.Engine()
	if m := ge.Memory(0); m == nil || m.Kind != kvcache.MemHND || m.Blocks != 10 || m.RegionLen != ge.Region().Len {
		t.Fatalf("generation memory %+v", m)
	}
	moveIntoBlocks(t, genN, ce, "mem", ce.Region().Bytes(), ce.Memory(0), ge.Memory(0), ge.Region().Bytes())
}

// moveIntoBlocks moves request id (40 tokens: 3 blocks, the last partial)
// from ce, whose source bytes it writes into srcBuf through srcMem, into
// the framework's blocks 9, 4 and 0 of genN, and checks that READY names
// them and that every byte landed in dst where dstMem says. It returns
// which bytes of dst it checked.
func moveIntoBlocks(t *testing.T, genN *node.Node, ce *kvxfer.Engine, id string, srcBuf []byte, srcMem, dstMem *kvcache.KVMemory, dst []byte) []bool {
	t.Helper()
	const prompt = 40
	owned := [][]kvcache.BlockID{{9, 4, 0}}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: prompt, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{3})
	if err != nil {
		t.Fatal(err)
	}
	for blk, b := range src[0] {
		eachByteOf(srcMem, b, blk, func(off uint64, layer, part, head, token, b int) { srcBuf[off] = memByte(layer, part, head, token, b) })
	}
	tx, err := ce.Send(ctx, kvxfer.SendRequest{ID: id, PromptLen: prompt})
	if err != nil {
		t.Fatal(err)
	}
	ch := kvcache.Chunk{Start: 0, End: prompt, Last: true}
	if err := tx.Chunk(ch, ch.Runs(16, src), nil); err != nil {
		t.Fatal(err)
	}
	var o kvxfer.Outcome
	select {
	case o = <-rx.Done():
	case <-time.After(patience):
		t.Fatal("no outcome")
	}
	if !o.OK || !slices.EqualFunc(o.Blocks, owned, slices.Equal) {
		t.Fatalf("%s %v blocks %v, want READY with %v", o.Status, o.Err, o.Blocks, owned)
	}
	checked, n := make([]bool, len(dst)), 0
	for blk, b := range owned[0] {
		eachByteOf(dstMem, b, blk, func(off uint64, layer, part, head, token, b int) {
			if want := memByte(layer, part, head, token, b); dst[off] != want {
				t.Fatalf("block %d layer %d part %d head %d token %d byte %d: %#x, want %#x", owned[0][blk], layer, part, head, token, b, dst[off], want)
			}
			checked[off] = true
			n++
		})
	}
	if uint64(n) != o.Bytes || n == 0 {
		t.Fatalf("verified %d bytes, READY says %d", n, o.Bytes)
	}
	if to := <-tx.Done(); !to.OK {
		t.Fatalf("tx %s %v", to.Status, to.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatal(err)
	}
	return checked
}

// TestMemoryConfigRefused: a memory layout that does not fit is refused at
// Open naming the value.
func TestMemoryConfigRefused(t *testing.T) {
	for _, c := range []struct {
		mem  node.Memory
		pool uint64
		want string
	}{
		{node.Memory{Kind: "nchw", NumBlocks: 4}, 0, `memory.kind = "nchw"`},
		{node.Memory{Kind: "nhd", NumBlocks: 0}, 0, "memory.num_blocks = 0"},
		{node.Memory{Kind: "nhd", NumBlocks: 64}, 4096, "pool_bytes is 4096"},
		{node.Memory{Kind: "mla", NumBlocks: 4}, 0, "not MLA"},
	} {
		cfg := node.Config{Instance: "bad", Layout: tiny(), Backend: "loopback", PoolBytes: c.pool, Memory: &c.mem}
		n, err := node.Open(context.Background(), cfg)
		if err == nil {
			_ = n.Close(context.Background())
		}
		if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("memory %+v: %v, want ErrConfig naming %q", c.mem, err, c.want)
		}
	}
}

// TestMemoryInPoolInLayerOrder: the framework's tensors lie back to back
// in ascending layer order (kvxfer.h), also when the layer groups
// interleave (sliding-window even layers, full odd ones, as GPT-OSS has
// them): a framework that builds its tensors that way finds each group's
// descriptor placing every layer where it put that layer's tensor.
func TestMemoryInPoolInLayerOrder(t *testing.T) {
	l := tiny()
	l.Layers = 4
	l.Groups = []kvcache.LayerGroup{{Name: "swa", Layers: []int{0, 2}, Window: 32}, {Name: "full", Layers: []int{1, 3}}}
	n := open(t, node.Config{Instance: "mem-order", Layout: l, Backend: "loopback", Memory: &node.Memory{Kind: "nhd", NumBlocks: 4}})
	tensor := uint64(2*4*l.TokensPerBlock*l.KVHeads*l.HeadDim) * uint64(l.DTypeBytes) // [2, 4 blocks, tokens, heads, dim]
	for g := range l.Groups {
		m := n.Engine().Memory(g)
		for i, L := range m.Layers {
			if got, want := m.Base[i][0], uint64(L)*tensor; got != want {
				t.Errorf("group %d layer %d: tensor at pool offset %d (layer %d's place), want %d", g, L, got, got/tensor, want)
			}
		}
	}
}
