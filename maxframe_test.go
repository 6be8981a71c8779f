package kvxfer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestPeerFrameLimit: two engines over zmq links whose listeners take
// frames of different sizes: the context rank's at most 768 bytes, the
// generation rank's the default. A request whose RequestData is larger
// than the context rank's limit fails at once on both sides, naming the
// request, the frame's size and both limits: the generation side refuses
// to send it (the context rank's Hello says its limit) and tells the
// context rank with a Cancel, whose reason its Send names. Its blocks go
// back to the pool; a small request on the same engines then transfers.
//
// Before, the RequestData left, the context rank's listener dropped it
// (counted oversize, logged there without the request), and both sides
// waited for their deadline.
func TestPeerFrameLimit(t *testing.T) {
	const limit = 768
	links := map[string]*zmq.Link{}
	for inst, max := range map[string]int{"ctx": limit, "gen": 0} {
		l, err := zmq.New(zmq.Config{Insecure: true, Bind: "tcp://127.0.0.1:0", MaxFrameBytes: max})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() }) // after the engines' Close
		links[inst] = l
	}
	l := smallLayout()
	par := kvcache.Parallel{TP: 1, PP: 1}
	c := startClusterOn(t, l, par, par, 1, clusterOpts{link: func(inst string, _ *control.MemLink) control.Link { return links[inst] }})
	ctxID, genID := messages.PeerID{Instance: "ctx"}, messages.PeerID{Instance: "gen"}
	if err := links["ctx"].AddPeer(genID, links["gen"].Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := links["gen"].AddPeer(ctxID, links["ctx"].Endpoint()); err != nil {
		t.Fatal(err)
	}
	free := c.gen[0].Pools().Stats()

	const prompt = 500 * 16 // 500 blocks of the full group: a RequestData past 768 bytes
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "big", PromptLen: prompt})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "big", PromptLen: prompt, Context: "ctx", ContextParallel: par})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx.Done())
	want := "exceeds the peer's MaxFrameBytes 768 (its Hello; ours is 6291456)"
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
	waitFor(t, "the failed request's blocks back in the pool", func() bool {
		st := c.gen[0].Pools().Stats()
		for g := range st {
			if st[g].Free != free[g].Free {
				return false
			}
		}
		return true
	})
	if n := links["ctx"].Rejected(); n != 0 {
		t.Fatalf("the context rank's listener rejected %d frames: %v", n, links["ctx"].Stats().Rejected)
	}

	transfer(t, c, l, "small", 1, 64, 64, true)
}
