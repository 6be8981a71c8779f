package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestChunkOverheadRuns(t *testing.T) {
	r, err := ChunkOverhead(context.Background(), 200, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.Chunks != 200 || r.OpsPerSec <= 0 || r.P50 <= 0 || r.P99 < r.P50 {
		t.Fatalf("implausible result %+v", r)
	}
}

func BenchmarkChunkOverhead(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r, err := ChunkOverhead(context.Background(), 20000, 4)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.P50.Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(r.P99.Nanoseconds()), "p99-ns")
		b.ReportMetric(r.OpsPerSec, "chunk-ops/s")
	}
}

func TestWorkersRuns(t *testing.T) {
	r, err := Workers(context.Background(), 2, 20, 0, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.OpsPerSec[1] <= 0 || r.OpsPerSec[2] <= 0 {
		t.Fatalf("implausible %+v", r)
	}
}

// BenchmarkWorkers: 4 peers and 1 peer over a backend whose every post
// costs the worker 200 µs; 1 worker against 4.
func BenchmarkWorkers(b *testing.B) {
	for _, peers := range []int{4, 1} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r, err := Workers(context.Background(), peers, 400, 200*time.Microsecond, []int{1, 4})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.OpsPerSec[1], "ops/s-1w")
				b.ReportMetric(r.OpsPerSec[4], "ops/s-4w")
				b.ReportMetric(r.OpsPerSec[4]/r.OpsPerSec[1], "ratio-4w/1w")
			}
		})
	}
}

func TestPipeliningRuns(t *testing.T) {
	r, err := Pipelining(context.Background(), "Llama-3.1-8B", 32, 2, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.OneChunk <= 0 || r.Exposed <= 0 || r.Serial <= 0 {
		t.Fatalf("implausible %+v", r)
	}
	// A warm-up request ran first, outside the medians (before, a
	// one-rep run's figures were its first requests', page faults and
	// all).
	if r.Warmup <= 0 {
		t.Fatalf("no warm-up request: %+v", r)
	}
}

// BenchmarkPipelining: Llama-3.1-8B, chunks of 256 tokens (32 MiB), 8
// chunks, 10 ms compute per chunk (more than a chunk's transfer).
func BenchmarkPipelining(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r, err := Pipelining(context.Background(), "Llama-3.1-8B", 256, 8, 10*time.Millisecond, 7)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.OneChunk.Microseconds()), "one-chunk-us")
		b.ReportMetric(float64(r.Exposed.Microseconds()), "exposed-us")
		b.ReportMetric(float64(r.Bound.Microseconds()), "bound-us")
		b.ReportMetric(float64(r.Serial.Microseconds()), "serial-us")
		b.ReportMetric(1-float64(r.Exposed)/float64(r.Serial), "hidden")
	}
}

func TestRequestOverheadRuns(t *testing.T) {
	r, err := RequestOverhead(context.Background(), 50, 2)
	if err != nil {
		t.Fatal(err)
	}
	b := r.Breakdown
	if r.P50 <= 0 || r.P99 < r.P50 || r.PerSec <= 0 || r.Allocs <= 0 || b.Setup <= 0 || b.Data <= 0 || b.Finish <= 0 {
		t.Fatalf("implausible %+v", r)
	}
}

// BenchmarkRequestOverhead: 2-byte requests one at a time, 4 workers.
func BenchmarkRequestOverhead(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r, err := RequestOverhead(context.Background(), 2000, 4)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.P50.Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(r.P99.Nanoseconds()), "p99-ns")
		b.ReportMetric(float64(r.Breakdown.Setup.Nanoseconds()), "setup-ns")
		b.ReportMetric(float64(r.Breakdown.Data.Nanoseconds()), "data-ns")
		b.ReportMetric(float64(r.Breakdown.Finish.Nanoseconds()), "finish-ns")
		b.ReportMetric(r.Allocs, "allocs/req")
		b.ReportMetric(r.BytesAlloc, "B/req")
		b.ReportMetric(float64(r.GCs), "gcs")
	}
}

// TestWrappersKeepDelivery: the benchmarks' observing wrappers say what the
// agent they wrap says about delivery (rdma.Delivering), so that the
// engine measured takes the path it takes unwrapped.
func TestWrappersKeepDelivery(t *testing.T) {
	lb := loopback.New()
	defer func() { _ = lb.Close() }()
	fa := faulty.New(lb)
	for _, inner := range []rdma.Agent{lb, fa} {
		want := rdma.CompletionsDeliver(inner)
		for name, a := range map[string]rdma.Agent{"countingAgent": &countingAgent{Agent: inner}, "probeAgent": &probeAgent{Agent: inner}} {
			if got := rdma.CompletionsDeliver(a); got != want {
				t.Errorf("%s over %T: CompletionsDeliver %v, the wrapped agent's %v", name, inner, got, want)
			}
		}
	}
	if !rdma.CompletionsDeliver(lb) || rdma.CompletionsDeliver(fa) {
		t.Errorf("loopback %v, faulty over it %v: want true, false", rdma.CompletionsDeliver(lb), rdma.CompletionsDeliver(fa))
	}
}
