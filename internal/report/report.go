// Package report turns the results of `kvxfer bench` scenarios into a
// directory a person reads: README.md (the figures as Markdown tables, the
// command and the machine) and PNG plots drawn with gonum.org/v1/plot —
// bandwidth against size beside the raw peak, a chunk timeline of compute
// and transfer pipelined and not, the exposed-latency CDF and exposed
// latency against chunk size. Each plot is drawn only when the scenarios it
// needs ran. results.json holds every figure for machines.
//
// The package only formats: it runs nothing and keeps no state.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

// Results are the scenarios' outputs; nil or empty fields did not run.
type Results struct {
	Command    string                  `json:"command"`
	Started    time.Time               `json:"started"`
	Elapsed    time.Duration           `json:"elapsed_ns"`
	Raw        []rdmabench.Result      `json:"raw,omitempty"`
	Small      *bench.SmallResult      `json:"small,omitempty"`
	Fragmented *bench.FragmentedResult `json:"fragmented,omitempty"`
	E2E        *bench.E2EResult        `json:"e2e,omitempty"`
	Workers    []bench.WorkersResult   `json:"workers,omitempty"`
	Pipelining *bench.PipeliningSweep  `json:"pipelining,omitempty"`
	Timelines  []bench.ChunkTimeline   `json:"timelines,omitempty"`
	Overhead   *bench.OverheadResult   `json:"overhead,omitempty"`
	// RequestOverhead comes with Overhead (bench overhead).
	RequestOverhead *bench.RequestOverheadResult `json:"request_overhead,omitempty"`
	// Steal is, per scenario run, the share of the machine's CPU time the
	// host took meanwhile (a virtual machine's steal; absent where the
	// machine does not say): figures move with it.
	Steal map[string]float64 `json:"steal,omitempty"`
}

// Plot file names.
const (
	BandwidthPNG  = "bandwidth.png"
	TimelinePNG   = "timeline.png"
	LatencyCDFPNG = "latency_cdf.png"
	PipeliningPNG = "pipelining.png"
)

// Write writes dir/README.md, dir/results.json and the plots the results
// allow, creating dir, and returns the paths written.
func Write(dir string, r Results) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	plots := map[string]bool{}
	for _, pl := range []struct {
		name string
		draw func(path string) (bool, error)
	}{
		{BandwidthPNG, func(p string) (bool, error) { return bandwidthPlot(r, p) }},
		{TimelinePNG, func(p string) (bool, error) { return timelinePlot(r.Timelines, p) }},
		{LatencyCDFPNG, func(p string) (bool, error) { return cdfPlot(r.E2E, p) }},
		{PipeliningPNG, func(p string) (bool, error) { return pipeliningPlot(r.Pipelining, p) }},
	} {
		path := filepath.Join(dir, pl.name)
		ok, err := pl.draw(path)
		if err != nil {
			return written, fmt.Errorf("report: %s: %w", pl.name, err)
		}
		if ok {
			plots[pl.name] = true
			written = append(written, path)
		}
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return written, err
	}
	path := filepath.Join(dir, "results.json")
	if err := os.WriteFile(path, append(js, '\n'), 0o644); err != nil {
		return written, err
	}
	written = append(written, path)
	f, err := os.Create(filepath.Join(dir, "README.md"))
	if err != nil {
		return written, err
	}
	markdown(f, r, plots)
	if err := f.Close(); err != nil {
		return written, err
	}
	return append(written, f.Name()), nil
}

func gbps(bps float64) string { return fmt.Sprintf("%.2f", bps/1e9) }

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }

func msf(d time.Duration) string { return fmt.Sprintf("%.2f", ms(d)) }

