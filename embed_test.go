package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Issue 18 part 2: the framework's own destination block ids, and MLA
// context ranks with nothing to write.

// ownedBlocks picks destination blocks the way a framework's allocator
// would (here: the highest ids, never what kvxfer's pool hands out first).
func ownedBlocks(e *kvxfer.Engine, l kvcache.Layout, promptLen int) [][]kvcache.BlockID {
	out := make([][]kvcache.BlockID, len(l.Groups))
	for g, grp := range l.Groups {
		if len(e.Shape().Layers[g]) == 0 {
			continue
		}
		first, end := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
		n := e.Pools().Geometry(g).Blocks
		for i := range end - first {
			out[g] = append(out[g], kvcache.BlockID(n-1-i))
		}
	}
	return out
}

// TestCallerOwnedDestinationBlocks: READY hands back exactly the blocks the
// framework passed, filled with the right bytes; kvxfer's pool allocated
// none of its own, and holds the framework's only while they are written.
func TestCallerOwnedDestinationBlocks(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	owned := ownedBlocks(c.gen[0], l, 100)
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "own", PromptLen: 100, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	// kvxfer's pool holds the framework's blocks (free in it) reserved for
	// the receive, and no block of its own.
	n := 0
	for _, ids := range owned {
		n += len(ids)
	}
	if used := c.gen[0].Pools().Used(); used != n {
		t.Fatalf("kvxfer's pool holds %d blocks for a request that brought its own %d", used, n)
	}
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "own", PromptLen: 100})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, c.ctx[0], tx, l, 100, 64, 9)
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, tx.Done()); !o.OK {
		t.Fatalf("tx %s %v", o.Status, o.Err)
	}
	o := waitOutcome(t, rx.Done())
	if !o.OK || !slices.EqualFunc(o.Blocks, owned, slices.Equal) {
		t.Fatalf("rx %s %v blocks %v, want READY with the framework's %v", o.Status, o.Err, o.Blocks, owned)
	}
	if n := verify(t, c.gen[0], l, 100, o.Blocks, 9); n == 0 {
		t.Fatal("no byte verified")
	}
	select {
	case <-rx.Released():
	default:
		t.Fatal("READY but the blocks are not released to the framework")
	}
	_ = c.ctx[0].Pools().Free(src)
	checkNoLeaks(t, c)
}

// TestCallerOwnedBlocksReleasedOnlyAfterQuiescence: after a failure the
// framework's blocks are released only once the writer said it is
// quiescent (until then another Receive into them is refused: here its
// CancelAck is held back on the way); a wrong count or an id outside the
// pool is refused at once naming it.
func TestCallerOwnedBlocksReleasedOnlyAfterQuiescence(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(string, *kvxfer.Config) {})
	owned := ownedBlocks(c.gen[0], l, 64)
	bad := [][]kvcache.BlockID{owned[0][:1], owned[1]}
	if _, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "bad", PromptLen: 64, Context: "ctx", Blocks: bad}); err == nil {
		t.Fatal("a wrong number of destination blocks was accepted")
	}
	outside := [][]kvcache.BlockID{{0, 1, 2, 1 << 20}, owned[1]}
	if _, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "bad", PromptLen: 64, Context: "ctx", Blocks: outside}); err == nil {
		t.Fatal("a destination block outside the pool was accepted")
	}
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "fail", PromptLen: 64, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	// The context side holds a chunk whose fence has not fired; the
	// writer's answers to the generation side are held back, so nothing
	// has told it the writer is quiescent.
	waitUntil(t, "the RequestData at the context side", func() bool { return link.atCtx.Load() == 1 })
	link.setCut(true)
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "fail", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	src, err := c.ctx[0].Pools().Alloc([]int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	ch := kvcache.Chunk{Start: 0, End: 64, Last: true}
	fence := &kvxfer.ManualFence{}
	if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), fence); err != nil {
		t.Fatal(err)
	}
	rx.Cancel()
	if o := waitOutcome(t, rx.Done()); o.OK {
		t.Fatalf("rx %s after cancel", o.Status)
	}
	select {
	case <-rx.Released():
		t.Fatal("released before the writer said it is quiescent")
	default:
	}
	if _, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "again", PromptLen: 64, Context: "ctx", Blocks: owned}); !errors.Is(err, kvcache.ErrBlockReceiving) {
		t.Fatalf("a Receive into the framework's blocks before Released: %v, want ErrBlockReceiving", err)
	}
	link.setCut(false) // the writer's answer (its op never left) comes through
	<-rx.Released()
	fence.Fire(nil)
	waitOutcome(t, tx.Done())
	again, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "again", PromptLen: 64, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatalf("a Receive into the framework's blocks after Released: %v", err)
	}
	again.Cancel()
	waitOutcome(t, again.Done())
	<-again.Released()
	_ = c.ctx[0].Pools().Free(src)
	checkNoLeaks(t, c)
}

