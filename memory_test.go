package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Issue 18 part 2, "memory as the framework lays it out": engines whose KV
// lives in plain Go byte slices laid out as vLLM (NHD, HND), split K/V or
// MLA caches hold it, on both sides, moving every byte into the
// framework's own destination blocks.

// memKind is how a test framework lays out one rank's KV.
type memKind string

const (
	memPool  memKind = "pool" // no descriptor: kvxfer's pool
	memNHD   memKind = "NHD"
	memHND   memKind = "HND"
	memSplit memKind = "splitKV"
	memMLA   memKind = "MLA"
)

// gap separates tensors in the framework's slice, so that no plan can
// assume two tensors are adjacent.
const gap = 64

// frameworkMemory allocates one Go byte slice and lays out rank shape s's
// KV in it as a framework of kind would: per layer group, per layer, one
// tensor (two for split K/V, K tensors of the group first), blocks blocks
// each. It returns the region over the slice and one descriptor per group.
func frameworkMemory(t *testing.T, l kvcache.Layout, s kvcache.Shape, kind memKind, blocks int) (*kvcache.Region, []*kvcache.KVMemory) {
	t.Helper()
	blockBytes := uint64(l.TokensPerBlock * s.Heads() * l.HeadDim * l.DTypeBytes)
	part := uint64(blocks)*blockBytes + gap
	var off uint64
	offsets := make([][]uint64, len(l.Groups))
	for g := range l.Groups {
		for range s.Layers[g] {
			offsets[g] = append(offsets[g], off)
			off += uint64(l.Parts()) * part
		}
	}
	buf := make([]byte, off+gap)
	region, err := kvcache.HostBytesRegion(buf)
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]*kvcache.KVMemory, len(l.Groups))
	for g := range l.Groups {
		if len(s.Layers[g]) == 0 {
			continue
		}
		var m *kvcache.KVMemory
		switch kind {
		case memNHD:
			m, err = kvcache.NHDMemory(l, s, g, blocks, offsets[g], region.Len)
		case memHND:
			m, err = kvcache.HNDMemory(l, s, g, blocks, offsets[g], region.Len)
		case memMLA:
			m, err = kvcache.MLAMemory(l, s, g, blocks, offsets[g], region.Len)
		case memSplit:
			// The group's K tensors in the first half of its span, V in the second.
			n := len(offsets[g])
			k, v := make([]uint64, n), make([]uint64, n)
			for i := range n {
				k[i] = offsets[g][0] + uint64(i)*part
				v[i] = offsets[g][0] + uint64(n+i)*part
			}
			m, err = kvcache.SplitKVMemory(l, s, g, blocks, k, v, region.Len)
		default:
			t.Fatalf("no framework memory of kind %s", kind)
		}
		if err != nil {
			t.Fatalf("%s memory of group %d: %v", kind, g, err)
		}
		mem[g] = m
	}
	return region, mem
}

// elemOff is the region offset of byte b of the head vector (layer, part,
// model head, token) of block id in m.
func elemOff(m *kvcache.KVMemory, layer, part, head, tok int, id kvcache.BlockID, b, elem int) uint64 {
	i := slices.Index(m.Layers, layer)
	return m.Base[i][part] + uint64(id)*m.BlockStride + uint64(tok)*m.TokenStride +
		uint64(head-m.HeadLo)*m.HeadStride + uint64(b/elem)*m.ElemStride + uint64(b%elem)
}

// forEachByte calls f with the region offset and pattern coordinates of
// every byte of block id (global block index blk) of group g on engine e,
// through the engine's descriptor (its pool's own layout when it has none).
func forEachByte(e *kvxfer.Engine, l kvcache.Layout, g int, id kvcache.BlockID, blk int, f func(off uint64, layer, part, head, token, b int)) {
	m, s := e.Memory(g), e.Shape()
	for _, layer := range s.Layers[g] {
		for part := range l.Parts() {
			for h := s.HeadLo; h < s.HeadHi; h++ {
				for tok := range l.TokensPerBlock {
					for b := range l.TokenBytes() {
						f(elemOff(m, layer, part, h, tok, id, b, l.DTypeBytes), layer, part, h, blk*l.TokensPerBlock+tok, b)
					}
				}
			}
		}
	}
}

