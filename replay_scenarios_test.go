package kvxfer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/trace"
)

// startTracedCluster is startClusterOn with each engine tracing to its own
// file under dir.
func startTracedCluster(t *testing.T, l kvcache.Layout, ctxPar, genPar kvcache.Parallel, dir string) *cluster {
	t.Helper()
	return startClusterOn(t, l, ctxPar, genPar, 2, clusterOpts{traceDir: dir})
}

// closeAll closes every engine of c (its traces complete), failing the
// test on an error; the cluster's cleanup closes them again (a no-op).
func closeAll(t *testing.T, c *cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range append(c.ctx, c.gen...) {
		if err := e.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}
}

// replayAndExport replays every trace under dir and exports each to
// Perfetto JSON, which must parse.
func replayAndExport(t *testing.T, dir string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(files) == 0 {
		t.Fatal("no trace")
	}
	for _, f := range files {
		res, err := trace.ReplayFile(f)
		if err != nil {
			t.Errorf("replay %s: %v", filepath.Base(f), err)
			continue
		}
		if !res.Identical() {
			var b strings.Builder
			res.Print(&b)
			t.Errorf("replay of %s diverged:\n%s", filepath.Base(f), b.String())
		}
		t.Logf("%s: %d records %d births %d steps %d matched, %d sessions", filepath.Base(f), res.Records, res.Births, res.Steps, res.Matched, len(res.Sessions))
		if res.Steps == 0 {
			t.Errorf("%s: no steps", filepath.Base(f))
		}
		in, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if _, err := trace.ExportPerfetto(in, &out); err != nil {
			t.Errorf("export %s: %v", filepath.Base(f), err)
		}
		in.Close()
		var v any
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Errorf("export %s: invalid JSON: %v", filepath.Base(f), err)
		}
	}
}

func TestReplayLayerParts(t *testing.T) {
	l := smallLayout()
	parts := []kvcache.LayerPart{{Lo: 0, Hi: 1, Of: 4}, {Lo: 1, Hi: 3, Of: 4}, {Lo: 3, Hi: 4, Of: 4}}
	for _, tc := range []struct {
		name     string
		ctx, gen kvcache.Parallel
	}{
		{"TP1-TP1", kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}},
		{"TP2-TP4", kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 4, PP: 1}},
		{"PP2-PP1", kvcache.Parallel{TP: 1, PP: 2}, kvcache.Parallel{TP: 1, PP: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := startTracedCluster(t, l, tc.ctx, tc.gen, dir)
			for i, promptLen := range []int{100, 16, 64} {
				transferParts(t, c, l, fmt.Sprintf("%s-r%d", tc.name, i), i+1, promptLen, 32, i%2 == 0, parts)
			}
			closeAll(t, c)
			replayAndExport(t, dir)
		})
	}
}

func TestReplayCallerOwnedAndPrefixHits(t *testing.T) {
	l := smallLayout()
	dir := t.TempDir()
	c := startTracedCluster(t, l, tp1, tp1, dir)
	owned := ownedBlocks(c.gen[0], l, 100)
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "own", PromptLen: 100, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
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
	if o := waitOutcome(t, rx.Done()); !o.OK {
		t.Fatalf("rx %s %v", o.Status, o.Err)
	}
	_ = c.ctx[0].Pools().Free(src)
	// A request that fails, into caller-owned blocks (cancelled).
	rx2, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "own2", PromptLen: 100, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	rx2.Cancel()
	if o := waitOutcome(t, rx2.Done()); o.OK {
		t.Fatal("cancelled own2 READY")
	}
	<-rx2.Released()
	closeAll(t, c)
	replayAndExport(t, dir)
}

var _ = errors.Is

func TestReplayRevocation(t *testing.T) {
	l := smallLayout()
	dir := t.TempDir()
	rr, err := shm.NewRevocableRegion(4<<20, shm.RevocableOptions{Block: uint64(os.Getpagesize()), Spare: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rr.Close() })
	ctxAgent, genAgent := shm.New(), shm.New()
	t.Cleanup(func() { _ = errors.Join(ctxAgent.Close(), genAgent.Close()) })
	c, link := startPartClusterWith(t, l, func(inst string, cfg *kvxfer.Config) {
		cfg.Agent = ctxAgent
		cfg.TracePath = filepath.Join(dir, inst+".jsonl")
		if inst == "gen" {
			cfg.PoolBytes, cfg.Region, cfg.Revoker, cfg.Agent = 0, rr.Region(), rr.Revoker(), genAgent
		}
	})
	gen, ctxE := c.gen[0], c.ctx[0]
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r1", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	link.setCut(true)
	gen.PeerDown(ctxE.Hello().From)
	waitOutcome(t, rx.Done())
	waitUntil(t, "r1's blocks revoked", func() bool { return gen.Stats().BlocksRevoked > 0 && gen.Pools().Used() == 0 })
	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r2", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	link.setCut(false)
	sendOneChunk(t, ctxE, l, "r2", 2, 64)
	o2 := waitOutcome(t, rx2.Done())
	if !o2.OK {
		t.Fatalf("r2: %s %v", o2.Status, o2.Err)
	}
	waitUntil(t, "proof", func() bool { return gen.Stats().RevokedHeldBlocks == 0 })
	_ = gen.FreeBlocks(o2.Blocks)
	closeAll(t, c)
	replayAndExport(t, dir)
}