// TestCallerOwnedBlocksTakenByOneReceive: the framework's own destination
// blocks (free in kvxfer's pool, which does not track them) passed to a
// live receive are refused to a second Receive, naming the block and the
// live request; once the first is READY they are the framework's again,
// and a Receive into them is taken. (Checked to fail without the record of
// free blocks: the second Receive was taken, and its writes would land in
// the blocks READY had handed to the framework.)
func TestCallerOwnedBlocksTakenByOneReceive(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	gen := c.gen[0]
	owned := ownedBlocks(gen, l, 64)
	first, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "first", PromptLen: 64, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("layer group 0: destination block %d is receiving: live request first owns it", owned[0][0])
	if second, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "second", PromptLen: 64, Context: "ctx", Blocks: owned}); err == nil {
		second.Cancel()
		waitOutcome(t, second.Done())
		t.Fatal("a second live Receive into the framework's blocks was taken")
	} else if !errors.Is(err, kvcache.ErrBlockReceiving) || !strings.Contains(err.Error(), want) {
		t.Fatalf("a second Receive into the framework's blocks: %v, want ErrBlockReceiving: %q", err, want)
	}
	src1 := sendRequest(t, c, l, "first", 5, 64)
	if o := waitOutcome(t, first.Done()); !o.OK || verify(t, gen, l, 64, o.Blocks, 5) == 0 {
		t.Fatalf("first: %s %v", o.Status, o.Err)
	}
	second, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "second", PromptLen: 64, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatalf("a Receive into the framework's blocks after READY: %v", err)
	}
	src2 := sendRequest(t, c, l, "second", 6, 64)
	if o := waitOutcome(t, second.Done()); !o.OK || verify(t, gen, l, 64, o.Blocks, 6) == 0 {
		t.Fatalf("second: %s %v", o.Status, o.Err)
	}
	for _, src := range [][][]kvcache.BlockID{src1, src2} {
		if err := c.ctx[0].Pools().Free(src); err != nil {
			t.Fatal(err)
		}
	}
	checkNoLeaks(t, c)
}

// TestMLARankWithNoPeerFinishesAtOnce: with MLA, context TP2 and
// generation TP1, context TP rank 1 writes to no generation rank. A Send
// that names the generation parallelism ends DONE at once, holding nothing
// (before: it waited for a RequestData that never comes and failed at its
// deadline with its pins held).
func TestMLARankWithNoPeerFinishesAtOnce(t *testing.T) {
	l := kvcache.Layout{Name: "mla", Layers: 2, KVHeads: 1, HeadDim: 16, DTypeBytes: 2, TokensPerBlock: 16, MLA: true,
		Groups: kvcache.FullAttention(2)}
	c := startCluster(t, l, kvcache.Parallel{TP: 2, PP: 1}, tp1, 2)
	tx, err := c.ctx[1].Send(context.Background(), kvxfer.SendRequest{ID: "mla", PromptLen: 32, GenerationParallel: tp1})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, tx.Done())
	if o.Status != kvxfer.StatusDone || o.Err != nil {
		t.Fatalf("%s %v, want DONE at once", o.Status, o.Err)
	}
	if _, err := c.ctx[1].Send(context.Background(), kvxfer.SendRequest{ID: "mla2", PromptLen: 32,
		GenerationParallel: kvcache.Parallel{TP: 1, PP: 3}}); !errors.Is(err, kvxfer.ErrBadRequest) {
		t.Fatalf("Send with an impossible generation parallelism: %v", err)
	}
	checkNoLeaks(t, c)
}