// memCase is one transfer between framework memories.
type memCase struct {
	name           string
	l              kvcache.Layout
	ctxPar, genPar kvcache.Parallel
	ctxKind        memKind
	genKind        memKind
}

func mlaLayout() kvcache.Layout {
	return kvcache.Layout{Name: "mla", Layers: 3, KVHeads: 1, HeadDim: 24, DTypeBytes: 2, TokensPerBlock: 16, MLA: true,
		Groups: kvcache.FullAttention(3)}
}

// startMemoryEngine starts rank i of instance inst with its KV in
// framework memory of kind (kvxfer's pool for memPool) on c's link.
func startMemoryEngine(t *testing.T, c *cluster, l kvcache.Layout, inst string, p kvcache.Parallel, i int, kind memKind, blocks int) *kvxfer.Engine {
	t.Helper()
	cfg := kvxfer.Config{Instance: inst, Parallel: p, Rank: p.RankAt(i), Layout: &l, PoolBytes: 4 << 20,
		Workers: 2, Link: c.link, TransferTimeout: 20 * time.Second}
	if kind != memPool {
		s, err := l.Shape(p, p.RankAt(i))
		if err != nil {
			t.Fatal(err)
		}
		cfg.PoolBytes = 0
		cfg.Region, cfg.Memory = frameworkMemory(t, l, s, kind, blocks)
	}
	e, err := kvxfer.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start %s rank %d: %v", inst, i, err)
	}
	return e
}