// TestReplaySuspicion: a writer the control plane declares down
// (Engine.PeerDown: RxSuspect), then the engine closing while a suspected
// writer's proof is held back (RxAbandon) — both legitimate runs — must
// replay identically.
func TestReplaySuspicion(t *testing.T) {
	l := smallLayout()
	dir := t.TempDir()
	c, link := startPartClusterWith(t, l, func(inst string, cfg *kvxfer.Config) {
		if inst == "gen" {
			cfg.TracePath = filepath.Join(dir, inst+".jsonl")
		}
	})
	gen, ctxE := c.gen[0], c.ctx[0]
	for _, id := range []string{"r1", "r2"} {
		rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		waitUntil(t, id+"'s RequestData at the context side", func() bool {
			rd := link.lastRD.Load()
			return rd != nil && rd.RequestID == id
		})
		link.setCut(true)
		gen.PeerDown(ctxE.Hello().From)
		if o := waitOutcome(t, rx.Done()); o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
			t.Fatalf("%s: %s %v", id, o.Status, o.Err)
		}
		if id == "r1" {
			link.setCut(false) // the CancelAck, the proof, goes through
			waitUntil(t, "r1's blocks released", func() bool { return gen.Pools().Used()+gen.Pools().Quarantined() == 0 })
		}
	}
	// r2's proof is held back, and the link hears nothing of the writer:
	// Close abandons it (RxAbandon), its blocks quarantined, and says so.
	link.deaf.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.undrained = append(c.undrained, gen)
	if err := gen.Close(ctx); !errors.Is(err, actors.ErrUndrained) || !strings.Contains(err.Error(), "[r2]") {
		t.Fatalf("close gen: %v, want ErrUndrained naming r2 (its blocks stay quarantined)", err)
	}
	replayAndExport(t, dir)
}

// TestReplayFailuresTP: failures on a TP2 → TP4 pair (a context
// rank told a generation rank is down mid-transfer, a generation-side
// cancel, a send that times out with no receiver, a receive that times
// out with no sender) replay identically.
func TestReplayFailuresTP(t *testing.T) {
	l := smallLayout()
	dir := t.TempDir()
	c := startTracedCluster(t, l, kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 4, PP: 1}, dir)
	run := func(id string, during func(rxs []*kvxfer.RxHandle)) {
		var rxs []*kvxfer.RxHandle
		for _, g := range c.gen {
			h, err := g.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 100, Context: "ctx", ContextParallel: c.ctxPar})
			if err != nil {
				t.Fatal(err)
			}
			rxs = append(rxs, h)
		}
		var txs []*kvxfer.TxHandle
		var srcs [][][]kvcache.BlockID
		for _, e := range c.ctx {
			counts := make([]int, len(l.Groups))
			for g := range counts {
				counts[g] = l.BlocksFor(100)
			}
			src, err := e.Pools().Alloc(counts)
			if err != nil {
				t.Fatal(err)
			}
			h, err := e.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 100})
			if err != nil {
				t.Fatal(err)
			}
			txs, srcs = append(txs, h), append(srcs, src)
		}
		chunks, _ := kvcache.Chunks(100, 32, l.TokensPerBlock)
		var fences []*kvxfer.ManualFence
		for _, ch := range chunks {
			for i := range c.ctx {
				f := &kvxfer.ManualFence{}
				if err := txs[i].Chunk(ch, ch.Runs(l.TokensPerBlock, srcs[i]), f); err != nil {
					t.Fatal(err)
				}
				fences = append(fences, f)
			}
		}
		during(rxs)
		for _, f := range fences {
			f.Fire(nil)
		}
		for i, h := range txs {
			waitOutcome(t, h.Done())
			_ = c.ctx[i].Pools().Free(srcs[i])
		}
		for i, h := range rxs {
			if o := waitOutcome(t, h.Done()); o.OK {
				_ = c.gen[i].FreeBlocks(o.Blocks)
			}
		}
	}
	run("down", func([]*kvxfer.RxHandle) { c.ctx[0].PeerDown(c.gen[1].Hello().From) })
	run("cancel", func(rxs []*kvxfer.RxHandle) { rxs[2].Cancel() })
	h, err := c.ctx[1].Send(context.Background(), kvxfer.SendRequest{ID: "lonely-tx", PromptLen: 32, Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitOutcome(t, h.Done())
	rx, err := c.gen[3].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "lonely-rx", PromptLen: 32, Context: "ctx", ContextParallel: c.ctxPar, Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitOutcome(t, rx.Done())
	checkNoLeaks(t, c)
	closeAll(t, c)
	replayAndExport(t, dir)
}