// markdown writes the summary.
func markdown(w io.Writer, r Results, plots map[string]bool) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# kvxfer bench report\n\n")
	p("`%s`, started %s, took %s. Machine: %s/%s, %d CPUs, %s.\n\n", r.Command, r.Started.Format(time.RFC3339),
		r.Elapsed.Round(time.Second), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	p("Figures are medians of alternating rounds in this one run; compare them with each other, not with another run's.\n\n")

	if len(r.Raw) > 0 {
		p("## Raw backend vs Go copy (`bench raw`)\n\n| backend | size | segments | memory | backend GB/s | copy GB/s | ratio |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, m := range r.Raw {
			mem := "one place" // every batch reuses one source and one destination
			if m.Slots > 1 {
				mem = fmt.Sprintf("%d places, %s", m.Slots, sizeLabel(uint64(m.Slots)*m.SizeBytes*uint64(m.Segments)))
			}
			p("| %s | %s | %d | %s | %s | %s | %.2f |\n", m.Backend, sizeLabel(m.SizeBytes), m.Segments, mem, gbps(m.BytesPerSec), gbps(m.CopyBytesPerSec), m.Ratio)
		}
		p("\n")
	}
	if s := r.Small; s != nil {
		p("## Small requests (`bench small`)\n\n%s, %d tokens per block, %s backend, %d workers. Raw peak of the same backend in this run, over distinct memory so that its bytes do not stay in a CPU cache: one endpoint **%s GB/s** (one %s segment per batch, the batches rotating over %s: the peak of one request in flight), %d endpoints at once **%s GB/s** (%s segments over %s in all; the peak of %d in flight is the better of the two); cache-resident, every batch on one source and one destination: %s GB/s (%s segments).\n\n",
			s.Model, s.TokensPerBlock, s.Backend, s.Workers, gbps(s.PeakBytesPerSec), sizeLabel(s.PeakSegmentBytes),
			sizeLabel(uint64(s.PeakSlots)*s.PeakSegmentBytes), s.Concurrency, gbps(s.ParallelPeakBytesPerSec), sizeLabel(s.ParallelPeakSegmentBytes),
			sizeLabel(uint64(s.ParallelPeakSlots*s.Concurrency)*s.ParallelPeakSegmentBytes), s.Concurrency,
			gbps(s.CachePeakBytesPerSec), sizeLabel(s.CachePeakSegmentBytes))
		p("| tokens | bytes | segments/request | GB/s (%d in flight) | fraction of peak | GB/s (1 in flight) | fraction | raw GB/s at this size | latency p50 / p99 (µs) | setup / data / finish / raw copy (µs) |\n", s.Concurrency)
		p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, z := range s.Sizes {
			b := z.Breakdown
			p("| %d | %s | %.1f | %s | **%.0f%%** | %s | %.0f%% | %s | %s / %s | %s / %s / %s / %s |\n", z.Tokens, sizeLabel(z.RequestBytes),
				z.SegmentsPerRequest, gbps(z.BytesPerSec), 100*z.FractionOfPeak, gbps(z.SerialBytesPerSec), 100*z.SerialFractionOfPeak,
				gbps(z.RawBytesPerSec), us(z.LatencyP50), us(z.LatencyP99), us(b.Setup), us(b.Data), us(b.Finish), us(b.RawCopy))
		}
		p("\nSetup: Receive until the op could leave; data: until the context session stepped on its completion; finish: until READY reached the caller (bench.Breakdown).\n\n")
	}
	if plots[BandwidthPNG] {
		p("![bandwidth vs size](%s)\n\n", BandwidthPNG)
	}
	if f := r.Fragmented; f != nil {
		p("## Fragmented pools (`bench fragmented`)\n\n%s, %d tokens per block, %d-token requests (%s), one in flight, %s backend.\n\n",
			f.Model, f.TokensPerBlock, f.Tokens, sizeLabel(f.RequestBytes), f.Backend)
		p("| pools | segments/request | GB/s | latency p50 (µs) |\n| --- | ---: | ---: | ---: |\n")
		p("| contiguous | %.1f | %s | %s |\n", f.Contiguous.SegmentsPerRequest, gbps(f.Contiguous.BytesPerSec), us(f.Contiguous.LatencyP50))
		p("| fragmented | %.1f | %s | %s |\n", f.Fragmented.SegmentsPerRequest, gbps(f.Fragmented.BytesPerSec), us(f.Fragmented.LatencyP50))
		p("\nFragmented / contiguous bandwidth: **%.2f**.\n\n", f.Ratio)
	}
	if e := r.E2E; e != nil {
		p("## End to end (`bench e2e`)\n\n%d %s requests of %d..%d tokens, chunks of %d tokens, %v compute per chunk, %d in flight, %s backend.\n\n",
			e.Requests, e.Model, e.MinTokens, e.MaxTokens, e.ChunkTokens, e.Compute, e.Concurrency, e.Backend)
		p("| mode | GiB | wall (s) | GB/s | exposed p50 (ms) | exposed p99 (ms) |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
		for _, m := range e.Modes {
			p("| %s | %.2f | %.2f | %s | %s | %s |\n", m.Mode, float64(m.Bytes)/(1<<30), m.Wall.Seconds(), gbps(m.BytesPerSec), msf(m.ExposedP50), msf(m.ExposedP99))
		}
		p("\n")
		if plots[LatencyCDFPNG] {
			p("![exposed latency CDF](%s)\n\n", LatencyCDFPNG)
		}
	}
	if sw := r.Pipelining; sw != nil {
		p("## Pipelining (`bench pipelining`)\n\n%s, %d-token prompt, %v of compute per token: exposed latency (last fence → READY) against chunk size.\n\n",
			sw.Model, sw.Prompt, sw.ComputePerToken)
		p("| chunk tokens | chunk bytes | chunks | compute/chunk | one chunk alone (µs) | pipelined exposed (µs) | bound 1.1×one+100µs | after prefill (µs) | hidden |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, pt := range sw.Points {
			p("| %d | %s | %d | %v | %s | %s | %s | %s | %.0f%% |\n", pt.ChunkTokens, sizeLabel(pt.ChunkBytes), pt.Chunks, pt.Compute,
				us(pt.OneChunk), us(pt.Exposed), us(pt.Bound), us(pt.Serial), 100*(1-float64(pt.Exposed)/float64(pt.Serial)))
		}
		p("\n")
		if plots[PipeliningPNG] {
			p("![exposed latency vs chunk size](%s)\n\n", PipeliningPNG)
		}
	}
	if plots[TimelinePNG] {
		p("### One request's chunks\n\nCompute is each chunk's prefill; transfer runs from the chunk's fence to its op's completion (waiting for the endpoint included).\n\n")
		for _, tl := range r.Timelines {
			p("- %s: %d chunks, READY %s ms after prefill began, %s ms after the last fence\n", tl.Mode, len(tl.Chunks), msf(tl.Ready), msf(tl.Exposed))
		}
		p("\n![chunk timeline](%s)\n\n", TimelinePNG)
	}
	if len(r.Workers) > 0 {
		p("## Sender workers (`bench workers`)\n\nOne request of one-token chunks over faulty(loopback) with a modelled post cost per batch.\n\n")
		p("| peers | chunks | post cost | ops/s, 1 worker | ops/s, 4 workers | 4 / 1 |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, wr := range r.Workers {
			counts := make([]int, 0, len(wr.OpsPerSec))
			for k := range wr.OpsPerSec {
				counts = append(counts, k)
			}
			sort.Ints(counts)
			lo, hi := wr.OpsPerSec[counts[0]], wr.OpsPerSec[counts[len(counts)-1]]
			p("| %d | %d | %v | %.0f | %.0f | %.2f |\n", wr.Peers, wr.Chunks, wr.PostCost, lo, hi, hi/lo)
		}
		p("\n")
	}
	if o := r.Overhead; o != nil {
		p("## Engine overhead (`bench overhead`)\n\nA layout whose blocks are 2 bytes: the engine's path, not the copy. Per chunk: %d one-token chunks of one request, %d workers.\n\n| handover → op completed p50 (µs) | p99 (µs) | chunk-ops/s, all queued |\n| ---: | ---: | ---: |\n| %s | %s | %.0f |\n\n",
			o.Chunks, o.Workers, us(o.P50), us(o.P99), o.OpsPerSec)
	}
	if q := r.RequestOverhead; q != nil {
		b := q.Breakdown
		p("Per request: %d one-token requests one at a time, Receive → READY.\n\n| p50 (µs) | p99 (µs) | requests/s | setup (µs) | data (µs) | finish (µs) |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n| %s | %s | %.0f | %s | %s | %s |\n\n",
			q.Requests, us(q.P50), us(q.P99), q.PerSec, us(b.Setup), us(b.Data), us(b.Finish))
	}
	p("Every figure is also in [results.json](results.json).\n")
}

// Scenarios lists, for the summary line, which scenarios r holds.
func (r Results) Scenarios() string {
	var s []string
	add := func(ok bool, name string) {
		if ok {
			s = append(s, name)
		}
	}
	add(len(r.Raw) > 0, "raw")
	add(r.Small != nil, "small")
	add(r.Fragmented != nil, "fragmented")
	add(r.E2E != nil, "e2e")
	add(len(r.Workers) > 0, "workers")
	add(r.Pipelining != nil, "pipelining")
	add(r.Overhead != nil, "overhead")
	return strings.Join(s, ", ")
}
