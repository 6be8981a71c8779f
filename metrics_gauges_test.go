package kvxfer_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/messages"
)

// live is what must return to zero once nothing is in flight.
func live(s samples) float64 {
	return s.sum("kvxfer_sessions") + s.sum("kvxfer_ops") + s["kvxfer_ops_in_doubt{}"] +
		s["kvxfer_quarantined_bytes{}"] + s["kvxfer_requests_waiting_for_blocks{}"] + s["kvxfer_revoked_held_blocks{}"] + s["kvxfer_caller_blocks_awaiting_proof{}"] +
		s["kvxfer_pool_blocks{group=full,state=pinned}"] + s["kvxfer_pool_blocks{group=swa,state=pinned}"] +
		s["kvxfer_pool_blocks{group=full,state=quarantined}"] + s["kvxfer_pool_blocks{group=swa,state=quarantined}"]
}

func TestMetricsPeerDownMidTransfer(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ce, ge := c.ctx[0], c.gen[0]
	f := begin(t, c, l, "pd", 100, 32)
	eventually(t, "tx READY", func() bool {
		return scrape(t, ce, "ctx/0").get(t, "kvxfer_sessions", "side", "tx", "state", "READY") == 1
	})
	ce.PeerDown(messages.PeerID{Instance: "gen", Rank: 0})
	f.fire()
	tx, rx := waitOutcome(t, f.tx.Done()), waitOutcome(t, f.rx.Done())
	t.Logf("tx %s %v / rx %s %v", tx.Status, tx.Err, rx.Status, rx.Err)
	_ = ce.Pools().Free(f.src)
	if rx.OK {
		_ = ge.FreeBlocks(rx.Blocks)
	}
	var cs, gs samples
	deadline := time.Now().Add(10 * time.Second)
	for {
		cs, gs = scrape(t, ce, "ctx/0"), scrape(t, ge, "gen/0")
		if live(cs)+live(gs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if live(cs)+live(gs) != 0 {
		t.Fatalf("gauges not back to zero: ctx %v gen %v", nonzero(cs), nonzero(gs))
	}
}

func TestMetricsOrphanTimeout(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ce := c.ctx[0]
	h, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "orph", PromptLen: 32, Timeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, h.Done())
	t.Logf("orphan %s %v", o.Status, o.Err)
	eventually(t, "tx gauges back to zero", func() bool { return live(scrape(t, ce, "ctx/0")) == 0 })
	s := scrape(t, ce, "ctx/0")
	if n := s.get(t, "kvxfer_failures_total", "side", "tx", "reason", "timeout"); n != 1 {
		t.Errorf("failures{tx,timeout} = %v; %v", n, nonzero(s))
	}
}

func TestMetricsQueuedCancelAndClose(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ge := c.gen[0]
	held := holdFreeBlocks(t, ge)
	var rxs []*kvxfer.RxHandle
	for _, id := range []string{"q1", "q2", "q3"} {
		rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		rxs = append(rxs, rx)
	}
	eventually(t, "3 waiting", func() bool {
		return scrape(t, ge, "gen/0").get(t, "kvxfer_requests_waiting_for_blocks") == 3
	})
	rxs[1].Cancel()
	waitOutcome(t, rxs[1].Done())
	eventually(t, "2 waiting", func() bool {
		return scrape(t, ge, "gen/0").get(t, "kvxfer_requests_waiting_for_blocks") == 2
	})
	_ = ge.Pools().Free(held)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ge.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, rx := range rxs {
		waitOutcome(t, rx.Done())
	}
	s := gather(t, ge)
	if live(s) != 0 {
		t.Fatalf("after Close: %v", nonzero(s))
	}
}

func TestMetricsCloseWithLiveTransfer(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ce, ge := c.ctx[0], c.gen[0]
	f := begin(t, c, l, "cl", 100, 32)
	eventually(t, "tx READY", func() bool {
		return scrape(t, ce, "ctx/0").get(t, "kvxfer_sessions", "side", "tx", "state", "READY") == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- ge.Close(ctx) }()
	eventually(t, "the context side heard the cancel", func() bool {
		return scrape(t, ce, "ctx/0").sum("kvxfer_failures_total") == 1
	})
	f.fire()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := ce.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitOutcome(t, f.tx.Done())
	waitOutcome(t, f.rx.Done())
	for _, e := range []*kvxfer.Engine{ce, ge} {
		if s := gather(t, e); live(s) != 0 {
			t.Errorf("after Close: %v", nonzero(s))
		}
	}
}

// gather reads e's registry directly (its server is gone after Close).
func gather(t *testing.T, e *kvxfer.Engine) samples {
	t.Helper()
	mfs, err := e.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := samples{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var kv []string
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "engine" {
					kv = append(kv, lp.GetName()+"="+lp.GetValue())
				}
			}
			sort.Strings(kv)
			key := mf.GetName() + "{" + strings.Join(kv, ",") + "}"
			switch {
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			}
		}
	}
	return out
}