// startMemoryCluster starts context and generation engines whose KV lives
// in framework memory of the case's kinds (kvxfer's pool for memPool).
func startMemoryCluster(t *testing.T, tc memCase, blocks int) *cluster {
	t.Helper()
	c := &cluster{link: control.NewMemLink(), ctxPar: tc.ctxPar, genPar: tc.genPar}
	for i := range tc.ctxPar.Size() {
		c.ctx = append(c.ctx, startMemoryEngine(t, c, tc.l, "ctx", tc.ctxPar, i, tc.ctxKind, blocks))
	}
	for i := range tc.genPar.Size() {
		c.gen = append(c.gen, startMemoryEngine(t, c, tc.l, "gen", tc.genPar, i, tc.genKind, blocks))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range append(c.ctx, c.gen...) {
			if err := e.Close(ctx); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	return c
}

// transferMemory moves one request of promptLen tokens in chunks from
// every context rank that writes to a generation rank, each source block
// filled through its descriptor behind its fence, into destination blocks
// the generation framework picked; it checks that READY hands back exactly
// those blocks, that every byte of them is the source's, and that no other
// byte of the generation ranks' memory (zero before the request) was
// written; it zeroes that memory again. It returns the number of bytes
// verified.
func transferMemory(t *testing.T, c *cluster, tc memCase, id string, req, promptLen, chunkTokens int) int {
	t.Helper()
	l := tc.l
	pm, err := kvcache.NewPeerMap(l, tc.ctxPar, tc.genPar)
	if err != nil {
		t.Fatal(err)
	}
	var rxs []*kvxfer.RxHandle
	var owned [][][]kvcache.BlockID
	for _, g := range c.gen {
		blocks := ownedBlocks(g, l, promptLen)
		h, err := g.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: promptLen,
			Context: "ctx", ContextParallel: tc.ctxPar, Blocks: blocks})
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		rxs, owned = append(rxs, h), append(owned, blocks)
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	type sender struct {
		e   *kvxfer.Engine
		h   *kvxfer.TxHandle
		src [][]kvcache.BlockID
	}
	var senders []sender
	for i, e := range c.ctx {
		if len(pm.From(tc.ctxPar.RankAt(i))) == 0 {
			continue // an MLA rank beyond the generation TP writes to nobody
		}
		counts := make([]int, len(l.Groups))
		for g := range counts {
			if len(e.Shape().Layers[g]) > 0 {
				counts[g] = l.BlocksFor(promptLen)
			}
		}
		src, err := e.Pools().Alloc(counts)
		if err != nil {
			t.Fatalf("alloc source: %v", err)
		}
		h, err := e.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen, GenerationParallel: tc.genPar})
		if err != nil {
			t.Fatalf("send: %v", err)
		}
		senders = append(senders, sender{e, h, src})
	}
	for _, ch := range chunks {
		b0, b1 := ch.Blocks(l.TokensPerBlock)
		for _, s := range senders {
			f := &kvxfer.ManualFence{}
			if err := s.h.Chunk(ch, ch.Runs(l.TokensPerBlock, s.src), f); err != nil {
				t.Fatalf("chunk %v: %v", ch, err)
			}
			buf := s.e.Region().Bytes()
			for g := range l.Groups {
				for b := b0; b < b1 && len(s.src[g]) > 0; b++ {
					forEachByte(s.e, l, g, s.src[g][b], b, func(off uint64, layer, part, head, token, b int) {
						buf[off] = pattern(req, layer, part, head, token, b)
					})
				}
			}
			f.Fire(nil)
		}
	}
	for i, s := range senders {
		if o := waitOutcome(t, s.h.Done()); !o.OK {
			t.Fatalf("tx %s sender %d: %s %v", id, i, o.Status, o.Err)
		}
		if err := s.e.Pools().Free(s.src); err != nil {
			t.Fatalf("free source: %v", err)
		}
	}
	verified := 0
	for i, h := range rxs {
		e := c.gen[i]
		o := waitOutcome(t, h.Done())
		if !o.OK {
			t.Fatalf("rx %s rank %d: %s %v", id, i, o.Status, o.Err)
		}
		if !slices.EqualFunc(o.Blocks, owned[i], slices.Equal) {
			t.Fatalf("rx %s rank %d: READY blocks %v, want the framework's %v", id, i, o.Blocks, owned[i])
		}
		buf := e.Region().Bytes()
		written := make([]bool, len(buf))
		for g, grp := range l.Groups {
			first, _ := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
			for bi, blk := range o.Blocks[g] {
				forEachByte(e, l, g, blk, first+bi, func(off uint64, layer, part, head, token, b int) {
					if want := pattern(req, layer, part, head, token, b); buf[off] != want {
						t.Fatalf("rx %s rank %d group %d block %d layer %d part %d head %d token %d byte %d: got %#x want %#x",
							id, i, g, blk, layer, part, head, token, b, buf[off], want)
					}
					written[off] = true
					verified++
				})
			}
		}
		for off, w := range written {
			if !w && buf[off] != 0 {
				t.Fatalf("rx %s rank %d: byte %d outside the destination blocks written (%#x)", id, i, off, buf[off])
			}
		}
		select {
		case <-h.Released():
		default:
			t.Fatalf("rx %s rank %d: READY but the framework's blocks are not released", id, i)
		}
		clear(buf) // the framework reuses the blocks: the next request starts from zeros
		if used := e.Pools().Used(); used != 0 {
			t.Fatalf("rx %s rank %d: kvxfer's pool holds %d blocks of a request that brought its own", id, i, used)
		}
	}
	return verified
}

