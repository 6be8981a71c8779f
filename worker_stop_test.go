//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
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

// twoWorkerPair is unprovenPair with two sender workers on each side (so
// that frames still go out once worker 0 has stopped for good).
func twoWorkerPair(t *testing.T, l kvcache.Layout, tracePath string, opts ...faulty.Option) (ce, ge *kvxfer.Engine, closeAgents func()) {
	t.Helper()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), opts...)
	gag := loopback.New(loopback.WithNetwork(net))
	var err error
	ce, err = kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20, Workers: 2,
		Link: link, Agent: ag, TransferTimeout: 30 * time.Second, DrainGrace: 50 * time.Millisecond, TracePath: tracePath})
	if err != nil {
		t.Fatal(err)
	}
	ge, err = kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20, Workers: 2,
		Link: link, Agent: gag, TransferTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return ce, ge, func() { _, _ = ag.Close(), gag.Close() }
}

// onWorker0 is a request id whose stream to gen goes through sender
// worker 0 of two.
func onWorker0(gen *kvxfer.Engine, prefix string) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s-%d", prefix, i); actors.WorkerFor(id, gen.Hello().From, 2) == 0 {
			return id
		}
	}
}

// spendRestarts crashes worker 0 of ce n times and waits for its n
// restarts (the budget is ten).
func spendRestarts(t *testing.T, ce *kvxfer.Engine, n int) {
	t.Helper()
	for range n {
		ce.CrashWorker(0)
	}
	waitUntil(t, "the restarts of worker 0", func() bool { return ce.Stats().WorkerRestarts >= int64(n) })
	if got := ce.Stats().WorkerRestarts; got != int64(n) {
		t.Fatalf("%d restarts, want %d", got, n)
	}
}

// TestWorkerStoppedForGoodWithSourcesReleased: a sender worker is stopped
// for good (its restart budget spent) while a batch of it hangs on the
// wire, and the backend's Close of its endpoint cannot prove the write
// over (rdma.ErrCloseUnproven) but proves that it reads none of the
// batch's source any more (rdma.ErrSourcesReleased). The close is its
// stop's, or its last restart's with the stop right behind it. Either
// way that report came back to the worker as a message after it had
// stopped, and was lost: the op stayed in doubt for the engine's life,
// its source blocks pinned, its request never Done, the engine's Close
// undrained. Now the worker's stop carries it (TxWorkerDead.Released):
// the request fails, its source blocks can be freed, and the generation
// side gets no proof (no terminal frame, its Cancel unanswered, its pages
// quarantined). Without the sentinel the op stays in doubt as before.
// Checked to fail with the fix reverted: "by its stop" always, "by its
// last restart" whenever the close's report comes after the second crash
// (it did in each of 3 runs).
func TestWorkerStoppedForGoodWithSourcesReleased(t *testing.T) {
	for _, how := range []string{"by its stop", "by its last restart"} {
		for _, released := range []bool{true, false} {
			t.Run(fmt.Sprintf("closed %s, sources released %v", how, released), func(t *testing.T) {
				l := smallLayout()
				var hung atomic.Bool
				opts := []faulty.Option{faulty.WithUnprovenClose(),
					faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) })}
				if released {
					opts = append(opts, faulty.WithSourcesReleased())
				}
				tracePath := filepath.Join(t.TempDir(), "ctx.jsonl")
				ce, ge, closeAgents := twoWorkerPair(t, l, tracePath, opts...)
				defer closeAgents()
				crashes := 1 // the eleventh: stopped for good
				if how == "by its last restart" {
					crashes = 2 // the tenth closes the endpoint, the eleventh stops it
				}
				spendRestarts(t, ce, 11-crashes)
				rx, tx, src := sendCut(t, ce, ge, l, onWorker0(ge, "stop"), 30*time.Second)
				waitUntil(t, "the batch posted", func() bool { return ce.Stats().OpsPosted >= 1 })
				for range crashes {
					ce.CrashWorker(0)
				}
				waitUntil(t, "the unproven close", func() bool { return ce.Stats().ClosesUnproven == 1 })
				checkSourcesReleasedEnd(t, ce, ge, rx, tx, src, released, actors.ErrWorkerCrashed, tracePath)
				if n := ce.Stats().WorkerRestarts; n != 10 {
					t.Errorf("%d restarts, want 10", n)
				}
			})
		}
	}
}

