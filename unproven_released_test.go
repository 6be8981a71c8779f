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
	"github.com/kvxfer/kvxfer/trace"
)

// unprovenPair starts a context engine whose agent is faulty over loopback
// with opts, tracing to tracePath, and a generation engine on plain
// loopback; the context side's drain grace is short.
func unprovenPair(t *testing.T, l kvcache.Layout, tracePath string, opts ...faulty.Option) (ce, ge *kvxfer.Engine, closeAgents func()) {
	t.Helper()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), opts...)
	gag := loopback.New(loopback.WithNetwork(net))
	var err error
	ce, err = kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: ag, TransferTimeout: 30 * time.Second, DrainGrace: 50 * time.Millisecond, TracePath: tracePath})
	if err != nil {
		t.Fatal(err)
	}
	ge, err = kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: gag, TransferTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return ce, ge, func() { _, _ = ag.Close(), gag.Close() }
}

// sendCut starts request id on both sides (the generation side's deadline
// 2 s, the context side's txTimeout) and hands over its one chunk; it
// returns both handles and the source blocks.
func sendCut(t *testing.T, ce, ge *kvxfer.Engine, l kvcache.Layout, id string, txTimeout time.Duration) (*kvxfer.RxHandle, *kvxfer.TxHandle, [][]kvcache.BlockID) {
	t.Helper()
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64, Timeout: txTimeout})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := tx.Chunk(c0, c0.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	return rx, tx, src
}

// checkSourcesReleasedEnd checks the end of a request whose write was cut
// without proof, with or without proof that the backend reads its source
// no more (released). With it: the context side's Done comes (FAILED,
// errIs), its source blocks can be freed, a Cancel of the generation side
// is left unanswered for good (FramesSilenced), and the generation side
// keeps its pages quarantined — no frame told it the write is over. And
// the context engine closes clean, the generation engine undrained.
// Without it: no Done, the source blocks stay pinned, both engines close
// undrained. Either way the context engine's trace (at tracePath) replays
// identically: its sessions' steps and its tables' calls, the held Cancel
// included.
func checkSourcesReleasedEnd(t *testing.T, ce, ge *kvxfer.Engine, rx *kvxfer.RxHandle, tx *kvxfer.TxHandle, src [][]kvcache.BlockID,
	released bool, errIs error, tracePath string) {
	t.Helper()
	if released {
		o := waitOutcome(t, tx.Done())
		if o.OK || !errors.Is(o.Err, errIs) {
			t.Fatalf("tx outcome %s %v, want a failure wrapping %v", o.Status, o.Err, errIs)
		}
		if err := ce.Pools().Free(src); err != nil {
			t.Fatalf("the source blocks after Done: %v (the backend reads none of them any more)", err)
		}
	}
	ro := waitOutcome(t, rx.Done())
	if ro.OK || !errors.Is(ro.Err, kvxfer.ErrTimeout) {
		t.Fatalf("rx outcome %s %v, want a timeout: the writer never said its write was over", ro.Status, ro.Err)
	}
	waitUntil(t, "the destination pages quarantined", func() bool { return ge.Stats().QuarantinedBytes > 0 })
	if released {
		// The generation side re-sends its Cancel: the context side's
		// session has stopped, and its parent must not acknowledge it
		// (the cut write may still land in those pages).
		waitUntil(t, "a Cancel left unanswered, or answered", func() bool {
			return ce.Stats().FramesSilenced > 0 || ge.Stats().QuarantinedBytes == 0
		})
		if q := ge.Stats().QuarantinedBytes; q == 0 {
			t.Fatal("the destination pages left quarantine: a frame told the generation side the cut write is over")
		}
		// A Send retrying the id is refused for good, saying why (it was
		// a bare "already sent", which reads as the caller's mistake). An
		// engine a worker stopped for good failed refuses every Send
		// first, saying so (ErrEngineFailed).
		id := ro.Request
		_, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64, Timeout: time.Second})
		switch {
		case errors.Is(errIs, actors.ErrWorkerCrashed):
			if !errors.Is(err, kvxfer.ErrEngineFailed) {
				t.Fatalf("Send of %s again on an engine whose worker stopped for good: %v, want ErrEngineFailed", id, err)
			}
		case !errors.Is(err, actors.ErrBadRequest) || !strings.Contains(err.Error(), "silenced towards gen/0") ||
			!strings.Contains(err.Error(), "may still land"):
			t.Fatalf("Send of %s again: %v, want ErrBadRequest saying it is silenced towards gen/0, whose writes may still land", id, err)
		}
	} else {
		select {
		case o := <-tx.Done():
			t.Fatalf("tx Done (%s %v) after a close that proved nothing: the source pins were dropped", o.Status, o.Err)
		default:
		}
		if err := ce.Pools().Free(src); err == nil {
			t.Fatal("the source blocks of an op in doubt were freed")
		}
	}
	if n := ce.Stats().StreamViolations; n != 0 {
		t.Fatalf("%d stream violations", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := ce.Close(ctx)
	switch {
	case released && err != nil:
		t.Errorf("context engine Close: %v, want nil (nothing of it reads or holds the cut write's source)", err)
	case !released && !errors.Is(err, actors.ErrUndrained):
		t.Errorf("context engine Close: %v, want ErrUndrained (its session's op is in doubt)", err)
	}
	if ce.WritesOver() {
		// Its goodbye would tell the generation side the cut write is
		// over (a drained goodbye: docs/membership.md).
		t.Error("context engine's WritesOver after Close: true, want false (a write was cut without proof that it no longer lands)")
	}
	if err := ge.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Errorf("generation engine Close: %v, want ErrUndrained (its pages are quarantined)", err)
	}
	if ge.Stats().QuarantinedBytes == 0 {
		t.Error("the destination pages left quarantine at Close")
	}
	res, err := trace.ReplayFile(tracePath)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if !res.Identical() {
		var b strings.Builder
		res.Print(&b)
		t.Errorf("replay of the context engine's trace diverged:\n%s", b.String())
	}
}