// TestFrameworkMemoryTransfer moves KV between framework memories on both
// sides: same and cross layout, split K/V, MLA, pool on one side, and
// tensor parallelism 2 → 1 and 1 → 2, every destination byte verified.
func TestFrameworkMemoryTransfer(t *testing.T) {
	tp2 := kvcache.Parallel{TP: 2, PP: 1}
	for _, tc := range []memCase{
		{"NHD to NHD", smallLayout(), tp1, tp1, memNHD, memNHD},
		{"NHD to HND", smallLayout(), tp1, tp1, memNHD, memHND},
		{"HND to NHD TP2 to TP1", smallLayout(), tp2, tp1, memHND, memNHD},
		{"NHD to NHD TP2 to TP1", smallLayout(), tp2, tp1, memNHD, memNHD},
		{"split K/V to HND TP1 to TP2", smallLayout(), tp1, tp2, memSplit, memHND},
		{"NHD to split K/V", smallLayout(), tp1, tp1, memNHD, memSplit},
		{"MLA to MLA TP2 to TP1", mlaLayout(), tp2, tp1, memMLA, memMLA},
		{"pool to HND", smallLayout(), tp1, tp1, memPool, memHND},
		{"NHD to pool", smallLayout(), tp1, tp1, memNHD, memPool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startMemoryCluster(t, tc, 24)
			for i, prompt := range []int{100, 37} {
				if n := transferMemory(t, c, tc, fmt.Sprint("req-", i), i+3, prompt, 32); n == 0 {
					t.Fatal("no byte verified")
				}
			}
			checkNoLeaks(t, c)
		})
	}
}

// TestConfigMemoryErrors: a descriptor that does not fit the rank is
// refused at Start with ErrConfig naming the group and the value.
func TestConfigMemoryErrors(t *testing.T) {
	l := smallLayout()
	s, err := l.Shape(tp1, kvcache.Rank{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(cfg *kvxfer.Config)
		want string
	}{
		{"no region", func(cfg *kvxfer.Config) { cfg.Region = nil }, "Region is not"},
		{"one group short", func(cfg *kvxfer.Config) { cfg.Memory = cfg.Memory[:1] }, "1 descriptors, layout \"test\" has 2"},
		{"nil for a held group", func(cfg *kvxfer.Config) { cfg.Memory[1] = nil }, "Memory[1] (group \"swa\") is nil"},
		{"heads", func(cfg *kvxfer.Config) { cfg.Memory[0].Heads = 2 }, "Heads = 2, rank"},
		{"head dim", func(cfg *kvxfer.Config) { cfg.Memory[0].HeadDim = 4 }, "HeadDim = 4"},
		{"tokens per block", func(cfg *kvxfer.Config) { cfg.Memory[1].TokensPerBlock = 8 }, "TokensPerBlock = 8"},
		{"layers", func(cfg *kvxfer.Config) { cfg.Memory[0].Layers = []int{0, 1} }, "Layers = [0 1], rank"},
		{"region length", func(cfg *kvxfer.Config) { cfg.Memory[0].RegionLen-- }, "RegionLen ="},
		{"overlap", func(cfg *kvxfer.Config) { cfg.Memory[0].Base[1][1] = cfg.Memory[0].Base[0][1] }, "overlaps"},
		{"no blocks", func(cfg *kvxfer.Config) { cfg.Memory[0].Blocks = 0 }, "Blocks = 0"},
		// Each valid alone, group 1 on group 0's bytes: block b of both
		// groups would be the same memory (a review found it accepted).
		{"groups share memory", func(cfg *kvxfer.Config) {
			for i := range cfg.Memory[1].Base {
				cfg.Memory[1].Base[i] = slices.Clone(cfg.Memory[0].Base[i])
			}
		}, "layer group 0's layer 0 K at [0,"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			region, mem := frameworkMemory(t, l, s, memNHD, 8)
			cfg := kvxfer.Config{Layout: &l, Region: region, Memory: mem, Link: control.NewMemLink()}
			tc.edit(&cfg)
			e, err := kvxfer.Start(context.Background(), cfg)
			if err == nil {
				_ = e.Close(context.Background())
			}
			if !errors.Is(err, kvxfer.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want ErrConfig naming %q", err, tc.want)
			}
		})
	}
}

