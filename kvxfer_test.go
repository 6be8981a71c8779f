package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// smallLayout is a two-group layout (full + sliding window) small enough
// for byte-exact checks.
func smallLayout() kvcache.Layout {
	return kvcache.Layout{Name: "test", Layers: 4, KVHeads: 4, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: []kvcache.LayerGroup{
			{Name: "full", Layers: []int{0, 2}},
			{Name: "swa", Layers: []int{1, 3}, Window: 40},
		}}
}

type cluster struct {
	link     *control.MemLink
	ctx, gen []*kvxfer.Engine
	ctxPar   kvcache.Parallel
	genPar   kvcache.Parallel
	// undrained: engines a test closed with destination blocks left in
	// quarantine, whose Close (once, remembered) reports ErrUndrained.
	undrained []*kvxfer.Engine
}

// closeErr is what Close of e must return in a cluster's cleanup: nil,
// or ErrUndrained for an engine the test left in quarantine.
func (c *cluster) closeErr(e *kvxfer.Engine, err error) error {
	if slices.Contains(c.undrained, e) && errors.Is(err, actors.ErrUndrained) {
		return nil
	}
	return err
}

func startCluster(t *testing.T, l kvcache.Layout, ctxPar, genPar kvcache.Parallel, workers int) *cluster {
	t.Helper()
	return startClusterOn(t, l, ctxPar, genPar, workers, clusterOpts{})
}

// clusterOpts changes what startClusterOn gives an engine (inst "ctx" or
// "gen", rank index i): agent, when set and not nil, instead of the
// engine's own loopback agent; link, when set, the Link it uses, made
// from the cluster's MemLink.
type clusterOpts struct {
	agent func(inst string, i int) rdma.Agent
	link  func(inst string, ml *control.MemLink) control.Link
	// traceDir, when set, has each engine trace to INST-RANK.jsonl there.
	traceDir string
	// ctxSendOnly starts the context engines with Config.SendOnly.
	ctxSendOnly bool
	// poolBytes is each engine's Config.PoolBytes (0: 4 MiB).
	poolBytes uint64
}