func nonzero(s samples) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		if v != 0 && !strings.Contains(k, "_total") && !strings.Contains(k, "_seconds") && !strings.Contains(k, "state=free") &&
			!strings.Contains(k, "limit") && strings.HasPrefix(k, "kvxfer_") {
			out[k] = v
		}
	}
	return out
}

func TestMetricsQuarantine(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(inst string, cfg *kvxfer.Config) {
		cfg.MetricsAddr = "127.0.0.1:0"
	})
	gen, ctxE := c.gen[0], c.ctx[0]
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "RequestData at ctx", func() bool { return link.atCtx.Load() > 0 })
	link.setCut(true)
	gen.PeerDown(ctxE.Hello().From)
	waitOutcome(t, rx.Done())
	waitUntil(t, "quarantined", func() bool { return gen.Pools().Quarantined() > 0 })
	s := scrape(t, gen, "gen/0")
	q := s.get(t, "kvxfer_pool_blocks", "group", "full", "state", "quarantined") + s.get(t, "kvxfer_pool_blocks", "group", "swa", "state", "quarantined")
	if q != float64(gen.Pools().Quarantined()) || s.get(t, "kvxfer_quarantined_bytes") != float64(gen.Stats().QuarantinedBytes) {
		t.Fatalf("quarantine metrics %v vs pools %d blocks %d bytes", nonzero(s), gen.Pools().Quarantined(), gen.Stats().QuarantinedBytes)
	}
	t.Logf("during: %v", nonzero(s))
	link.setCut(false)
	waitUntil(t, "live gauges at zero", func() bool {
		return live(scrape(t, gen, "gen/0"))+live(scrape(t, ctxE, "ctx/0")) == 0
	})
}

// TestMetricsQuarantineCallerOwned: the framework's own destination
// blocks (ReceiveRequest.Blocks), after a suspicion, wait for the writer's
// proof exactly as kvxfer's would (Released stays open) — are they seen in
// kvxfer_quarantined_bytes?
func TestMetricsQuarantineCallerOwned(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(inst string, cfg *kvxfer.Config) {
		cfg.MetricsAddr = "127.0.0.1:0"
	})
	gen, ctxE := c.gen[0], c.ctx[0]
	owned := ownedBlocks(gen, l, 64)
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q", PromptLen: 64, Context: "ctx", Blocks: owned})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "RequestData at ctx", func() bool { return link.atCtx.Load() > 0 })
	link.setCut(true)
	gen.PeerDown(ctxE.Hello().From)
	waitOutcome(t, rx.Done())
	select {
	case <-rx.Released():
		t.Fatal("released without proof")
	default:
	}
	s := scrape(t, gen, "gen/0")
	t.Logf("caller-owned, waiting for proof: %v", nonzero(s))
	if s.get(t, "kvxfer_quarantined_bytes")+s["kvxfer_caller_blocks_awaiting_proof{}"] == 0 {
		t.Errorf("kvxfer_quarantined_bytes = 0 while %d caller-owned destination blocks wait for their writer's proof", len(owned[0])+len(owned[1]))
	}
	// Stats says it too: the gauge is Stats.CallerBlocksAwaitingProof.
	if n, st := s["kvxfer_caller_blocks_awaiting_proof{}"], gen.Stats().CallerBlocksAwaitingProof; n == 0 || float64(st) != n {
		t.Errorf("Stats.CallerBlocksAwaitingProof = %d, kvxfer_caller_blocks_awaiting_proof = %v: want the same, not 0", st, n)
	}
	link.setCut(false)
	<-rx.Released()
	waitUntil(t, "caller blocks gauge back to zero", func() bool {
		return scrape(t, gen, "gen/0")["kvxfer_caller_blocks_awaiting_proof{}"] == 0
	})
	if st := gen.Stats().CallerBlocksAwaitingProof; st != 0 {
		t.Errorf("Stats.CallerBlocksAwaitingProof = %d once the blocks were released, want 0", st)
	}
}

// TestHeartbeatMissesNotGracefulLeaves: a peer that left the etcd
// cluster gracefully (node calls PeerDownBecause with "... (left)") missed
// no heartbeat; kvxfer_heartbeat_misses_total must not count it.
func TestHeartbeatMissesNotGracefulLeaves(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ce := c.ctx[0]
	gen := messages.PeerID{Instance: "gen", Rank: 0}
	ce.PeerDownBecause(gen, "is out of etcd cluster c (left)")
	s := scrape(t, ce, "ctx/0")
	if n := s["kvxfer_heartbeat_misses_total{peer=gen/0}"]; n != 0 {
		t.Errorf("a graceful leave counted as %v heartbeat misses", n)
	}
	ce.PeerDown(gen)
	eventually(t, "a real miss counted", func() bool {
		return scrape(t, ce, "ctx/0")["kvxfer_heartbeat_misses_total{peer=gen/0}"] == 1
	})
}
