package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/demo"
)

// TestDemoLoadBreaksDown runs a small demo under the probe and checks that
// every chunk and request was matched and that the stages add up.
func TestDemoLoadBreaksDown(t *testing.T) {
	o := demo.DefaultOptions()
	o.Requests, o.MinTokens, o.MaxTokens, o.ChunkTokens = 2, 64, 128, 32
	o.PoolBytes, o.Compute, o.Concurrency, o.Workers = 64<<20, time.Millisecond, 2, 2
	r, err := DemoLoad(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Report.OK() || len(r.Modes) != 2 {
		t.Fatalf("report %+v, %d modes", r.Report, len(r.Modes))
	}
	for _, m := range r.Modes {
		// 64 and 128 tokens by 32: 2 + 4 chunks.
		if len(m.Requests) != 2 || len(m.Chunks) != 6 {
			t.Fatalf("%s: %d requests, %d chunks matched, want 2 and 6", m.Mode, len(m.Requests), len(m.Chunks))
		}
		if m.Wall <= 0 || m.CopyBytes == 0 || m.FillBytes != m.CopyBytes || m.VerifyBytes != m.CopyBytes || m.Endpoints < 1 {
			t.Errorf("%s: implausible %+v", m.Mode, m)
		}
		for _, q := range m.Requests {
			l := q.Last
			parts := l.FenceHop + l.ToPost + l.QueueOwn + l.QueueOther + l.Copy + l.Back + q.Flush + q.ToResult + q.ToReady
			// The stages tile the exposed window except where the copy
			// started before the session learnt of the fence (none here)
			// or the copier woke late (counted as copy): within 1 ms.
			if q.Exposed <= 0 || l.Copy <= 0 || l.Bytes == 0 || parts-q.Exposed > time.Millisecond || q.Exposed-parts > time.Millisecond {
				t.Errorf("%s %s: exposed %v, stages sum to %v: %+v", m.Mode, q.Request, q.Exposed, parts, q)
			}
			// Loopback's completions prove delivery: no flush, and the
			// Result stage starts at the last completion.
			if q.Flush != 0 || q.ToResult <= 0 || q.ToResult > q.Exposed {
				t.Errorf("%s %s: flush %v, to Result %v (exposed %v), want no flush and a Result stage inside the window", m.Mode, q.Request, q.Flush, q.ToResult, q.Exposed)
			}
		}
	}
	var sb strings.Builder
	r.Print(&sb)
	for _, want := range []string{"exposed window", "queued behind other requests", "memory traffic"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("printout lacks %q:\n%s", want, sb.String())
		}
	}
}

// BenchmarkDemoLoad is the README's demo under the probe; it prints the
// breakdown (go test -bench DemoLoad -benchtime 1x -v).
func BenchmarkDemoLoad(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r, err := DemoLoad(context.Background(), demo.DefaultOptions())
		if err != nil {
			b.Fatal(err)
		}
		p := r.Report.Rows[0]
		b.ReportMetric(p.BytesPerSec/1e9, "GB/s")
		b.ReportMetric(float64(p.ExposedP50.Microseconds()), "exposed-p50-us")
		b.ReportMetric(p.Hidden*100, "hidden-%")
		r.Print(os.Stdout)
	}
}