// startClusterOn is startCluster with the engines' agents and links from o.
func startClusterOn(t *testing.T, l kvcache.Layout, ctxPar, genPar kvcache.Parallel, workers int, o clusterOpts) *cluster {
	t.Helper()
	c := &cluster{link: control.NewMemLink(), ctxPar: ctxPar, genPar: genPar}
	start := func(inst string, p kvcache.Parallel, i int) *kvxfer.Engine {
		var agent rdma.Agent
		if o.agent != nil {
			agent = o.agent(inst, i)
		}
		var link control.Link = c.link
		if o.link != nil {
			link = o.link(inst, c.link)
		}
		var tracePath string
		if o.traceDir != "" {
			tracePath = filepath.Join(o.traceDir, fmt.Sprintf("%s-%d.jsonl", inst, i))
		}
		poolBytes := o.poolBytes
		if poolBytes == 0 {
			poolBytes = 4 << 20
		}
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Parallel: p, Rank: p.RankAt(i),
			Layout: &l, PoolBytes: poolBytes, Workers: workers, Link: link, Agent: agent, TransferTimeout: 20 * time.Second,
			TracePath: tracePath, SendOnly: o.ctxSendOnly && inst == "ctx"})
		if err != nil {
			t.Fatalf("start %s rank %d: %v", inst, i, err)
		}
		return e
	}
	for i := 0; i < ctxPar.Size(); i++ {
		c.ctx = append(c.ctx, start("ctx", ctxPar, i))
	}
	for i := 0; i < genPar.Size(); i++ {
		c.gen = append(c.gen, start("gen", genPar, i))
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

// pattern is the byte a context rank holds at (layer, part, head, token, b):
// a function of the model coordinates only, so every rank that holds the
// same coordinate holds the same byte.
func pattern(req, layer, part, head, token, b int) byte {
	return byte(req*131 + layer*31 + part*17 + head*7 + token*3 + b)
}

// fill writes the pattern into block id of group g of engine e for global
// block index blk.
func fill(e *kvxfer.Engine, l kvcache.Layout, g int, id kvcache.BlockID, blk, req int) {
	fillPart(e, l, g, id, blk, req, kvcache.LayerPart{})
}

// fillSource writes request req's pattern into src[g][b] for global
// block b of each group g (source blocks allocated from block 0 on).
func fillSource(e *kvxfer.Engine, l kvcache.Layout, src [][]kvcache.BlockID, req int) {
	for g, ids := range src {
		for b, id := range ids {
			fill(e, l, g, id, b, req)
		}
	}
}

// fillPart writes the pattern of the layers of part only (every layer for
// the zero part) into block id of group g.
func fillPart(e *kvxfer.Engine, l kvcache.Layout, g int, id kvcache.BlockID, blk, req int, part kvcache.LayerPart) {
	s := e.Shape()
	geom := e.Pools().Geometry(g)
	buf := e.Region().Bytes()[geom.Offset+uint64(id)*geom.BlockBytes:]
	per := l.Parts() * s.Heads() * l.TokensPerBlock * l.TokenBytes() // bytes of one layer in a block
	for li, layer := range s.Layers[g] {
		if !part.Contains(layer) {
			continue
		}
		i := li * per
		for p := 0; p < l.Parts(); p++ {
			for h := s.HeadLo; h < s.HeadHi; h++ {
				for tok := 0; tok < l.TokensPerBlock; tok++ {
					for b := 0; b < l.TokenBytes(); b++ {
						buf[i] = pattern(req, layer, p, h, blk*l.TokensPerBlock+tok, b)
						i++
					}
				}
			}
		}
	}
}

// verify checks the destination blocks of a READY request; it returns the
// number of bytes checked.
func verify(t *testing.T, e *kvxfer.Engine, l kvcache.Layout, promptLen int, blocks [][]kvcache.BlockID, req int) int {
	t.Helper()
	n := 0
	for g, grp := range l.Groups {
		first, _ := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
		for bi, id := range blocks[g] {
			k, bad := checkBlock(e, l, g, id, first+bi, req)
			if bad != "" {
				t.Fatal(bad)
			}
			n += k
		}
	}
	return n
}

// checkFrom checks that blocks ids of group g hold request req's bytes for
// the global blocks first.. (bad names the first byte that does not).
func checkFrom(e *kvxfer.Engine, l kvcache.Layout, g int, ids []kvcache.BlockID, first, req int) (bad string) {
	for bi, id := range ids {
		if _, bad = checkBlock(e, l, g, id, first+bi, req); bad != "" {
			return bad
		}
	}
	return ""
}

// checkBlock checks that block id of group g holds request req's bytes of
// global block blk: n bytes checked, or bad naming the first that differs.
func checkBlock(e *kvxfer.Engine, l kvcache.Layout, g int, id kvcache.BlockID, blk, req int) (n int, bad string) {
	s := e.Shape()
	geom := e.Pools().Geometry(g)
	buf := e.Region().Bytes()[geom.Offset+uint64(id)*geom.BlockBytes:]
	for _, layer := range s.Layers[g] {
		for part := 0; part < l.Parts(); part++ {
			for h := s.HeadLo; h < s.HeadHi; h++ {
				for tok := 0; tok < l.TokensPerBlock; tok++ {
					for b := 0; b < l.TokenBytes(); b++ {
						if want := pattern(req, layer, part, h, blk*l.TokensPerBlock+tok, b); buf[n] != want {
							return n, fmt.Sprintf("req %d group %d block %d (id %d) layer %d part %d head %d token %d byte %d: got %d want %d",
								req, g, blk, id, layer, part, h, tok, b, buf[n], want)
						}
						n++
					}
				}
			}
		}
	}
	return n, ""
}

// transfer runs one request across the cluster: every gen rank receives,
// every ctx rank sends in chunks with fresh source blocks.
func transfer(t *testing.T, c *cluster, l kvcache.Layout, id string, req, promptLen, chunkTokens int, rxFirst bool) {
	t.Helper()
	transferParts(t, c, l, id, req, promptLen, chunkTokens, rxFirst, []kvcache.LayerPart{{}})
}

// transferParts is transfer with each chunk handed in the layer parts
// given (one zero part: whole chunks).
func transferParts(t *testing.T, c *cluster, l kvcache.Layout, id string, req, promptLen, chunkTokens int, rxFirst bool, parts []kvcache.LayerPart) {
	t.Helper()
	var rxs []*kvxfer.RxHandle
	receive := func() {
		for _, g := range c.gen {
			h, err := g.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: promptLen,
				Context: "ctx", ContextParallel: c.ctxPar})
			if err != nil {
				t.Fatalf("receive: %v", err)
			}
			rxs = append(rxs, h)
		}
	}
	if rxFirst {
		receive()
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	nblk := l.BlocksFor(promptLen)
	var txs []*kvxfer.TxHandle
	var srcs [][][]kvcache.BlockID
	for _, e := range c.ctx {
		counts := make([]int, len(l.Groups))
		for g := range counts {
			if len(e.Shape().Layers[g]) > 0 {
				counts[g] = nblk
			}
		}
		src, err := e.Pools().Alloc(counts)
		if err != nil {
			t.Fatalf("alloc source: %v", err)
		}
		srcs = append(srcs, src)
		h, err := e.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen})
		if err != nil {
			t.Fatalf("send: %v", err)
		}
		txs = append(txs, h)
	}
	if !rxFirst {
		receive()
	}
	// Each chunk is handed over before its KV is written, with a fence
	// that fires once it is: a write that left before its fence would
	// copy stale bytes (caught by verify, and by -race).
	for _, ch := range chunks {
		b0, b1 := ch.Blocks(l.TokensPerBlock)
		for _, p := range parts {
			pc := ch
			pc.Layers = p
			for i, e := range c.ctx {
				f := &kvxfer.ManualFence{}
				if err := txs[i].Chunk(pc, ch.Runs(l.TokensPerBlock, srcs[i]), f); err != nil {
					t.Fatalf("chunk %v: %v", pc, err)
				}
				for g := range l.Groups {
					for b := b0; b < b1 && len(srcs[i][g]) > 0; b++ {
						fillPart(e, l, g, srcs[i][g][b], b, req, p)
					}
				}
				f.Fire(nil)
			}
		}
	}
	for i, h := range txs {
		o := waitOutcome(t, h.Done())
		if !o.OK {
			t.Fatalf("tx %s rank %d: %s %v", id, i, o.Status, o.Err)
		}
		if err := c.ctx[i].Pools().Free(srcs[i]); err != nil {
			t.Fatalf("free source after Done: %v", err)
		}
	}
	for i, h := range rxs {
		o := waitOutcome(t, h.Done())
		if !o.OK {
			t.Fatalf("rx %s rank %d: %s %v", id, i, o.Status, o.Err)
		}
		if n := verify(t, c.gen[i], l, promptLen, o.Blocks, req); n == 0 && promptLen > 0 {
			t.Fatalf("rx %s rank %d: no byte verified", id, i)
		}
		if err := c.gen[i].FreeBlocks(o.Blocks); err != nil {
			t.Fatal(err)
		}
	}
}