// TestUnprovenCloseWithSourcesReleased: as TestUnprovenCloseKeepsOpsInDoubt
// — a batch hangs on the wire, the deadline passes, the drain closes the
// endpoint by force without proof that the write no longer lands — but
// the backend's Close also says it reads none of the batch's source any
// more (rdma.ErrSourcesReleased, as UCX's completed forced close). Then
// the context side releases its source pins and its Done comes, while the
// generation side still gets no proof: no terminal frame, its Cancel
// unanswered, its pages quarantined. Without the sentinel the op stays in
// doubt as before. (Before the change the context side kept the source
// blocks pinned and Done never came in both cases.)
func TestUnprovenCloseWithSourcesReleased(t *testing.T) {
	for _, released := range []bool{true, false} {
		t.Run(fmt.Sprintf("sources released %v", released), func(t *testing.T) {
			l := smallLayout()
			var hung atomic.Bool
			opts := []faulty.Option{faulty.WithUnprovenClose(),
				faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) })}
			if released {
				opts = append(opts, faulty.WithSourcesReleased())
			}
			tracePath := filepath.Join(t.TempDir(), "ctx.jsonl")
			ce, ge, closeAgents := unprovenPair(t, l, tracePath, opts...)
			defer closeAgents()
			rx, tx, src := sendCut(t, ce, ge, l, "cut", 300*time.Millisecond)
			waitUntil(t, "the endpoint's unproven close", func() bool { return ce.Stats().ClosesUnproven == 1 })
			checkSourcesReleasedEnd(t, ce, ge, rx, tx, src, released, kvxfer.ErrTimeout, tracePath)
		})
	}
}

