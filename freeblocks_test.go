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

// receivingBlocks is the number of e's blocks live receives own.
func receivingBlocks(e *kvxfer.Engine) int {
	n := 0
	for _, st := range e.Pools().Stats() {
		n += st.Receiving
	}
	return n
}

// sendRequest runs the context side of request id (req's bytes) and
// returns its source blocks once the send is DONE.
func sendRequest(t *testing.T, c *cluster, l kvcache.Layout, id string, req, promptLen int) [][]kvcache.BlockID {
	t.Helper()
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen})
	if err != nil {
		t.Fatal(err)
	}
	src, err := sendFilled(t, c.ctx[0], tx, l, promptLen, promptLen, req)
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, tx.Done()); !o.OK {
		t.Fatalf("send %s: %s %v", id, o.Status, o.Err)
	}
	return src
}

// A FreeBlocks of blocks a live receive owns (here: a repeated FreeBlocks
// of an earlier READY's blocks, which the pool has since handed to the
// next request) is refused, naming the group, the block and the live
// request, and frees nothing: the next request gets other blocks, and both
// live requests end READY with their own bytes.
func TestFreeBlocksRefusesLiveReceive(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 1)
	gen := c.gen[0]
	rx1, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r1", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src1 := sendRequest(t, c, l, "r1", 1, 64)
	o1 := waitOutcome(t, rx1.Done())
	if !o1.OK {
		t.Fatalf("r1 %s %v", o1.Status, o1.Err)
	}
	if err := gen.FreeBlocks(o1.Blocks); err != nil {
		t.Fatal(err)
	}
	// r2 is given r1's blocks (the free list is LIFO) and waits for its
	// writer.
	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r2", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "r2 holds its blocks", func() bool { return gen.Pools().Used() > 0 })
	held := gen.Pools().Used()
	// The caller's mistake: r1's blocks freed again.
	err = gen.FreeBlocks(o1.Blocks)
	if err == nil {
		t.Fatalf("a second FreeBlocks of r1's blocks succeeded while live request r2 owns them (used %d, was %d)", gen.Pools().Used(), held)
	}
	want := fmt.Sprintf("group 0: kvcache: block owned by a live receive: Free: block %d is receiving: a live request owns it", o1.Blocks[0][0])
	if !errors.Is(err, kvcache.ErrBlockReceiving) || !strings.Contains(err.Error(), want) {
		t.Fatalf("second FreeBlocks: %v, want ErrBlockReceiving containing %q", err, want)
	}
	if used := gen.Pools().Used(); used != held {
		t.Fatalf("a refused FreeBlocks changed the pool: used %d, was %d", used, held)
	}
	rx3, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r3", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "r3 holds its blocks", func() bool { return gen.Pools().Used() == 2*held })
	src2 := sendRequest(t, c, l, "r2", 2, 64)
	src3 := sendRequest(t, c, l, "r3", 3, 64)
	o2, o3 := waitOutcome(t, rx2.Done()), waitOutcome(t, rx3.Done())
	if !o2.OK || !o3.OK {
		t.Fatalf("r2 %s %v, r3 %s %v", o2.Status, o2.Err, o3.Status, o3.Err)
	}
	for g := range o2.Blocks {
		for _, id := range o2.Blocks[g] {
			if slices.Contains(o3.Blocks[g], id) {
				t.Fatalf("live requests r2 and r3 share group %d block %d", g, id)
			}
		}
	}
	if verify(t, gen, l, 64, o2.Blocks, 2) == 0 || verify(t, gen, l, 64, o3.Blocks, 3) == 0 {
		t.Fatal("no byte verified")
	}
	if receivingBlocks(gen) != 0 {
		t.Fatalf("READY blocks still the receives': %+v", gen.Pools().Stats())
	}
	for _, b := range [][][]kvcache.BlockID{o2.Blocks, o3.Blocks} {
		if err := gen.FreeBlocks(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, src := range [][][]kvcache.BlockID{src1, src2, src3} {
		if err := c.ctx[0].Pools().Free(src); err != nil {
			t.Fatal(err)
		}
	}
	checkNoLeaks(t, c)
}

// A framework that allocates the pool's blocks itself and passes them in
// ReceiveRequest.Blocks lends them to the receive: FreeBlocks of them, or
// another Receive into them, is refused while the receive is live (after
// a failure: until Released), and when it ends they are the framework's
// again, allocated, never freed by kvxfer.
func TestFreeBlocksRefusesLentBlocks(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(string, *kvxfer.Config) {})
	gen := c.gen[0]
	counts := make([]int, len(l.Groups))
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(64, grp.Window, l.TokensPerBlock, 0)
		counts[g] = end - first
	}
	owned, err := gen.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	n := gen.Pools().Used()

	// READY.
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "lent", PromptLen: 64, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	if err := gen.FreeBlocks(owned); !errors.Is(err, kvcache.ErrBlockReceiving) || !strings.Contains(err.Error(), "request lent") {
		t.Fatalf("FreeBlocks of blocks lent to live request \"lent\": %v, want ErrBlockReceiving naming it", err)
	}
	if rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "again", PromptLen: 64, Context: "ctx", Blocks: owned}); err == nil {
		rx2.Cancel()
		waitOutcome(t, rx2.Done())
		t.Fatal("a second live Receive into the same lent blocks was accepted")
	} else if !errors.Is(err, kvcache.ErrBlockReceiving) || !strings.Contains(err.Error(), "lent") {
		t.Fatalf("a second Receive into lent blocks: %v, want ErrBlockReceiving naming request lent", err)
	}
	src := sendRequest(t, c, l, "lent", 4, 64)
	o := waitOutcome(t, rx.Done())
	if !o.OK || !slices.EqualFunc(o.Blocks, owned, slices.Equal) {
		t.Fatalf("rx %s %v blocks %v, want READY in %v", o.Status, o.Err, o.Blocks, owned)
	}
	if st := gen.Pools().Stats(); receivingBlocks(gen) != 0 || gen.Pools().Used() != n {
		t.Fatalf("after READY the framework's %d blocks are not its own, allocated: %+v", n, st)
	}
	if err := c.ctx[0].Pools().Free(src); err != nil {
		t.Fatal(err)
	}

	// A failure: refused until Released, then the framework's again. The
	// writer's answers are held back on the link: nothing has told this
	// side it is quiescent.
	before := link.atCtx.Load()
	rx, err = gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "fail", PromptLen: 64, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the RequestData at the context side", func() bool { return link.atCtx.Load() > before })
	link.setCut(true)
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "fail", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	if src, err = c.ctx[0].Pools().Alloc([]int{4, 4}); err != nil {
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
	if err := gen.FreeBlocks(owned); !errors.Is(err, kvcache.ErrBlockReceiving) {
		t.Fatalf("FreeBlocks of lent blocks before Released: %v, want ErrBlockReceiving", err)
	}
	link.setCut(false) // the writer's answer comes through
	<-rx.Released()
	fence.Fire(nil)
	waitOutcome(t, tx.Done())
	if used := gen.Pools().Used(); used != n || receivingBlocks(gen) != 0 {
		t.Fatalf("after Released: used %d (want the framework's %d, allocated), %+v", used, n, gen.Pools().Stats())
	}
	if err := gen.FreeBlocks(owned); err != nil {
		t.Fatal(err)
	}
	if err := c.ctx[0].Pools().Free(src); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}