// holdFreeBlocks allocates every free block of e's pools, per layer
// group, so that the next request must wait for blocks.
func holdFreeBlocks(t *testing.T, e *kvxfer.Engine) [][]kvcache.BlockID {
	t.Helper()
	st := e.Pools().Stats()
	counts := make([]int, len(st))
	for g, s := range st {
		counts[g] = s.Free
	}
	held, err := e.Pools().Alloc(counts)
	if err != nil {
		t.Fatalf("holding every free block: %v", err)
	}
	return held
}

func waitOutcome(t *testing.T, ch <-chan kvxfer.Outcome) kvxfer.Outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(30 * time.Second):
		t.Fatal("no outcome within 30s")
	}
	return kvxfer.Outcome{}
}

func checkNoLeaks(t *testing.T, c *cluster) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		used := 0
		for _, e := range append(c.ctx, c.gen...) {
			used += e.Pools().Used() + e.Pools().Quarantined()
		}
		if used == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d blocks still used", used)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

func TestTransferMultiPeer(t *testing.T) {
	l := smallLayout()
	cases := []struct {
		name     string
		ctx, gen kvcache.Parallel
	}{
		{"TP1-TP1", kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}},
		{"TP2-TP4", kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 4, PP: 1}},
		{"TP4-TP2", kvcache.Parallel{TP: 4, PP: 1}, kvcache.Parallel{TP: 2, PP: 1}},
		{"PP2-PP1", kvcache.Parallel{TP: 1, PP: 2}, kvcache.Parallel{TP: 1, PP: 1}},
		{"TP2PP2-TP1PP1", kvcache.Parallel{TP: 2, PP: 2}, kvcache.Parallel{TP: 1, PP: 1}},
		// A stage of PP4 holds one layer, so no layer of one of the two
		// groups; its pools (PoolBytes a multiple of its block set) leave
		// room for that group's placeholder.
		{"PP4-TP1", kvcache.Parallel{TP: 1, PP: 4}, kvcache.Parallel{TP: 1, PP: 1}},
		{"TP1-PP4", kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, l, tc.ctx, tc.gen, 2)
			for i, promptLen := range []int{100, 16, 64, 130} {
				transfer(t, c, l, fmt.Sprintf("%s-r%d", tc.name, i), i+1, promptLen, 32, i%2 == 0)
			}
			checkNoLeaks(t, c)
		})
	}
}