// TestBlockTensorIsTheDescriptorsBytes: BlockTensor of an NHD rank is the
// [block_size, heads, head_dim] slice of the layer's K or V tensor, and
// Block is nil for descriptor memory.
func TestBlockTensorIsTheDescriptorsBytes(t *testing.T) {
	l := smallLayout()
	s, _ := l.Shape(tp1, kvcache.Rank{})
	region, mem := frameworkMemory(t, l, s, memNHD, 8)
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Layout: &l, Region: region, Memory: mem, Link: control.NewMemLink()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close(context.Background()) }()
	if b := e.Block(0, 1); b != nil {
		t.Fatalf("Block of descriptor memory = %d bytes, want nil", len(b))
	}
	blockBytes := l.TokensPerBlock * s.Heads() * l.HeadDim * l.DTypeBytes
	got := e.BlockTensor(1, 3, 1, 5) // group swa, layer 3 (its second), V, block 5
	wantOff := mem[1].Base[1][1] + 5*uint64(blockBytes)
	if len(got) != blockBytes || &got[0] != &region.Bytes()[wantOff] {
		t.Fatalf("BlockTensor = %d bytes, want %d at offset %d", len(got), blockBytes, wantOff)
	}
	for _, bad := range [][4]int{{0, 1, 0, 0}, {1, 3, 2, 0}, {1, 3, 0, 8}, {2, 0, 0, 0}, {0, 0, 0, -1}} {
		if b := e.BlockTensor(bad[0], bad[1], bad[2], kvcache.BlockID(bad[3])); b != nil {
			t.Fatalf("BlockTensor%v = %d bytes, want nil", bad, len(b))
		}
	}
}