// TestEndpointErrorWithSourcesReleased: the backend loses the endpoint
// with a batch on the wire (UCX's endpoint error when a receiver dies:
// faulty.Cut) and fails the batch without proof that it no longer lands
// (rdma.ErrCloseUnproven), before anyone closed the endpoint. The worker
// settled such an op at its completion, so a later close retired nothing,
// and nothing closed the endpoint anyway: the source blocks stayed pinned
// and Done never came, on every cross-host receiver death with writes in
// flight. Now the worker closes the endpoint at once; its Close proves the
// sources released (rdma.ErrSourcesReleased), so the request releases its
// source blocks and Done comes, while the generation side gets no proof
// (its pages stay quarantined). Without the sentinel the op stays in doubt.
func TestEndpointErrorWithSourcesReleased(t *testing.T) {
	for _, released := range []bool{true, false} {
		t.Run(fmt.Sprintf("sources released %v", released), func(t *testing.T) {
			l := smallLayout()
			var cut atomic.Bool
			opts := []faulty.Option{faulty.Cut(func(uint64, *rand.Rand) bool { return cut.CompareAndSwap(false, true) })}
			if released {
				opts = append(opts, faulty.WithSourcesReleased())
			}
			tracePath := filepath.Join(t.TempDir(), "ctx.jsonl")
			ce, ge, closeAgents := unprovenPair(t, l, tracePath, opts...)
			defer closeAgents()
			rx, tx, src := sendCut(t, ce, ge, l, "lost", 30*time.Second)
			waitUntil(t, "the cut endpoint's close", func() bool { return ce.Stats().ClosesUnproven == 1 })
			checkSourcesReleasedEnd(t, ce, ge, rx, tx, src, released, kvxfer.ErrPeerFailed, tracePath)
		})
	}
}

// TestSilencedRequestAnswersRestartedReceiver: a request is silenced
// towards the incarnation of the generation rank its write was cut to
// (faulty.Cut: UCX's endpoint error when a receiver dies). When that rank
// restarts — a new incarnation, which never got a write of the request —
// and asks for the same id again (a framework retrying it), the context
// side answers it as any finished request: FAILED, and its destination
// blocks are released, not quarantined. Before, silencing was by rank
// alone: the new incarnation's RequestData was dropped and its Cancel held
// for good, so it timed out and its blocks stayed quarantined for the life
// of the context engine.
func TestSilencedRequestAnswersRestartedReceiver(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	var cut atomic.Bool
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.WithSourcesReleased(),
		faulty.Cut(func(uint64, *rand.Rand) bool { return cut.CompareAndSwap(false, true) }))
	defer func() { _ = ag.Close() }()
	ce, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Link: link, Agent: ag, TransferTimeout: 30 * time.Second, DrainGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Bounded: an engine with quarantined pages never drains.
	closeSoon := func(e *kvxfer.Engine) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_ = e.Close(ctx)
	}
	defer closeSoon(ce)
	startGen := func() (*kvxfer.Engine, func()) {
		gag := loopback.New(loopback.WithNetwork(net))
		ge, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 4 << 20,
			Link: link, Agent: gag, TransferTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return ge, func() { _ = gag.Close() }
	}
	ge, closeGag := startGen()
	defer closeGag()
	rx, tx, _ := sendCut(t, ce, ge, l, "lost", 30*time.Second)
	if o := waitOutcome(t, tx.Done()); o.OK {
		t.Fatalf("tx outcome %s, want a failure", o.Status)
	}
	if ro := waitOutcome(t, rx.Done()); ro.OK {
		t.Fatalf("rx outcome %s, want a failure", ro.Status)
	}
	waitUntil(t, "the old incarnation's Cancel left unanswered", func() bool { return ce.Stats().FramesSilenced > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := ge.Close(ctx); !errors.Is(err, actors.ErrUndrained) {
		t.Fatalf("old generation engine Close: %v, want ErrUndrained (its pages are quarantined)", err)
	}

	ge2, closeGag2 := startGen()
	defer closeGag2()
	defer closeSoon(ge2)
	rx2, err := ge2.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "lost", PromptLen: 64, Context: "ctx", Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx2.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerFailed) {
		t.Fatalf("the new incarnation's request: %s %v, want FAILED by the context side (the request finished there)", o.Status, o.Err)
	}
	waitUntil(t, "the new incarnation's blocks released", func() bool { return ge2.Stats().QuarantinedBytes == 0 })
	if _, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "lost", PromptLen: 64, Timeout: time.Second}); !errors.Is(err, actors.ErrBadRequest) ||
		!strings.Contains(err.Error(), "silenced towards gen/0 (incarnation") {
		t.Fatalf("Send of lost again: %v, want it refused, silenced towards the old incarnation", err)
	}
}