func TestConfigErrors(t *testing.T) {
	l := smallLayout()
	bad := l
	bad.KVHeads = 0
	cases := []struct {
		name string
		cfg  kvxfer.Config
		want string
	}{
		{"workers", kvxfer.Config{Layout: &l, Workers: -1}, "Workers = -1"},
		// A count meant for another setting: refused, naming it, rather
		// than Start spending the process's memory on a worker table.
		{"workers huge", kvxfer.Config{Layout: &l, Workers: 1 << 40}, "Workers = 1099511627776"},
		{"workers past max", kvxfer.Config{Layout: &l, Workers: kvxfer.MaxWorkers + 1}, fmt.Sprintf("Workers = %d", kvxfer.MaxWorkers+1)},
		{"backend", kvxfer.Config{Layout: &l, Backend: "carrier-pigeon"}, `Backend = "carrier-pigeon"`},
		{"layout", kvxfer.Config{Layout: &bad}, "KVHeads = 0"},
		{"model", kvxfer.Config{Model: "gpt-17"}, "gpt-17"},
		{"none", kvxfer.Config{}, "neither Model nor Layout"},
		{"rank", kvxfer.Config{Layout: &l, Rank: kvcache.Rank{TP: 3}}, "Rank"},
		{"writer lease", kvxfer.Config{Layout: &l, WriterLease: -time.Second}, "WriterLease = -1s"},
		{"quarantine past pool", kvxfer.Config{Layout: &l, PoolBytes: 1 << 20, MaxQuarantinedBytes: 1<<20 + 1},
			"MaxQuarantinedBytes = 1048577 is more than PoolBytes = 1048576"},
		// 2^21 blocks of 512 bytes per group: a Hello no peer (nor the
		// wire encoder) takes, refused at Start naming PoolBytes.
		{"pool blocks", kvxfer.Config{Layout: &l, TokensPerBlock: 1, PoolBytes: 1 << 30}, "PoolBytes = 1073741824 holds 2097152 blocks per layer group"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kvxfer.Start(context.Background(), tc.cfg)
			if !errors.Is(err, kvxfer.ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
			if got := err.Error(); !contains(got, tc.want) {
				t.Fatalf("err = %q, want it to name %q", got, tc.want)
			}
		})
	}
}

// TestConfigTooManyBlocksIsTyped: a pool of more blocks than a Hello may
// name is refused with a *TooManyBlocksError carrying the count, so that
// a caller that sized the pool (kvxfer bench) names its own settings
// without reading the message. (Checked to fail without the type: bench
// parsed the count out of the error's text.)
func TestConfigTooManyBlocksIsTyped(t *testing.T) {
	l := smallLayout()
	_, err := kvxfer.Start(context.Background(), kvxfer.Config{Layout: &l, TokensPerBlock: 1, PoolBytes: 1 << 30})
	var tm *kvxfer.TooManyBlocksError
	if !errors.As(err, &tm) || !errors.Is(err, kvxfer.ErrConfig) {
		t.Fatalf("Start with 2^21 blocks per group: %v, want a *TooManyBlocksError wrapping ErrConfig", err)
	}
	if want := (kvxfer.TooManyBlocksError{PoolBytes: 1 << 30, Blocks: 1 << 21, SetBytes: 512}); *tm != want {
		t.Fatalf("TooManyBlocksError = %+v, want %+v", *tm, want)
	}
	if tm.Blocks <= messages.MaxBlocks {
		t.Fatalf("Blocks = %d, want more than messages.MaxBlocks (%d)", tm.Blocks, messages.MaxBlocks)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (func() bool {
		for i := 0; i+len(sub) <= len(s); i++ {
			if s[i:i+len(sub)] == sub {
				return true
			}
		}
		return false
	})())
}

