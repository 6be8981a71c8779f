package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// frameLimitCluster starts a context and a generation engine over zmq
// links whose listeners take frames of at most ctxLimit and genLimit
// bytes (0: the default), each engine with a pool of poolBytes.
func frameLimitCluster(t *testing.T, ctxLimit, genLimit int, poolBytes uint64) (*cluster, map[string]*zmq.Link) {
	t.Helper()
	links := map[string]*zmq.Link{}
	for inst, max := range map[string]int{"ctx": ctxLimit, "gen": genLimit} {
		l, err := zmq.New(zmq.Config{Insecure: true, Bind: "tcp://127.0.0.1:0", MaxFrameBytes: max})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() }) // after the engines' Close
		links[inst] = l
	}
	par := kvcache.Parallel{TP: 1, PP: 1}
	c := startClusterOn(t, smallLayout(), par, par, 1, clusterOpts{poolBytes: poolBytes,
		link: func(inst string, _ *control.MemLink) control.Link { return links[inst] }})
	ctxID, genID := messages.PeerID{Instance: "ctx"}, messages.PeerID{Instance: "gen"}
	if err := links["ctx"].AddPeer(genID, links["gen"].Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := links["gen"].AddPeer(ctxID, links["ctx"].Endpoint()); err != nil {
		t.Fatal(err)
	}
	return c, links
}

// waitPoolFree polls until e's pools hold as many free blocks as free.
func waitPoolFree(t *testing.T, e *kvxfer.Engine, free []kvcache.PoolStats) {
	t.Helper()
	waitFor(t, "the failed request's blocks back in the pool", func() bool {
		st := e.Pools().Stats()
		for g := range st {
			if st[g].Free != free[g].Free {
				return false
			}
		}
		return true
	})
}

// TestPeerFrameLimit: two engines over zmq links whose listeners take
// frames of different sizes: the context rank's at most
// messages.MinFrameLimit bytes, the generation rank's the default. A
// request whose RequestData is larger than the context rank's limit fails
// at once on both sides, naming the request, the frame's size and both
// limits: the generation side refuses to send it (the context rank's
// Hello says its limit) and tells the context rank with a Cancel, whose
// reason its Send names. Its blocks go back to the pool; a small request
// on the same engines then transfers.
//
// Before, the RequestData left, the context rank's listener dropped it
// (counted oversize, logged there without the request), and both sides
// waited for their deadline.
func TestPeerFrameLimit(t *testing.T) {
	const limit = messages.MinFrameLimit
	c, links := frameLimitCluster(t, limit, 0, 64<<20)
	l := smallLayout()
	par := kvcache.Parallel{TP: 1, PP: 1}
	free := c.gen[0].Pools().Stats()

	const prompt = 3000 * 16 // 3000 blocks of the full group: a RequestData past 4096 bytes
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "big", PromptLen: prompt})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "big", PromptLen: prompt, Context: "ctx", ContextParallel: par})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	want := fmt.Sprintf("exceeds the peer's MaxFrameBytes %d (its Hello; ours is 6291456)", limit)
	if o.OK || !errors.Is(o.Err, kvxfer.ErrFrameUnsent) || !errors.Is(o.Err, zmq.ErrFrameTooLarge) ||
		!strings.Contains(o.Err.Error(), `request big: RequestData for writer ctx/0 refused: `) || !strings.Contains(o.Err.Error(), want) {
		t.Fatalf("receive: %s %v, want FAILED with ErrFrameUnsent naming the request and %q", o.Status, o.Err, want)
	}
	t.Logf("receive: %v", o.Err)
	o = waitOutcome(t, tx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerCancelled) || !strings.Contains(o.Err.Error(), want) {
		t.Fatalf("send: %s %v, want CANCELLED by the peer naming %q", o.Status, o.Err, want)
	}
	t.Logf("send: %v", o.Err)
	waitPoolFree(t, c.gen[0], free)
	if n := links["ctx"].Rejected(); n != 0 {
		t.Fatalf("the context rank's listener rejected %d frames: %v", n, links["ctx"].Stats().Rejected)
	}

	transfer(t, c, l, "small", 1, 64, 64, true)
}

// TestResultPastPeerFrameLimit: the generation rank's listener takes
// frames of at most messages.MinFrameLimit bytes, and a request's payload
// makes its SUCCESS Result larger than that. The context side's Send
// refuses that Result (the generation rank's Hello says its limit), and
// both sides fail at once, naming the Result's size and the limit: the
// context side answers with a FAILED Result without the payload, which
// fits, and the generation side frees its blocks on it. A request with a
// payload that fits then transfers.
//
// Before, the context side failed and the generation side waited for its
// deadline with its blocks held.
func TestResultPastPeerFrameLimit(t *testing.T) {
	const limit = messages.MinFrameLimit
	c, links := frameLimitCluster(t, 0, limit, 0)
	l := smallLayout()
	ce, ge := c.ctx[0], c.gen[0]
	free := ge.Pools().Stats()
	run := func(id string, payload int) (tx, rx kvxfer.Outcome) {
		t.Helper()
		rh, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
		if err != nil {
			t.Fatal(err)
		}
		th, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64, Payload: make([]byte, payload)})
		if err != nil {
			t.Fatal(err)
		}
		c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
		if err := th.Chunk(c0, c0.Runs(l.TokensPerBlock, src), nil); err != nil {
			t.Fatal(err)
		}
		rx, tx = waitOutcome(t, rh.Done()), waitOutcome(t, th.Done())
		if err := ce.Pools().Free(src); err != nil {
			t.Fatal(err)
		}
		return tx, rx
	}
	tx, rx := run("big", 2*limit)
	want := fmt.Sprintf("exceeds the peer's MaxFrameBytes %d (its Hello; ours is 6291456)", limit)
	if tx.OK || !errors.Is(tx.Err, kvxfer.ErrFrameUnsent) || !errors.Is(tx.Err, zmq.ErrFrameTooLarge) ||
		!strings.Contains(tx.Err.Error(), "request big: the Result for gen/0: ") || !strings.Contains(tx.Err.Error(), want) {
		t.Fatalf("send: %s %v, want FAILED with ErrFrameUnsent naming the request and %q", tx.Status, tx.Err, want)
	}
	t.Logf("send: %v", tx.Err)
	if rx.OK || rx.Status != kvxfer.StatusFailed || !errors.Is(rx.Err, kvxfer.ErrPeerFailed) || !strings.Contains(rx.Err.Error(), want) {
		t.Fatalf("receive: %s %v, want FAILED by the peer, naming %q", rx.Status, rx.Err, want)
	}
	t.Logf("receive: %v", rx.Err)
	waitPoolFree(t, ge, free)
	if n := links["gen"].Rejected(); n != 0 {
		t.Fatalf("the generation rank's listener rejected %d frames: %v", n, links["gen"].Stats().Rejected)
	}

	tx, rx = run("fits", 1024)
	if !tx.OK || !rx.OK || len(rx.Payload) != 1024 {
		t.Fatalf("a payload that fits: send %s %v, receive %s %v with %d payload bytes", tx.Status, tx.Err, rx.Status, rx.Err, len(rx.Payload))
	}
	if err := ge.FreeBlocks(rx.Blocks); err != nil {
		t.Fatal(err)
	}
}