// sendFilled hands the prompt over in chunks from fresh source blocks,
// each filled with request req's pattern behind its fence.
func sendFilled(t *testing.T, e *kvxfer.Engine, h *kvxfer.TxHandle, l kvcache.Layout, promptLen, chunkTokens, req int) ([][]kvcache.BlockID, error) {
	t.Helper()
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(promptLen)
	}
	src, err := e.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chunks {
		f := &kvxfer.ManualFence{}
		if err := h.Chunk(ch, ch.Runs(l.TokensPerBlock, src), f); err != nil {
			return src, err
		}
		b0, b1 := ch.Blocks(l.TokensPerBlock)
		for g := range l.Groups {
			for b := b0; b < b1; b++ {
				fill(e, l, g, src[g][b], b, req)
			}
		}
		f.Fire(nil)
	}
	return src, nil
}

// TestPeerMapFrom: an engine's peer map from a context parallelism is the
// one a fresh computation gives (its writers), a copy that a caller may
// change without changing the engine's (whose requests still plan from
// the right map), and a bad parallelism is named.
func TestPeerMapFrom(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 2, PP: 1}, tp1, 2)
	g := c.gen[0]
	ctxPar := kvcache.Parallel{TP: 2, PP: 1}
	pm, err := g.PeerMapFrom(ctxPar)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := kvcache.NewPeerMap(l, ctxPar, tp1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pm.WritersOf(kvcache.Rank{}), fresh.WritersOf(kvcache.Rank{}); !slices.Equal(got, want) || len(got) != 2 {
		t.Fatalf("writers of gen rank 0: %v, want %v (both context ranks)", got, want)
	}
	// A copy of the engine's cached map: a caller's edit of what it
	// returns changes neither the next call's map nor the engine's.
	pm.WritersOf(kvcache.Rank{})[0] = kvcache.Rank{TP: 7}
	pm.Links()[0].Layers[0][0] = -1
	again, err := g.PeerMapFrom(ctxPar)
	if err != nil || again == pm {
		t.Fatalf("second call: %p, %v; want a copy of its own", again, err)
	}
	if got, want := again.WritersOf(kvcache.Rank{}), fresh.WritersOf(kvcache.Rank{}); !slices.Equal(got, want) {
		t.Fatalf("writers after a caller's edit of an earlier map: %v, want %v", got, want)
	}
	if got, want := again.Links()[0].Layers[0][0], fresh.Links()[0].Layers[0][0]; got != want {
		t.Fatalf("link 0's first layer after a caller's edit of an earlier map: %d, want %d", got, want)
	}
	if got, err := g.WritersFrom(ctxPar); err != nil || !slices.Equal(got, fresh.WritersOf(kvcache.Rank{})) {
		t.Fatalf("WritersFrom: %v, %v; want %v", got, err, fresh.WritersOf(kvcache.Rank{}))
	}
	transfer(t, c, l, "after-edits", 1, 100, 32, false)
	if _, err := g.PeerMapFrom(kvcache.Parallel{TP: 3, PP: 1}); !errors.Is(err, kvcache.ErrBadParallelism) {
		t.Fatalf("TP 3: %v, want ErrBadParallelism", err)
	}
	checkNoLeaks(t, c)
}
