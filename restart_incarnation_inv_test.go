//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// helloLater is a Link that does not know instance hide's Hello yet (over
// zmq: a peer whose Hello has not reached this side, as just after a
// start): Hello for it fails as for a peer not heard.
type helloLater struct {
	control.Link
	hide   string
	on     atomic.Bool
	hidden atomic.Int64 // Hellos asked for and not given
}

func (l *helloLater) Hello(p messages.PeerID) (*messages.Hello, error) {
	if l.on.Load() && p.Instance == l.hide {
		l.hidden.Add(1)
		return nil, fmt.Errorf("%w: %s has not said Hello", control.ErrPeerGone, p)
	}
	return l.Link.Hello(p)
}

// TestUnaddressedRequestFreedOnAnotherIncarnationsAck: a generation
// request started before the writer's Hello was known was addressed to
// incarnation 0, and its session then took a Result or CancelAck of any
// incarnation of the writer as its proof (RxSession.onFrame skips the
// check when the writer's incarnation is 0). Incarnation 1 received the
// RequestData and posted a write it cannot prove over (its close is
// unproven: the write may still land); incarnation 2 of the same name,
// which never heard of the request, answered the generation side's Cancel
// with a CancelAck - and the generation side freed the destination blocks
// on it (DESIGN §3: a new incarnation is no proof of the old one's end).
// Now the RequestData waits for the writer's Hello (asked for again before
// it leaves), and leaves addressed to incarnation 1. (Found by review;
// fails without the wait: the blocks are freed.)
func TestUnaddressedRequestFreedOnAnotherIncarnationsAck(t *testing.T) {
	l := smallLayout()
	mem := control.NewMemLink()
	net := loopback.NewNetwork()
	held := faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.Hang(faulty.Always()), faulty.WithUnprovenClose())
	gag, c2ag := loopback.New(loopback.WithNetwork(net)), loopback.New(loopback.WithNetwork(net))
	defer func() { _, _, _ = held.Close(), gag.Close(), c2ag.Close() }()
	start := func(inst string, link control.Link, ag rdma.Agent) *kvxfer.Engine {
		cfg := kvxfer.Config{Instance: inst, Parallel: tp1, Rank: tp1.RankAt(0), Layout: &l, PoolBytes: 4 << 20, Workers: 1,
			Link: link, Agent: ag, TransferTimeout: 30 * time.Second, DrainGrace: 50 * time.Millisecond}
		e, err := kvxfer.Start(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	glink := &helloLater{Link: mem, hide: "ctx"}
	glink.on.Store(true)
	gen := start("gen", glink, gag)
	ctx1 := start("ctx", mem, held)
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r1", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sendWhole(t, ctx1, l, "r1", 1, 64)
	// The Hello comes once the request asked for it at its start and
	// again before its RequestData would leave (or once a write is posted:
	// a RequestData that did not wait).
	deadline := time.Now().Add(10 * time.Second)
	for glink.hidden.Load() < 2 && ctx1.Stats().OpsPosted == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the Hello was asked for %d times and no write posted", glink.hidden.Load())
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	glink.on.Store(false)
	for ctx1.Stats().OpsPosted == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no write posted")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	inc1 := ctx1.Hello().Incarnation
	// Incarnation 1 goes: its held write is cut by a close that proves nothing.
	cctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_ = ctx1.Close(cctx)
	cancel()
	if n := ctx1.Stats().ClosesUnproven; n == 0 {
		t.Fatalf("incarnation 1's close proved its write over: the test sees nothing")
	}
	ctx2 := start("ctx", mem, c2ag)
	defer closeWithin(t, ctx2, "ctx2")
	o := waitOutcome(t, rx.Done())
	if o.OK {
		t.Fatalf("r1 %s", o.Status)
	}
	deadline = time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if gen.Pools().Quarantined() == 0 {
			t.Errorf("r1 (%s: %v): its destination blocks were freed on incarnation %d's word, while incarnation %d's write on them was never proven over (closes unproven: %d)",
				o.Status, o.Err, ctx2.Hello().Incarnation, inc1, ctx1.Stats().ClosesUnproven)
			break
		}
		time.Sleep(5 * time.Millisecond) // poll with a deadline
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	_ = gen.Close(ctx)
}

// TestReaddressedToAnExitedIncarnation: a request waiting for its writer's
// Hello is re-addressed to the incarnation the Hello names once it comes —
// one already proven exited (WriterExited reached the engine while no
// request was addressed to it, and an incarnation exits once). The proof
// applies to the request when it is re-addressed: it fails at once, its
// blocks freed, instead of waiting for an answer from a dead process with
// its blocks quarantined for good. (Found by review; fails without the
// table's answer to Readdress.)
func TestReaddressedToAnExitedIncarnation(t *testing.T) {
	l := smallLayout()
	mem := control.NewMemLink()
	glink := &helloLater{Link: mem, hide: "ctx"}
	glink.on.Store(true)
	gen, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Parallel: tp1, Rank: tp1.RankAt(0),
		Layout: &l, PoolBytes: 4 << 20, Workers: 1, Link: glink, TransferTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(t, gen, "gen")
	ctxID := messages.PeerID{Instance: "ctx"}
	got := make(chan messages.Frame, 64) // incarnation 7 of ctx: says Hello, then is proven exited
	lis, err := mem.Listen(&messages.Hello{From: ctxID, Incarnation: 7, LayoutHash: gen.Hello().LayoutHash,
		Parallel: messages.Parallel{TP: 1, PP: 1}}, func(f messages.Frame) { got <- f })
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx", ContextParallel: tp1})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for glink.hidden.Load() < 2 { // asked at the start, and before its RequestData would leave
		if time.Now().After(deadline) {
			t.Fatalf("the Hello was asked for %d times", glink.hidden.Load())
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	if n, err := gen.WriterExited(ctxID, 7, "test: its pidfd"); err != nil || n != 0 {
		t.Fatalf("WriterExited = %d, %v; want 0 requests (none addressed to it yet)", n, err)
	}
	glink.on.Store(false) // the Hello of incarnation 7 reaches the generation side
	o := waitOutcome(t, rx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
		t.Errorf("r: %s %v, want failed: its writer's incarnation has exited", o.Status, o.Err)
	}
	deadline = time.Now().Add(time.Minute)
	for gen.Pools().Used()+gen.Pools().Quarantined() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d blocks used and %d quarantined after r ended: the exit proof did not apply to it",
				gen.Pools().Used(), gen.Pools().Quarantined())
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}
