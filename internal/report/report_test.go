package report

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sample is a made-up but plausible set of results.
func sample() Results {
	ms := time.Millisecond
	var tl []bench.ChunkTimeline
	for _, mode := range []string{"pipelined", "after-prefill"} {
		t := bench.ChunkTimeline{Mode: mode}
		for i := range 4 {
			c := bench.ChunkBar{Chunk: i, ComputeStart: time.Duration(i) * 4 * ms, ComputeEnd: time.Duration(i+1) * 4 * ms}
			if mode == "pipelined" {
				c.TransferStart, c.TransferEnd = c.ComputeEnd, c.ComputeEnd+ms
			} else {
				c.TransferStart, c.TransferEnd = 16*ms, 16*ms+time.Duration(i+1)*ms
			}
			t.Chunks = append(t.Chunks, c)
		}
		t.Ready = t.Chunks[3].TransferEnd + ms/10
		t.Exposed = t.Ready - 16*ms
		tl = append(tl, t)
	}
	return Results{
		Command: "kvxfer bench --report out", Started: time.Unix(1700000000, 0), Elapsed: 90 * time.Second,
		Raw: []rdmabench.Result{
			{Backend: "loopback", SizeBytes: 64 << 10, Segments: 1, BytesPerSec: 20e9, CopyBytesPerSec: 40e9, Ratio: 0.5},
			{Backend: "loopback", SizeBytes: 1 << 20, Segments: 1, BytesPerSec: 22e9, CopyBytesPerSec: 25e9, Ratio: 0.88},
		},
		Small: &bench.SmallResult{Backend: "loopback", Model: "Llama-3.1-8B", TokensPerBlock: 16, Concurrency: 4, Workers: 4,
			PeakBytesPerSec: 24e9, PeakSegmentBytes: 4 << 20, PeakSlots: 64, PeakSpanBytes: 256 << 20,
			CachePeakBytesPerSec: 30e9, CachePeakSegmentBytes: 1 << 20,
			ParallelPeakBytesPerSec: 26e9, ParallelPeakSegmentBytes: 16 << 20, ParallelPeakSlots: 4, Sizes: []bench.SmallSize{
				{Tokens: 128, RequestBytes: 16 << 20, BytesPerSec: 21e9, SerialBytesPerSec: 17e9, RawBytesPerSec: 23e9, FractionOfPeak: 0.875},
				{Tokens: 512, RequestBytes: 64 << 20, BytesPerSec: 22e9, SerialBytesPerSec: 19e9, RawBytesPerSec: 18e9, FractionOfPeak: 0.91},
			}},
		Fragmented: &bench.FragmentedResult{Model: "Llama-3.1-8B", Contiguous: bench.FragmentedSide{SegmentsPerRequest: 1, BytesPerSec: 18e9},
			Fragmented: bench.FragmentedSide{SegmentsPerRequest: 32, BytesPerSec: 17e9}, Ratio: 0.94},
		E2E: &bench.E2EResult{Model: "Llama-3.1-8B", Requests: 3, MinTokens: 512, MaxTokens: 2048, Modes: []bench.E2EMode{
			{Mode: "pipelined", Exposed: []time.Duration{ms, 2 * ms, 3 * ms}, ExposedP50: 2 * ms, ExposedP99: 3 * ms},
			{Mode: "after-prefill", Exposed: []time.Duration{5 * ms, 9 * ms, 12 * ms}, ExposedP50: 9 * ms, ExposedP99: 12 * ms},
		}},
		Workers: []bench.WorkersResult{{Peers: 4, Chunks: 400, PostCost: 200 * time.Microsecond, OpsPerSec: map[int]float64{1: 4000, 4: 9000}}},
		Pipelining: &bench.PipeliningSweep{Model: "Llama-3.1-8B", Prompt: 2048, ComputePerToken: 20 * time.Microsecond, Points: []bench.PipeliningResult{
			{ChunkTokens: 128, OneChunk: ms, Exposed: ms, Serial: 10 * ms, Bound: 2 * ms},
			{ChunkTokens: 512, OneChunk: 3 * ms, Exposed: 3 * ms, Serial: 10 * ms, Bound: 4 * ms},
		}},
		Timelines: tl,
		Overhead:  &bench.OverheadResult{Chunks: 100, Workers: 4, P50: 30 * time.Microsecond, P99: 90 * time.Microsecond, OpsPerSec: 50000},
		RequestOverhead: &bench.RequestOverheadResult{Requests: 10, Workers: 4, P50: 60 * time.Microsecond, P99: 200 * time.Microsecond, PerSec: 12000,
			Breakdown: bench.Breakdown{Setup: 35 * time.Microsecond, Data: 5 * time.Microsecond, Finish: 20 * time.Microsecond}},
	}
}

func TestWriteEverything(t *testing.T) {
	dir := t.TempDir()
	files, err := Write(dir, sample())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{BandwidthPNG, TimelinePNG, LatencyCDFPNG, PipeliningPNG} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r := img.Bounds(); r.Dx() < 400 || r.Dy() < 200 {
			t.Errorf("%s is %v: too small to read", name, r)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"](bandwidth.png)", "](timeline.png)", "](latency_cdf.png)", "](pipelining.png)",
		"| 128 | 16MiB |", "**88%**", "one endpoint **24.00 GB/s** (one 4MiB segment per batch, the batches rotating over 256MiB: the peak of one request in flight), 4 endpoints at once **26.00 GB/s** (16MiB segments over 256MiB in all", "cache-resident, every batch on one source and one destination: 30.00 GB/s (1MiB segments)", "| fragmented | 32.0 |", "| 4 | 400 | 200µs | 4000 | 9000 | 2.25 |", "| 60 | 200 | 12000 | 35 | 5 | 20 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("README.md lacks %q:\n%s", want, md)
		}
	}
	var back Results
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &back); err != nil || back.Small == nil || len(back.Timelines) != 2 {
		t.Errorf("results.json does not round-trip: %v", err)
	}
	if len(files) != 6 {
		t.Errorf("wrote %v", files)
	}
}

// A report of one scenario draws only the plots it can.
func TestWriteOnlyWhatRan(t *testing.T) {
	dir := t.TempDir()
	r := Results{Command: "kvxfer bench overhead --report x", Overhead: sample().Overhead}
	files, err := Write(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 { // results.json, README.md
		t.Errorf("wrote %v", files)
	}
	if _, err := os.Stat(filepath.Join(dir, BandwidthPNG)); !os.IsNotExist(err) {
		t.Errorf("bandwidth.png drawn without data: %v", err)
	}
}