// TestNewWorkForAStoppedWorkerFailsPromptly: once sender worker 0 has
// stopped for good, new batches routed to it fail their requests at once
// with an error naming the stopped worker, and hang nothing: request x's
// next chunk (its stream already on worker 0; the chunk may reach the
// session before or after it hears of the stop), and request y's first
// stream (its Send came before the stop, its RequestData after), which
// is refused with a FAILED Result that goes out through worker 1. Both
// sides end well before the requests' deadlines, with no timeout, and
// every block comes back; the failed engine still closes clean.
func TestNewWorkForAStoppedWorkerFailsPromptly(t *testing.T) {
	l := smallLayout()
	ce, ge := faultyPairN(t, l, 2)
	c := &cluster{ctx: []*kvxfer.Engine{ce}, gen: []*kvxfer.Engine{ge}}
	idX, idY := onWorker0(ge, "x"), onWorker0(ge, "y")
	spendRestarts(t, ce, 10)
	long := time.Minute // the deadlines: no outcome here may come from them
	rxX, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: idX, PromptLen: 64, Context: "ctx", Timeout: long})
	if err != nil {
		t.Fatal(err)
	}
	srcX, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	txX, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: idX, PromptLen: 64, Timeout: long})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0}
	if err := txX.Chunk(c0, c0.Runs(l.TokensPerBlock, srcX), nil); err != nil {
		t.Fatal(err)
	}
	srcY, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	txY, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: idY, PromptLen: 64, Timeout: long})
	if err != nil {
		t.Fatal(err)
	}
	cy := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := txY.Chunk(cy, cy.Runs(l.TokensPerBlock, srcY), nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "x's first batch posted", func() bool { return ce.Stats().OpsPosted >= 1 })

	ce.CrashWorker(0) // the eleventh: stopped for good
	c1 := kvcache.Chunk{Start: 32, End: 64, FirstBlock: 2, Last: true}
	if err := txX.Chunk(c1, c1.Runs(l.TokensPerBlock, srcX), nil); err != nil && !errors.Is(err, kvxfer.ErrEngineFailed) {
		t.Fatalf("x's next chunk: %v, want nil or ErrEngineFailed", err)
	}
	wantStopped := func(side string, o kvxfer.Outcome) {
		t.Helper()
		if o.OK || o.Err == nil || errors.Is(o.Err, kvxfer.ErrTimeout) || !strings.Contains(o.Err.Error(), "sender worker 0") || !strings.Contains(o.Err.Error(), "stopped (restart budget spent)") {
			t.Fatalf("%s: %s %v, want FAILED naming the stopped worker, before any deadline", side, o.Status, o.Err)
		}
	}
	o := waitOutcome(t, txX.Done())
	wantStopped("tx x", o)
	if !errors.Is(o.Err, kvxfer.ErrEngineFailed) {
		t.Fatalf("tx x: %v, want ErrEngineFailed", o.Err)
	}
	if ro := waitOutcome(t, rxX.Done()); ro.OK || errors.Is(ro.Err, kvxfer.ErrTimeout) {
		t.Fatalf("rx x: %s %v, want a failure before its deadline", ro.Status, ro.Err)
	}
	// y's RequestData comes after the stop: its stream would go to worker 0.
	rxY, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: idY, PromptLen: 64, Context: "ctx", Timeout: long})
	if err != nil {
		t.Fatal(err)
	}
	o = waitOutcome(t, txY.Done())
	wantStopped("tx y", o)
	if !errors.Is(o.Err, kvxfer.ErrEngineFailed) {
		t.Fatalf("tx y: %v, want ErrEngineFailed", o.Err)
	}
	wantStopped("rx y", waitOutcome(t, rxY.Done()))
	for _, src := range [][][]kvcache.BlockID{srcX, srcY} {
		if err := ce.Pools().Free(src); err != nil {
			t.Fatalf("free after Done: %v", err)
		}
	}
	checkNoLeaks(t, c)
}
