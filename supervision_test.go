//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// faultyPair starts a context engine on a faulty(loopback) agent and a
// generation engine on loopback, one worker each.
func faultyPair(t *testing.T, l kvcache.Layout, opts ...faulty.Option) (ce, ge *kvxfer.Engine) {
	t.Helper()
	return faultyPairN(t, l, 1, opts...)
}

// faultyPairN is faultyPair with workers sender workers on each side.
func faultyPairN(t *testing.T, l kvcache.Layout, workers int, opts ...faulty.Option) (ce, ge *kvxfer.Engine) {
	t.Helper()
	return faultyPairWith(t, l, workers, nil, opts...)
}

// faultyPairWith is faultyPairN with each engine's config passed through
// with (nil: as is) before it starts.
func faultyPairWith(t *testing.T, l kvcache.Layout, workers int, with func(inst string, cfg *kvxfer.Config), opts ...faulty.Option) (ce, ge *kvxfer.Engine) {
	t.Helper()
	if with == nil {
		with = func(string, *kvxfer.Config) {}
	}
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), opts...)
	gag := loopback.New(loopback.WithNetwork(net))
	var err error
	cc := kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Workers: workers, Link: link, Agent: ag, TransferTimeout: 30 * time.Second, DrainGrace: 50 * time.Millisecond}
	with("ctx", &cc)
	ce, err = kvxfer.Start(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	gc := kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20,
		Workers: workers, Link: link, Agent: gag, TransferTimeout: 30 * time.Second}
	with("gen", &gc)
	ge, err = kvxfer.Start(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := errors.Join(ce.Close(ctx), ge.Close(ctx), ag.Close(), gag.Close()); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return ce, ge
}

// TestWorkerCrashWithOpsInFlight: the sender worker panics while an op's
// batch is posted and held by the backend (it hangs until its endpoint
// closes). The supervisor restarts the worker; the op becomes IN_DOUBT and
// is retired by closing the endpoint; only then are the source pins
// dropped. The request fails on both sides, nothing leaks, and the
// restarted worker serves the next request.
func TestWorkerCrashWithOpsInFlight(t *testing.T) {
	l := smallLayout()
	var hung atomic.Bool // hang exactly one batch, whatever its endpoint
	ce, ge := faultyPair(t, l, faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	c := &cluster{ctx: []*kvxfer.Engine{ce}, gen: []*kvxfer.Engine{ge}, ctxPar: kvcache.Parallel{TP: 1, PP: 1}}

	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "crash", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "crash", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := tx.Chunk(c0, []kvcache.BlockRun{{First: 0, IDs: src[0]}, {First: 0, IDs: src[1]}}, nil); err != nil {
		t.Fatal(err)
	}
	// Wait until the op is posted (held by the Hang fault), then crash.
	deadline := time.Now().Add(10 * time.Second)
	for ce.Stats().OpsPosted == 0 {
		if time.Now().After(deadline) {
			t.Fatal("op never posted")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	ce.CrashWorker(0)
	o := waitOutcome(t, tx.Done())
	if o.OK || !errors.Is(o.Err, actors.ErrWorkerCrashed) {
		t.Fatalf("tx outcome %s %v, want FAILED by a worker crash", o.Status, o.Err)
	}
	// Done fired: every pin dropped, so the source blocks can be freed.
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free after Done: %v", err)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx outcome %s, want a failure", ro.Status)
	}
	if ce.Stats().WorkerRestarts != 1 {
		t.Fatalf("worker restarts %d, want 1", ce.Stats().WorkerRestarts)
	}
	// The restarted worker serves the next request, bytes verified.
	transfer(t, c, l, "after-crash", 3, 100, 32, true)
	checkNoLeaks(t, c)
}

// TestSessionPanicFailsAndDrains: a TxSession that panics fails its
// request, still waits for its op to settle, and releases its pins.
func TestSessionPanicFailsAndDrains(t *testing.T) {
	l := smallLayout()
	ce, ge := faultyPair(t, l)
	c := &cluster{ctx: []*kvxfer.Engine{ce}, gen: []*kvxfer.Engine{ge}, ctxPar: kvcache.Parallel{TP: 1, PP: 1}}
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "p", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "p", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	f := &kvxfer.ManualFence{}
	c0 := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0, Last: false}
	if err := tx.Chunk(c0, []kvcache.BlockRun{{First: 0, IDs: src[0][:2]}, {First: 0, IDs: src[1][:2]}}, f); err != nil {
		t.Fatal(err)
	}
	tx.Crash()
	// Once the restarted session has stepped on its panic, its outcome is
	// decided; it must still hold the pins while the chunk's fence is held.
	deadline := time.Now().Add(10 * time.Second)
	for ce.Stats().SessionPanics == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the session never restarted after its panic")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	select {
	case o := <-tx.Done():
		t.Fatalf("Done (%s) before the held chunk's fence fired: pins dropped under a pending write", o.Status)
	default:
	}
	if st := ce.Pools().Stats()[0]; st.Pinned != 2 {
		t.Fatalf("%d source blocks pinned after the panic, want the held chunk's 2", st.Pinned)
	}
	f.Fire(nil)
	o := waitOutcome(t, tx.Done())
	if o.OK || !errors.Is(o.Err, actors.ErrSessionCrashed) {
		t.Fatalf("tx outcome %s %v, want FAILED by a session crash", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free after Done: %v", err)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx outcome %s, want a failure", ro.Status)
	}
	checkNoLeaks(t, c)
}

