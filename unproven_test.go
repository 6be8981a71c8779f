package kvxfer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// TestUnprovenCloseKeepsOpsInDoubt: a batch is on the wire and never
// completes (the peer is alive but does not progress); the request's
// deadline passes and, after the drain grace, its endpoint is closed — by
// force, as UCX's close does after its timeout, so the close proves
// nothing (rdma.ErrCloseUnproven). The op must stay in doubt: no terminal
// frame tells the generation side that the writer is quiescent (it fails
// the request at its own deadline and quarantines the pages), the context
// side keeps its source pins (Done does not fire), and Close reports the
// session undrained instead of unmapping memory a write may still touch.
func TestUnprovenCloseKeepsOpsInDoubt(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	var hung atomic.Bool
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.WithUnprovenClose(),
		faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	gag := loopback.New(loopback.WithNetwork(net))
	ce, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: ag, TransferTimeout: 30 * time.Second, DrainGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ge, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: gag, TransferTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "cut", PromptLen: 64, Context: "ctx", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "cut", PromptLen: 64, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := tx.Chunk(c0, c0.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the endpoint's unproven close", func() bool { return ce.Stats().ClosesUnproven == 1 })

	ro := waitOutcome(t, rx.Done())
	if ro.OK || !errors.Is(ro.Err, kvxfer.ErrTimeout) {
		t.Fatalf("rx outcome %s %v, want a timeout: the writer never said it was quiescent", ro.Status, ro.Err)
	}
	waitUntil(t, "the destination pages quarantined", func() bool { return ge.Stats().QuarantinedBytes > 0 })
	// Nothing can make the session quiescent now: its op stays in doubt.
	select {
	case o := <-tx.Done():
		t.Fatalf("tx Done (%s %v) after a close that proved nothing: the source pins were dropped", o.Status, o.Err)
	default:
	}
	if err := ce.Pools().Free(src); err == nil {
		t.Fatal("the source blocks of an op in doubt were freed")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := ce.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Errorf("context engine Close: %v, want ErrUndrained (its session's op is in doubt)", err)
	}
	if err := ge.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Errorf("generation engine Close: %v, want ErrUndrained (its pages are quarantined)", err)
	}
	_ = ag.Close()
	_ = gag.Close()
}
