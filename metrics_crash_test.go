//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/faulty"
)

// observedFaultyPair is faultyPair with metrics served and each engine
// tracing to INST.jsonl under dir, over a partLink it returns (a test may
// hold the context side's answers back).
func observedFaultyPair(t *testing.T, l kvcache.Layout, dir string, opts ...faulty.Option) (ce, ge *kvxfer.Engine, link *partLink) {
	t.Helper()
	link = &partLink{MemLink: control.NewMemLink()}
	ce, ge = faultyPairWith(t, l, 1, func(inst string, cfg *kvxfer.Config) {
		cfg.MetricsAddr = "127.0.0.1:0"
		cfg.TracePath = filepath.Join(dir, inst+".jsonl")
		cfg.Link = link
	}, opts...)
	t.Cleanup(func() { link.setCut(false) }) // before the pair's close
	return ce, ge, link
}

func closePair(t *testing.T, ce, ge *kvxfer.Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := errors.Join(ce.Close(ctx), ge.Close(ctx)); err != nil {
		t.Fatal(err)
	}
}

func TestWorkerCrashObserved(t *testing.T) {
	l := smallLayout()
	dir := t.TempDir()
	var hung atomic.Bool
	ce, ge, _ := observedFaultyPair(t, l, dir, faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "crash", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, _ := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "crash", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := tx.Chunk(c0, []kvcache.BlockRun{{First: 0, IDs: src[0]}, {First: 0, IDs: src[1]}}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "op posted", func() bool { return ce.Stats().OpsPosted > 0 })
	ce.CrashWorker(0)
	waitOutcome(t, tx.Done())
	_ = ce.Pools().Free(src)
	waitOutcome(t, rx.Done())
	eventually(t, "gauges at zero", func() bool {
		return live(scrape(t, ce, "ctx/0"))+live(scrape(t, ge, "gen/0")) == 0
	})
	s := scrape(t, ce, "ctx/0")
	if s.get(t, "kvxfer_worker_restarts_total") != 1 || s.get(t, "kvxfer_failures_total", "side", "tx", "reason", "worker_crashed") != 1 {
		t.Errorf("after the crash: %v", s)
	}
	closePair(t, ce, ge)
	replayAndExport(t, dir)
}

func TestSessionPanicsObserved(t *testing.T) {
	l := smallLayout()
	dir := t.TempDir()
	ce, ge, link := observedFaultyPair(t, l, dir)
	for _, side := range []string{"tx", "rx"} {
		id := "p-" + side
		rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		src, _ := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
		tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64})
		if err != nil {
			t.Fatal(err)
		}
		f := &kvxfer.ManualFence{}
		c0 := kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0}
		if err := tx.Chunk(c0, []kvcache.BlockRun{{First: 0, IDs: src[0][:2]}, {First: 0, IDs: src[1][:2]}}, f); err != nil {
			t.Fatal(err)
		}
		e := ce
		if side == "rx" {
			// The writer's answers wait until the crashes are in: else the
			// session could end, proven, between two of them.
			waitUntil(t, "the RequestData at the context side", func() bool { return link.lastRD.Load() != nil && link.lastRD.Load().RequestID == id })
			link.setCut(true)
		}
		for range 8 {
			if side == "tx" {
				tx.Crash()
			} else {
				rx.Crash()
				e = ge
			}
		}
		eventually(t, "panics past budget", func() bool { return e.Stats().SessionPanicsPastBudget >= 5 })
		link.setCut(false)
		f.Fire(nil)
		waitOutcome(t, tx.Done())
		_ = ce.Pools().Free(src)
		waitOutcome(t, rx.Done())
		<-rx.Released()
		eventually(t, side+": gauges at zero", func() bool {
			return live(scrape(t, ce, "ctx/0"))+live(scrape(t, ge, "gen/0")) == 0
		})
	}
	for _, x := range []struct {
		e    *kvxfer.Engine
		name string
		side string
	}{{ce, "ctx/0", "tx"}, {ge, "gen/0", "rx"}} {
		s := scrape(t, x.e, x.name)
		t.Logf("%s: session_panics_total %v, failures %v", x.name, s.get(t, "kvxfer_session_panics_total"), s.sum("kvxfer_failures_total"))
	}
	closePair(t, ce, ge)
	replayAndExport(t, dir)
}