// TestSessionBudgetExhaustedFailsAndDrains: a TxSession crashed eight
// times, with a chunk's fence held, is restarted exactly its budget, three
// times (before, the strategy sat on the session's own props and governed
// its children, of which it has none: eight crashes gave eight restarts);
// the five panics past the budget resume it instead of stopping it, so it
// still holds the held chunk's pins until the fence fires, then fails its
// request by the crash, drains and releases: nothing pinned, Close nil.
func TestSessionBudgetExhaustedFailsAndDrains(t *testing.T) {
	ce, _, c, rx, tx, src, f := heldChunk(t, "b")
	for range 8 {
		tx.Crash()
	}
	waitRestartBudget(t, ce)
	select {
	case o := <-tx.Done():
		t.Fatalf("Done (%s) before the held chunk's fence fired: pins dropped under a pending write", o.Status)
	default:
	}
	if st := ce.Pools().Stats()[0]; st.Pinned != 2 {
		t.Fatalf("%d source blocks pinned after the panics, want the held chunk's 2", st.Pinned)
	}
	f.Fire(nil)
	o := waitOutcome(t, tx.Done())
	if o.OK || !errors.Is(o.Err, actors.ErrSessionCrashed) {
		t.Fatalf("tx outcome %s %v, want FAILED by a session crash", o.Status, o.Err)
	}
	for g, st := range ce.Pools().Stats() {
		if st.Pinned != 0 {
			t.Fatalf("group %d: %d blocks pinned after Done", g, st.Pinned)
		}
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free after Done: %v", err)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx outcome %s, want a failure", ro.Status)
	}
	if got := ce.Stats().SessionPanics; got != 3 {
		t.Fatalf("session restarts %d after the drain, want 3", got)
	}
	checkNoLeaks(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestRxSessionBudgetExhaustedFailsAndDrains: an RxSession crashed eight
// times is restarted exactly its budget, three times; its request fails by
// the crash at the first restart, and the session still holds its
// destination blocks until its writer is quiescent — the writer's op, held
// by its chunk's fence, was never submitted and never will be once its
// request is cancelled, so its CancelAck comes without waiting for the
// fence, while the writer keeps its source pages pinned until the fence
// fires — then releases them: nothing used on either side, Close nil. The
// writer's answers are held back while the session crashes (else the
// session could end, proven, between two of the eight crashes).
func TestRxSessionBudgetExhaustedFailsAndDrains(t *testing.T) {
	ce, ge, c, rx, tx, src, f, link := heldChunkOn(t, "rb")
	waitUntil(t, "the RequestData at the context side", func() bool { return link.atCtx.Load() == 1 })
	link.setCut(true)
	for range 8 {
		rx.Crash()
	}
	waitRestartBudget(t, ge)
	ro := waitOutcome(t, rx.Done())
	if ro.OK || !errors.Is(ro.Err, actors.ErrSessionCrashed) {
		t.Fatalf("rx outcome %s %v, want FAILED by a session crash", ro.Status, ro.Err)
	}
	select {
	case <-rx.Released():
		t.Fatal("destination blocks released before the writer's answer came")
	default:
	}
	link.setCut(false)
	select {
	case <-rx.Released():
	case <-time.After(10 * time.Second):
		t.Fatal("destination blocks never released: the writer's op never left, yet it gave no CancelAck")
	}
	select {
	case o := <-tx.Done():
		t.Fatalf("tx Done (%s) before its chunk's fence fired", o.Status)
	default:
	}
	if st := ce.Pools().Stats()[0]; st.Pinned != 2 {
		t.Fatalf("%d source blocks pinned before the fence, want the held chunk's 2", st.Pinned)
	}
	f.Fire(nil)
	if to := waitOutcome(t, tx.Done()); to.OK {
		t.Fatalf("tx outcome %s, want a failure", to.Status)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free after Done: %v", err)
	}
	checkNoLeaks(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ge.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestWorkerBudgetExhaustedFailsAndDrains: a sender worker crashed past its
// restart budget (10 restarts within 10 s) is stopped. Before, nothing
// watched it: the next request's context side never finished, Close
// returned ErrUndrained and a block stayed pinned. Now the engine fails the
// requests routed to it (its op in flight, held by the backend, is retired:
// the worker closed its endpoints as it stopped), refuses new work with
// ErrEngineFailed, and Close returns nil with nothing pinned.
func TestWorkerBudgetExhaustedFailsAndDrains(t *testing.T) {
	l := smallLayout()
	var hung atomic.Bool
	ce, ge := faultyPairN(t, l, 2, faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	gen0 := ge.Hello().From
	id := ""
	for i := 0; id == ""; i++ {
		if cand := fmt.Sprintf("budget-%d", i); actors.WorkerFor(cand, gen0, 2) == 0 {
			id = cand
		}
	}
	// Spend the budget but one: ten restarts.
	for range 10 {
		ce.CrashWorker(0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ce.Stats().WorkerRestarts < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d restarts, want 10", ce.Stats().WorkerRestarts)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := tx.Chunk(c0, c0.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	for ce.Stats().OpsPosted == 0 {
		if time.Now().After(deadline) {
			t.Fatal("op never posted")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	// The eleventh crash with the op in flight: the worker is stopped.
	ce.CrashWorker(0)
	o := waitOutcome(t, tx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrEngineFailed) {
		t.Fatalf("tx %s %v, want FAILED with ErrEngineFailed", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("free after Done: %v", err)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx %s, want a failure", ro.Status)
	}
	if got := ce.Stats().WorkerRestarts; got != 10 {
		t.Fatalf("worker restarts %d, want exactly the budget, 10", got)
	}
	if _, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "after", PromptLen: 64}); !errors.Is(err, kvxfer.ErrEngineFailed) {
		t.Fatalf("Send after the budget: %v, want ErrEngineFailed", err)
	}
	// A generation request asking the failed rank is answered FAILED at
	// once: no session opens there (one could route its stream to the
	// stopped worker, whose ops nothing would post or settle).
	late, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "late", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, late.Done()); o.OK || o.Err == nil || !strings.Contains(o.Err.Error(), "spent its restart budget") {
		t.Fatalf("Receive from the failed rank: %s %v, want FAILED naming the spent restart budget", o.Status, o.Err)
	}
	waitUntil(t, "the late request's blocks back", func() bool {
		select {
		case <-late.Released():
			return true
		default:
			return false
		}
	})
	c := &cluster{ctx: []*kvxfer.Engine{ce}, gen: []*kvxfer.Engine{ge}}
	checkNoLeaks(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("Close of a failed engine: %v", err)
	}
}

// heldChunk starts request id between a faulty pair, with its first chunk
// (two blocks per group) held by an unfired fence.
func heldChunk(t *testing.T, id string) (ce, ge *kvxfer.Engine, c *cluster, rx *kvxfer.RxHandle, tx *kvxfer.TxHandle,
	src [][]kvcache.BlockID, f *kvxfer.ManualFence) {
	t.Helper()
	ce, ge, c, rx, tx, src, f, _ = heldChunkOn(t, id)
	return ce, ge, c, rx, tx, src, f
}

// heldChunkOn is heldChunk over a partLink, which it returns: a test may
// hold the context side's answers back (setCut), as a writer that cannot
// answer.
func heldChunkOn(t *testing.T, id string) (ce, ge *kvxfer.Engine, c *cluster, rx *kvxfer.RxHandle, tx *kvxfer.TxHandle,
	src [][]kvcache.BlockID, f *kvxfer.ManualFence, link *partLink) {
	t.Helper()
	l := smallLayout()
	link = &partLink{MemLink: control.NewMemLink()}
	ce, ge = faultyPairWith(t, l, 1, func(_ string, cfg *kvxfer.Config) { cfg.Link = link })
	t.Cleanup(func() { link.setCut(false) }) // before the pair's close (cleanups run last first)
	c = &cluster{ctx: []*kvxfer.Engine{ce}, gen: []*kvxfer.Engine{ge}, ctxPar: kvcache.Parallel{TP: 1, PP: 1}}
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if src, err = ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)}); err != nil {
		t.Fatal(err)
	}
	if tx, err = ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64}); err != nil {
		t.Fatal(err)
	}
	f = &kvxfer.ManualFence{}
	c0 := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0, Last: false}
	if err := tx.Chunk(c0, []kvcache.BlockRun{{First: 0, IDs: src[0][:2]}, {First: 0, IDs: src[1][:2]}}, f); err != nil {
		t.Fatal(err)
	}
	return ce, ge, c, rx, tx, src, f, link
}

// waitRestartBudget waits (with a deadline) for e's five session panics
// past the budget of eight crashes, and checks the budget was exactly
// three restarts.
func waitRestartBudget(t *testing.T, e *kvxfer.Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.Stats().SessionPanicsPastBudget < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d panics past the budget, want 5", e.Stats().SessionPanicsPastBudget)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	if got := e.Stats().SessionPanics; got != 3 {
		t.Fatalf("session restarts %d, want exactly the budget, 3", got)
	}
}