// TestFreeBlocksNeverHandedOut: FreeBlocks of a block the engine never
// handed out says that the block is not allocated, naming the group and
// the block (errors.Is: kvcache.ErrBlockFree, and kvcache.ErrDoubleFree as
// before); freeing blocks twice still matches ErrDoubleFree. Before, both
// read "double free". (Checked to fail with the old text.)
func TestFreeBlocksNeverHandedOut(t *testing.T) {
	e := startPool(t, 1<<20)
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	err := e.FreeBlocks([][]kvcache.BlockID{{50}})
	if !errors.Is(err, kvcache.ErrBlockFree) || !errors.Is(err, kvcache.ErrDoubleFree) ||
		!strings.Contains(err.Error(), "group 0") || !strings.Contains(err.Error(), "block 50 is not allocated") || strings.Contains(err.Error(), "double free") {
		t.Fatalf("FreeBlocks of a block never handed out: %v, want ErrBlockFree saying block 50 of group 0 is not allocated", err)
	}
	one := make([]int, e.Pools().Groups())
	one[0] = 1
	b, err := e.Pools().Alloc(one)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.FreeBlocks(b); err != nil {
		t.Fatal(err)
	}
	if err := e.FreeBlocks(b); !errors.Is(err, kvcache.ErrDoubleFree) {
		t.Fatalf("FreeBlocks twice: %v, want ErrDoubleFree", err)
	}
}