// hostile is a fake generation peer on a MemLink: it says a Hello of its
// choosing and records the frames sent back to it.
type hostile struct {
	id     messages.PeerID
	frames chan messages.Frame
	conn   control.Conn
}

func newHostile(t *testing.T, c *cluster, hello messages.Hello) *hostile {
	t.Helper()
	h := &hostile{id: hello.From, frames: make(chan messages.Frame, 64)}
	lis, err := c.link.Listen(&hello, func(f messages.Frame) { h.frames <- f })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	if h.conn, err = c.link.Dial(messages.PeerID{Instance: "ctx", Rank: 0}); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *hostile) expectResult(t *testing.T, request string, want messages.Status, mention string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case f := <-h.frames:
			r, ok := f.(*messages.Result)
			if !ok || r.RequestID != request {
				continue
			}
			if r.Status != want || !contains(r.Error, mention) {
				t.Fatalf("result for %s: %s %q, want %s naming %q", request, r.Status, r.Error, want, mention)
			}
			return
		case <-deadline:
			t.Fatalf("no result for %s", request)
		}
	}
}

// TestHostilePeerFrames: a peer sends frames with out-of-range blocks, a
// mismatched layout hash, results for unknown requests, stale epochs and
// invalid fields. Each is rejected (the named request fails with a reason,
// or the frame is counted and dropped); an honest transfer running beside
// them completes with every byte verified and nothing leaks.
func TestHostilePeerFrames(t *testing.T) {
	l := smallLayout()
	one := kvcache.Parallel{TP: 1, PP: 1}
	c := startCluster(t, l, one, one, 2)
	good := *c.gen[0].Hello()
	good.From = messages.PeerID{Instance: "evil", Rank: 0}
	evil := newHostile(t, c, good)
	badHash := good
	badHash.From = messages.PeerID{Instance: "evil-hash", Rank: 0}
	badHash.LayoutHash ^= 0xdead
	evilHash := newHostile(t, c, badHash)

	rd := func(id string, from messages.PeerID, blocks ...int32) *messages.RequestData {
		return &messages.RequestData{RequestID: id, Epoch: 1, From: from, GenParallel: messages.Parallel{TP: 1, PP: 1},
			PromptLen: 32, Groups: []messages.GroupDest{{First: 0, Blocks: blocks}, {First: 0, Blocks: blocks}}}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		transfer(t, c, l, "honest", 5, 100, 32, true)
	}()
	// Out-of-range destination block: the request fails, naming the block.
	if err := evil.conn.Send(rd("oob", evil.id, 0, 1<<30)); err != nil {
		t.Fatal(err)
	}
	evil.expectResult(t, "oob", messages.StatusFailed, "outside pool")
	// More blocks than the prompt has.
	if err := evil.conn.Send(rd("toolong", evil.id, 0, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	evil.expectResult(t, "toolong", messages.StatusFailed, "beyond prompt")
	// Mismatched layout hash: named with both values.
	if err := evilHash.conn.Send(rd("hash", evilHash.id, 0, 1)); err != nil {
		t.Fatal(err)
	}
	evilHash.expectResult(t, "hash", messages.StatusFailed, "layout hash")
	// Invalid frames are rejected before any session sees them.
	before := c.ctx[0].Stats().FramesRejected
	bad := rd("neg", evil.id, -5)
	_ = evil.conn.Send(bad)
	// One that names its request is answered FAILED at once, naming the
	// field (DESIGN.md §6), instead of leaving it to its deadline.
	evil.expectResult(t, "neg", messages.StatusFailed, "block[0] = -5")
	_ = evil.conn.Send(&messages.Result{RequestID: "x", From: evil.id, Status: 99})
	// Results for unknown requests at the generation side are counted.
	genConn, err := c.link.Dial(messages.PeerID{Instance: "gen", Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	staleBefore := c.gen[0].Stats().FramesStale
	_ = genConn.Send(&messages.Result{RequestID: "nobody", Epoch: 3, From: evil.id, Status: messages.StatusSuccess})
	<-done
	deadline := time.Now().Add(10 * time.Second)
	for c.ctx[0].Stats().FramesRejected < before+2 || c.gen[0].Stats().FramesStale < staleBefore+1 {
		if time.Now().After(deadline) {
			t.Fatalf("rejections %d (from %d), stale %d (from %d)", c.ctx[0].Stats().FramesRejected, before,
				c.gen[0].Stats().FramesStale, staleBefore)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	checkNoLeaks(t, c)
}