// TestBadDescriptorInHelloIsRefused: a generation peer whose Hello carries
// a descriptor within the frame's bounds but unusable (two tensors share
// bytes) gets FAILED naming it and the value, the context side creates no
// state, and the honest generation rank's request still works.
func TestBadDescriptorInHelloIsRefused(t *testing.T) {
	tc := memCase{"", smallLayout(), tp1, tp1, memNHD, memHND}
	c := startMemoryCluster(t, tc, 24)
	h := *c.gen[0].Hello()
	h.From = messages.PeerID{Instance: "evil", Rank: 0}
	h.Memory = slices.Clone(h.Memory)
	h.Memory[0].Base = slices.Clone(h.Memory[0].Base)
	h.Memory[0].Base[2] = h.Memory[0].Base[0] // layer 2's K is layer 0's
	if err := h.Validate(); err != nil {
		t.Fatalf("the hostile Hello should pass the frame's bounds: %v", err)
	}
	r := &rogue{id: h.From}
	lis, err := c.link.Listen(&h, func(f messages.Frame) {
		r.mu.Lock()
		r.frames = append(r.frames, f)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	r.send(t, c, requestData(r.id, "req-evil", 64, [][]int32{{0, 1, 2, 3}, {0, 1, 2, 3}}))
	res := r.waitFailed(t, "req-evil")
	if !strings.Contains(res.Error, "receiver evil/0 group 0") || !strings.Contains(res.Error, "overlaps") {
		t.Fatalf("refusal does not name the peer and the value: %q", res.Error)
	}
	if n := transferMemory(t, c, tc, "req-evil", 1, 64, 32); n == 0 {
		t.Fatal("no byte verified")
	}
	checkNoLeaks(t, c)
}

// TestPeerRestartWithAnotherLayout: the generation rank restarts (a new
// incarnation under the same name) with NHD memory of fewer blocks instead
// of HND; the context side's cached plan into the old layout is not used:
// the next request lands in the new layout, every byte verified.
func TestPeerRestartWithAnotherLayout(t *testing.T) {
	tc := memCase{"", smallLayout(), tp1, tp1, memNHD, memHND}
	c := startMemoryCluster(t, tc, 24)
	if n := transferMemory(t, c, tc, "before", 1, 100, 32); n == 0 {
		t.Fatal("no byte verified")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.gen[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	tc.genKind = memNHD
	c.gen[0] = startMemoryEngine(t, c, tc.l, "gen", tp1, 0, memNHD, 12)
	if m := c.gen[0].Memory(0); m.Kind != kvcache.MemNHD || m.Blocks != 12 {
		t.Fatalf("restarted with %v memory of %d blocks", m.Kind, m.Blocks)
	}
	if n := transferMemory(t, c, tc, "after", 2, 100, 32); n == 0 {
		t.Fatal("no byte verified")
	}
	checkNoLeaks(t, c)
}

// TestConfigMemoryIsCopied: Start keeps its own copy of Config.Memory. A
// framework that changes its descriptors after Start (reuses one for the
// next rank) changes nothing of the engine's: Engine.Memory still says
// what Start validated, and requests still move every byte into the
// blocks the generation side described.
// An engine over framework memory (Config.Memory) counts its quarantine
// in the bytes the descriptors say a block holds, as a pool engine does:
// the default bound is half of them, and Stats.QuarantineLimitBytes
// says so. (Checked to fail: its id-only pools weighed a block at one
// byte, so the default bound was half the block count, and a
// MaxQuarantinedBytes was never reached.)
func TestConfigMemoryQuarantineInBytes(t *testing.T) {
	l := smallLayout()
	s, err := l.Shape(tp1, tp1.RankAt(0))
	if err != nil {
		t.Fatal(err)
	}
	region, mem := frameworkMemory(t, l, s, memNHD, 24)
	var total uint64
	for _, m := range mem {
		if m != nil {
			total += m.BlockBytes() * uint64(m.Blocks)
		}
	}
	if total < 24*2 {
		t.Fatalf("layout %s holds %d bytes in 24 blocks: too small to tell bytes from blocks", l.Name, total)
	}
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, Region: region, Memory: mem,
		Workers: 1, Link: control.NewMemLink()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	if got := e.Stats().QuarantineLimitBytes; got != total/2 {
		t.Fatalf("default quarantine bound %d bytes, want %d (half of the %d bytes the descriptors lay out)", got, total/2, total)
	}
}

func TestConfigMemoryIsCopied(t *testing.T) {
	tc := memCase{"NHD to NHD", smallLayout(), tp1, tp1, memNHD, memNHD}
	l := tc.l
	c := &cluster{link: control.NewMemLink(), ctxPar: tp1, genPar: tp1}
	var callers [][]*kvcache.KVMemory // each engine's Config.Memory, as the caller holds it
	for _, inst := range []string{"ctx", "gen"} {
		s, err := l.Shape(tp1, tp1.RankAt(0))
		if err != nil {
			t.Fatal(err)
		}
		region, mem := frameworkMemory(t, l, s, memNHD, 24)
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, Region: region, Memory: mem,
			Workers: 2, Link: c.link, TransferTimeout: 20 * time.Second})
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		if inst == "ctx" {
			c.ctx = append(c.ctx, e)
		} else {
			c.gen = append(c.gen, e)
		}
		callers = append(callers, mem)
	}
	t.Cleanup(func() {
		for _, e := range append(c.ctx, c.gen...) {
			if err := e.Close(context.Background()); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	type saved struct {
		base00, stride uint64
		layer0, blocks int
	}
	var before []saved
	for _, mem := range callers {
		for _, m := range mem {
			before = append(before, saved{m.Base[0][0], m.BlockStride, m.Layers[0], m.Blocks})
			// Another rank's descriptor written over this one: every
			// tensor a block further on, another layer, fewer blocks.
			for i := range m.Base {
				for p := range m.Base[i] {
					m.Base[i][p] += m.BlockStride
				}
			}
			m.Layers[0]++
			m.Blocks--
		}
	}
	i := 0
	for _, e := range append(c.ctx, c.gen...) {
		for g := range l.Groups {
			m, want := e.Memory(g), before[i]
			if got := (saved{m.Base[0][0], m.BlockStride, m.Layers[0], m.Blocks}); got != want {
				t.Fatalf("group %d: Engine.Memory follows the caller's descriptor changed after Start: %+v, Start had %+v", g, got, want)
			}
			i++
		}
	}
	if n := transferMemory(t, c, tc, "copied", 5, 100, 32); n == 0 {
		t.Fatal("no byte verified")
	}
	checkNoLeaks(t, c)
}
