package bench

import (
	"context"
	"testing"

	"go.uber.org/goleak"
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
