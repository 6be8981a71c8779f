//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/faulty"
)

// TestStatsOpsInDoubt: a batch hangs on the wire past its request's
// deadline, so its op goes IN_DOUBT, and stays so (the drain grace is a
// minute) until the sender worker crashes: its restart closes the
// endpoint, which proves the write over and retires the op.
// Stats.OpsInDoubt counts the op meanwhile and drops to 0 after, metrics
// off as on, and with metrics on it agrees with kvxfer_ops_in_doubt.
func TestStatsOpsInDoubt(t *testing.T) {
	for _, metricsOn := range []bool{false, true} {
		name := "metrics off"
		if metricsOn {
			name = "metrics on"
		}
		t.Run(name, func(t *testing.T) {
			l := smallLayout()
			var hung atomic.Bool // hang exactly the first batch
			ce, ge := faultyPairWith(t, l, 1, func(inst string, cfg *kvxfer.Config) {
				if inst == "ctx" {
					cfg.DrainGrace = time.Minute // only the crash closes the endpoint
					if metricsOn {
						cfg.MetricsAddr = "127.0.0.1:0"
					}
				}
			}, faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
			inDoubt := func(want int64) func() bool {
				return func() bool {
					if ce.Stats().OpsInDoubt != want {
						return false
					}
					return !metricsOn || scrape(t, ce, "ctx/0").get(t, "kvxfer_ops_in_doubt") == float64(want)
				}
			}
			rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "doubt", PromptLen: 64, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
			src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
			if err != nil {
				t.Fatal(err)
			}
			tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "doubt", PromptLen: 64, Timeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			c0 := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
			if err := tx.Chunk(c0, c0.Runs(l.TokensPerBlock, src), nil); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the op in doubt in Stats.OpsInDoubt (and kvxfer_ops_in_doubt)", inDoubt(1))
			select {
			case o := <-tx.Done():
				t.Fatalf("tx Done (%s %v) with its op in doubt", o.Status, o.Err)
			default:
			}

			ce.CrashWorker(0) // its restart closes the endpoint: the proof
			o := waitOutcome(t, tx.Done())
			if o.OK {
				t.Fatalf("tx %s past its deadline", o.Status)
			}
			if err := ce.Pools().Free(src); err != nil {
				t.Fatalf("free the source blocks after Done: %v", err)
			}
			waitOutcome(t, rx.Done())
			waitUntil(t, "Stats.OpsInDoubt (and kvxfer_ops_in_doubt) back to 0 after the proof", inDoubt(0))
			if st := ce.Stats(); st.WorkerRestarts != 1 || st.ClosesUnproven != 0 {
				t.Errorf("worker restarts %d, closes unproven %d; want 1 and 0", st.WorkerRestarts, st.ClosesUnproven)
			}
		})
	}
}
