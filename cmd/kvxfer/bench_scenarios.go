package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/proc"
	"github.com/kvxfer/kvxfer/internal/report"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

func table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
}

// ---- raw ----

type rawScenario struct {
	sizes    []string
	rounds   int
	bytes    string
	segments int
	peer     bool
	pause    time.Duration
	span     string
	results  []rdmabench.Result
}

func newRawScenario() *rawScenario {
	return &rawScenario{sizes: []string{"64KiB", "1MiB", "16MiB"}, rounds: 5, bytes: "256MiB", segments: 1}
}

func (*rawScenario) name() string { return "raw" }
func (*rawScenario) short() string {
	return "Post bandwidth of a backend beside Go's copy of the same bytes"
}
func (*rawScenario) long() string {
	return `raw posts batches of segments through a backend (sender and receiver in
this process, or with --peer-process the receiver in a child process, as
ucx_perftest runs its server; for shm the destination is a shared-memory
file) and copies the same bytes with Go's copy, alternating the two --rounds
times per size, and reports the medians and their ratio. Every batch reuses
one source and one destination, which stay in a CPU cache when they fit
one; --span rotates the batches over that much distinct memory instead, as
a request's own pages are. Run from kvxfer bench without a backend set, it
measures loopback and shm.`
}
func (*rawScenario) example() string {
	return examples("", "kvxfer bench raw --backend shm --sizes 64KiB,1MiB,16MiB --json",
		"many small segments per batch", "kvxfer bench raw --backend loopback --sizes 4KiB --segments 256",
		"the receiver in another process", "kvxfer bench raw --backend ucx --peer-process --sizes 64KiB",
		"bursts after 200ms idle", "kvxfer bench raw --backend ucx --peer-process --sizes 64KiB --pause 200ms",
		"over 256MiB of distinct memory, beyond the CPU's caches", "kvxfer bench raw --backend loopback --sizes 1MiB,16MiB --span 256MiB")
}
func (*rawScenario) keys() ([]string, map[string]string) {
	return []string{config.Backend}, map[string]string{config.Backend: "shm"}
}
func (r *rawScenario) flags(f *pflag.FlagSet) {
	f.StringSliceVar(&r.sizes, "sizes", r.sizes, "segment sizes, comma-separated: bytes, or with a KiB, MiB or GiB suffix")
	f.IntVar(&r.rounds, "rounds", r.rounds, "how many times backend and copy alternate per size (medians are reported)")
	f.StringVar(&r.bytes, "bytes", r.bytes, "bytes moved per sample")
	f.IntVar(&r.segments, "segments", r.segments, "segments per batch")
	f.BoolVar(&r.peer, "peer-process", r.peer, "receive in a child process (shm and ucx)")
	f.DurationVar(&r.pause, "pause", r.pause, "idle this long before each backend sample: a burst after a pause rather than a stream")
	f.StringVar(&r.span, "span", r.span, "distinct memory the batches rotate over, in the source and in the destination: more than one batch, --sizes × --segments (empty: every batch reuses one place)")
}
func (r *rawScenario) steps() int { return 2 * len(r.sizes) }

func (r *rawScenario) backends(s config.Settings) []string {
	if s.Origin(config.Backend).Source == config.SourceDefault && s.Backend == "loopback" {
		return []string{"loopback", "shm"} // kvxfer bench: both in-host backends
	}
	return []string{s.Backend}
}

func (r *rawScenario) run(ctx context.Context, s config.Settings, p bench.ProgressFunc, res *report.Results) error {
	backends := r.backends(s)
	for _, b := range backends {
		if !slices.Contains(rdmabench.Backends(), b) {
			return s.Invalid(config.Backend, "bench raw measures "+strings.Join(rdmabench.Backends(), " or "))
		}
	}
	if r.rounds < 1 {
		return fmt.Errorf("--rounds %d: want at least 1", r.rounds)
	}
	if r.segments < 1 {
		return fmt.Errorf("--segments %d: want at least 1", r.segments)
	}
	if r.pause < 0 {
		return fmt.Errorf("--pause %v: want zero or more", r.pause)
	}
	minBytes, err := config.ParseSize(r.bytes)
	if err != nil {
		return fmt.Errorf("--bytes: %w", err)
	}
	if len(r.sizes) == 0 {
		return fmt.Errorf("--sizes: no size given")
	}
	var span uint64
	if r.span != "" {
		if span, err = config.ParseSize(r.span); err != nil {
			return fmt.Errorf("--span: %w", err)
		}
	}
	shape := func(size uint64) rdmabench.Shape {
		s := rdmabench.Shape{SegmentBytes: size, Segments: r.segments}
		if span > 0 {
			s.Slots = rdmabench.SlotsFor(s, span)
		}
		return s
	}
	sizes := make([]uint64, len(r.sizes))
	for i, v := range r.sizes {
		if sizes[i], err = config.ParseSize(v); err != nil {
			return fmt.Errorf("--sizes: %w", err)
		}
		// Every size before the first is measured: a batch the host
		// cannot hold is refused now, not after the others ran (nor by
		// the runtime's out of memory).
		for _, b := range backends {
			if err := rdmabench.CheckShape(b, shape(sizes[i])); err != nil {
				// The backend as the user set it (KVXFER_BACKEND, the
				// file's key), or the flag that picks it.
				backend := settingName(s, config.Backend) + " " + b
				if span > 0 {
					return fmt.Errorf("--sizes %s × --segments %d over --span %s (%s): %w", v, r.segments, r.span, backend, err)
				}
				return fmt.Errorf("--sizes %s × --segments %d (%s): %w", v, r.segments, backend, err)
			}
		}
	}
	if span > 0 {
		// Within one batch the span gives one place, as no --span does:
		// --span 256 is 256 bytes, not MiB. A span that rotates some
		// sizes' batches is taken (the table says "one place" for the
		// others).
		least := slices.Min(sizes) * uint64(r.segments)
		if span <= least {
			return fmt.Errorf("--span %s: not more than one batch of the smallest --sizes (%s × --segments %d = %s), so every batch would reuse one place: give more than %s (%s: two places), or leave --span out",
				r.span, config.FormatSize(slices.Min(sizes)), r.segments, config.FormatSize(least), config.FormatSize(least), config.FormatSize(2*least))
		}
	}
	cfg := rdmabench.Config{Rounds: r.rounds, MinBytes: minBytes, Pause: r.pause}
	if r.peer {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--peer-process: %w", err)
		}
		cfg.Peer = []string{exe, "bench", "raw-peer"}
	}
	done, total := 0, len(backends)*len(sizes)
	r.results = nil
	for _, b := range backends {
		for _, size := range sizes {
			// A measurement does not watch ctx: an interrupt stops the
			// scenario at the next one (a second signal exits at once).
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s size %s not measured: %w", b, config.FormatSize(size), err)
			}
			m, err := rdmabench.Measure(b, shape(size), cfg)
			if err != nil {
				return fmt.Errorf("%s size %s: %w", b, config.FormatSize(size), err)
			}
			r.results = append(r.results, m)
			done++
			p(done, total, b+" "+config.FormatSize(size))
		}
	}
	res.Raw = append(res.Raw, r.results...)
	return nil
}

func (r *rawScenario) print(w io.Writer, _ *report.Results, asJSON bool) error {
	if asJSON {
		return jsonLines(w, r.results...)
	}
	tw := table(w)
	fmt.Fprintf(tw, "BACKEND\tSIZE\tSEGMENTS\tMEMORY\tBACKEND GB/s\tCOPY GB/s\tRATIO\t\n")
	for _, m := range r.results {
		mem := "one place" // every batch reuses one source and one destination
		if m.Slots > 1 {
			mem = fmt.Sprintf("%d places, %s", m.Slots, config.FormatSize(uint64(m.Slots)*m.SizeBytes*uint64(m.Segments)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.2f\t%.2f\t%.2f\t\n", m.Backend, config.FormatSize(m.SizeBytes), m.Segments, mem,
			m.BytesPerSec/1e9, m.CopyBytesPerSec/1e9, m.Ratio)
	}
	return tw.Flush()
}

// ---- overhead ----

type overheadScenario struct{ chunks, requests int }

func newOverheadScenario() *overheadScenario { return &overheadScenario{chunks: 5000, requests: 2000} }

func (*overheadScenario) name() string { return "overhead" }
func (*overheadScenario) short() string {
	return "Engine overhead with ~0-byte writes: per chunk (handover → op completed, chunk-ops/s) and per request"
}
func (*overheadScenario) long() string {
	return `overhead sends one request of --chunks one-token chunks of a layout whose
every block is 2 bytes, so that what is measured is the engine's path (session,
stream, worker, backend completion, back), not the copy: the latency from
handover to the op's completion with one chunk in flight (p50, p99), and
chunk-ops/s with every chunk queued at once. Then it moves --requests
one-token requests one at a time: Receive → READY p50 and p99, and its
phases (setup: until the op may leave; data: until its completion reached
the session; finish: flush, Result, READY), what every request pays on top
of its bytes.`
}
func (*overheadScenario) example() string {
	return examples("", "kvxfer bench overhead --chunks 20000 --requests 5000 --workers 4")
}
func (*overheadScenario) keys() ([]string, map[string]string) {
	return []string{config.Workers}, nil
}
func (o *overheadScenario) flags(f *pflag.FlagSet) {
	f.IntVar(&o.chunks, "chunks", o.chunks, "one-token chunks per request")
	f.IntVar(&o.requests, "requests", o.requests, "one-token requests, one at a time")
}
func (*overheadScenario) steps() int { return 2 }
func (o *overheadScenario) sizedBy() (string, string) {
	return fmt.Sprintf("--chunks %d", o.chunks), "--chunks"
}
func (o *overheadScenario) run(ctx context.Context, s config.Settings, p bench.ProgressFunc, res *report.Results) error {
	for _, v := range []struct {
		flag string
		n    int
	}{{"chunks", o.chunks}, {"requests", o.requests}} {
		if v.n < 1 {
			return fmt.Errorf("--%s %d: want at least 1", v.flag, v.n)
		}
	}
	if err := checkRequests(o.requests); err != nil {
		return err
	}
	r, err := bench.ChunkOverhead(ctx, o.chunks, s.Workers)
	if err != nil {
		return err
	}
	p(1, 2, "per chunk")
	res.Overhead = &r
	rq, err := bench.RequestOverhead(ctx, o.requests, s.Workers)
	if err != nil {
		return err
	}
	p(2, 2, "per request")
	res.RequestOverhead = &rq
	return nil
}
func (o *overheadScenario) print(w io.Writer, res *report.Results, asJSON bool) error {
	r, q := res.Overhead, res.RequestOverhead
	if asJSON {
		type row struct {
			Path     string  `json:"path"`
			Count    int     `json:"count"`
			Workers  int     `json:"workers"`
			P50Us    float64 `json:"p50_us"`
			P99Us    float64 `json:"p99_us"`
			PerSec   float64 `json:"per_sec"`
			SetupUs  float64 `json:"setup_us,omitempty"`
			DataUs   float64 `json:"data_us,omitempty"`
			FinishUs float64 `json:"finish_us,omitempty"`
			// Allocs and Bytes: heap allocations and bytes a request,
			// both engines and the caller (request row only).
			Allocs float64 `json:"allocs_per_request,omitempty"`
			Bytes  float64 `json:"bytes_per_request,omitempty"`
		}
		b := q.Breakdown
		return jsonLines(w, row{"chunk", r.Chunks, r.Workers, us(r.P50), us(r.P99), r.OpsPerSec, 0, 0, 0, 0, 0},
			row{"request", q.Requests, q.Workers, us(q.P50), us(q.P99), q.PerSec, us(b.Setup), us(b.Data), us(b.Finish), q.Allocs, q.BytesAlloc})
	}
	tw := table(w)
	fmt.Fprintf(tw, "PATH\tCOUNT\tWORKERS\tP50 µs\tP99 µs\tPER SECOND\tSETUP µs\tDATA µs\tFINISH µs\tALLOCS\tHEAP KB\t\n")
	fmt.Fprintf(tw, "chunk (all queued /s)\t%d\t%d\t%s\t%s\t%.0f\t-\t-\t-\t-\t-\t\n", r.Chunks, r.Workers, micros(r.P50), micros(r.P99), r.OpsPerSec)
	b := q.Breakdown
	fmt.Fprintf(tw, "request (one at a time)\t%d\t%d\t%s\t%s\t%.0f\t%s\t%s\t%s\t%.1f\t%.1f\t\n", q.Requests, q.Workers, micros(q.P50), micros(q.P99),
		q.PerSec, micros(b.Setup), micros(b.Data), micros(b.Finish), q.Allocs, q.BytesAlloc/1024)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "(ALLOCS, HEAP KB: heap allocations and bytes a request, both engines and the caller in this one process)")
	return err
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// ---- workers ----

type workersScenario struct {
	chunks   int
	postCost time.Duration
}

func newWorkersScenario() *workersScenario {
	return &workersScenario{chunks: 400, postCost: 200 * time.Microsecond}
}

func (*workersScenario) name() string { return "workers" }
func (*workersScenario) short() string {
	return "Op throughput with 1 sender worker against 4, to 4 peers and to 1"
}
func (*workersScenario) long() string {
	return `workers sends one request of --chunks one-token chunks from a TP1 context
rank to 4 generation ranks (TP4, heads split), then to 1, over a
faulty(loopback) backend whose every post costs the worker --post-cost (the
CPU cost of building work requests and ringing a doorbell), once with 1
sender worker and once with 4, and reports ops/s and their ratio.`
}
func (*workersScenario) example() string {
	return examples("", "kvxfer bench workers --post-cost 100us")
}
func (*workersScenario) keys() ([]string, map[string]string) { return nil, nil }
func (w *workersScenario) flags(f *pflag.FlagSet) {
	f.IntVar(&w.chunks, "chunks", w.chunks, "one-token chunks per request")
	f.DurationVar(&w.postCost, "post-cost", w.postCost, "modelled CPU cost of one post")
}
func (*workersScenario) steps() int { return 2 }
func (w *workersScenario) sizedBy() (string, string) {
	return fmt.Sprintf("--chunks %d", w.chunks), "--chunks"
}
func (w *workersScenario) run(ctx context.Context, _ config.Settings, p bench.ProgressFunc, res *report.Results) error {
	if w.chunks < 1 {
		return fmt.Errorf("--chunks %d: want at least 1", w.chunks)
	}
	if w.postCost < 0 {
		return fmt.Errorf("--post-cost %v: want zero or more", w.postCost)
	}
	res.Workers = nil
	for i, peers := range []int{4, 1} {
		r, err := bench.Workers(ctx, peers, w.chunks, w.postCost, []int{1, 4})
		if err != nil {
			return err
		}
		res.Workers = append(res.Workers, r)
		p(i+1, 2, map[int]string{4: "4 peers", 1: "1 peer"}[peers])
	}
	return nil
}
func (*workersScenario) print(w io.Writer, res *report.Results, asJSON bool) error {
	type row struct {
		Peers      int     `json:"peers"`
		Chunks     int     `json:"chunks"`
		PostCost   string  `json:"post_cost"`
		OpsPerSec1 float64 `json:"ops_per_sec_1_worker"`
		OpsPerSec4 float64 `json:"ops_per_sec_4_workers"`
		Ratio      float64 `json:"ratio_4_to_1"`
	}
	var rows []row
	for _, r := range res.Workers {
		rows = append(rows, row{r.Peers, r.Chunks, r.PostCost.String(), r.OpsPerSec[1], r.OpsPerSec[4], r.OpsPerSec[4] / r.OpsPerSec[1]})
	}
	if asJSON {
		return jsonLines(w, rows...)
	}
	tw := table(w)
	fmt.Fprintf(tw, "PEERS\tCHUNKS\tPOST COST\tOPS/s 1 WORKER\tOPS/s 4 WORKERS\t4/1\t\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%.0f\t%.0f\t%.2f\t\n", r.Peers, r.Chunks, r.PostCost, r.OpsPerSec1, r.OpsPerSec4, r.Ratio)
	}
	return tw.Flush()
}

// ---- pipelining ----

type pipeliningScenario struct {
	prompt          int
	chunkSizes      []int
	computePerToken time.Duration
	reps            int
	timelineChunk   int
}

func newPipeliningScenario() *pipeliningScenario {
	return &pipeliningScenario{prompt: 2048, chunkSizes: []int{64, 128, 256, 512, 1024}, computePerToken: 20 * time.Microsecond,
		reps: 3, timelineChunk: 256}
}

func (*pipeliningScenario) name() string { return "pipelining" }
func (*pipeliningScenario) short() string {
	return "Exposed latency against chunk size, and one request's chunk timeline"
}
func (*pipeliningScenario) long() string {
	return `pipelining moves a --prompt-token request of the model on loopback, one at a
time, at each --chunk-sizes, with --compute-per-token of simulated prefill
(the same total at every size): pipelined (each chunk leaves when its fence
fires), a single chunk alone, and every chunk after prefill. It reports
the exposed latency (last fence → READY) of each (medians of --reps), and
records one request pipelined and one after prefill chunk by chunk (fence
fired, op completed) for the report's timeline.`
}
func (*pipeliningScenario) example() string {
	return examples("", "kvxfer bench pipelining --prompt 4096 --chunk-sizes 128,512,2048 --compute-per-token 30us")
}
func (*pipeliningScenario) keys() ([]string, map[string]string) { return []string{config.Model}, nil }
func (p *pipeliningScenario) flags(f *pflag.FlagSet) {
	f.IntVar(&p.prompt, "prompt", p.prompt, "prompt tokens")
	f.IntSliceVar(&p.chunkSizes, "chunk-sizes", p.chunkSizes, "chunk sizes in tokens, each dividing --prompt")
	f.DurationVar(&p.computePerToken, "compute-per-token", p.computePerToken, "simulated prefill compute per token")
	f.IntVar(&p.reps, "reps", p.reps, "requests of each kind per size (medians are reported)")
	f.IntVar(&p.timelineChunk, "timeline-chunk", p.timelineChunk, "chunk size of the recorded timeline (0: none)")
}
func (p *pipeliningScenario) steps() int { return len(p.chunkSizes) + 1 }
func (p *pipeliningScenario) run(ctx context.Context, s config.Settings, prog bench.ProgressFunc, res *report.Results) error {
	if err := p.validate(s.Model); err != nil {
		return err
	}
	total := p.steps()
	sw, err := bench.SweepPipelining(ctx, s.Model, p.prompt, p.chunkSizes, p.computePerToken, p.reps,
		func(done, _ int, what string) { prog(done, total, what) })
	if err != nil {
		return err
	}
	res.Pipelining = &sw
	if p.timelineChunk > 0 {
		tls, err := bench.Timelines(ctx, s.Model, p.timelineChunk, p.prompt/p.timelineChunk, p.computePerToken*time.Duration(p.timelineChunk))
		if err != nil {
			return err
		}
		res.Timelines = tls
	}
	prog(total, total, "timeline")
	return nil
}

// validate checks the flags before anything runs, naming the one that is
// wrong and its value.
func (p *pipeliningScenario) validate(model string) error {
	switch {
	case p.reps < 1:
		return fmt.Errorf("--reps = %d: want at least 1", p.reps)
	case p.prompt < 1:
		return fmt.Errorf("--prompt = %d: want at least 1", p.prompt)
	case p.computePerToken < 0:
		return fmt.Errorf("--compute-per-token = %v: want 0 or more", p.computePerToken)
	case len(p.chunkSizes) == 0:
		return fmt.Errorf("--chunk-sizes: no size given")
	case p.timelineChunk < 0:
		return fmt.Errorf("--timeline-chunk = %d: want a chunk size, or 0 for no timeline", p.timelineChunk)
	}
	for _, ct := range p.chunkSizes {
		if err := bench.CheckChunkSize(model, p.prompt, ct); err != nil {
			return fmt.Errorf("--chunk-sizes = %d: %w (--prompt %d)", ct, err, p.prompt)
		}
	}
	if p.timelineChunk > 0 {
		if err := bench.CheckChunkSize(model, p.prompt, p.timelineChunk); err != nil {
			return fmt.Errorf("--timeline-chunk = %d: %w (--prompt %d)", p.timelineChunk, err, p.prompt)
		}
	}
	return nil
}
func (*pipeliningScenario) print(w io.Writer, res *report.Results, asJSON bool) error {
	sw := res.Pipelining
	if asJSON {
		type row struct {
			Model       string  `json:"model"`
			Prompt      int     `json:"prompt_tokens"`
			ChunkTokens int     `json:"chunk_tokens"`
			ChunkBytes  uint64  `json:"chunk_bytes"`
			ComputeUs   float64 `json:"compute_per_chunk_us"`
			OneChunkUs  float64 `json:"one_chunk_us"`
			ExposedUs   float64 `json:"exposed_us"`
			BoundUs     float64 `json:"bound_us"`
			SerialUs    float64 `json:"after_prefill_us"`
		}
		var rows []row
		for _, pt := range sw.Points {
			rows = append(rows, row{sw.Model, sw.Prompt, pt.ChunkTokens, pt.ChunkBytes, us(pt.Compute), us(pt.OneChunk), us(pt.Exposed), us(pt.Bound), us(pt.Serial)})
		}
		return jsonLines(w, rows...)
	}
	tw := table(w)
	fmt.Fprintf(tw, "CHUNK TOKENS\tCHUNK BYTES\tCOMPUTE/CHUNK\tONE CHUNK µs\tPIPELINED EXPOSED µs\tBOUND µs\tAFTER PREFILL µs\tHIDDEN\t\n")
	for _, pt := range sw.Points {
		hidden := "none" // pipelined was exposed longer than after prefill
		if pt.Exposed <= pt.Serial && pt.Serial > 0 {
			hidden = fmt.Sprintf("%.0f%%", 100*(1-float64(pt.Exposed)/float64(pt.Serial)))
		}
		fmt.Fprintf(tw, "%d\t%s\t%v\t%s\t%s\t%s\t%s\t%s\t\n", pt.ChunkTokens, config.FormatSize(pt.ChunkBytes), pt.Compute,
			micros(pt.OneChunk), micros(pt.Exposed), micros(pt.Bound), micros(pt.Serial), hidden)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, tl := range res.Timelines {
		fmt.Fprintf(w, "timeline %s: %d chunks, READY %s ms after prefill began, %s ms after the last fence\n",
			tl.Mode, len(tl.Chunks), millis(tl.Ready), millis(tl.Exposed))
	}
	return nil
}

// ---- small ----

type smallScenario struct {
	tokens      []int
	requests    int
	concurrency int
	rounds      int
	rawBytes    string
	peakSpan    string
}

func newSmallScenario() *smallScenario {
	return &smallScenario{tokens: []int{128, 512}, requests: 32, concurrency: 4, rounds: 3, rawBytes: "256MiB",
		peakSpan: config.FormatSize(bench.PeakSpan)}
}

func (*smallScenario) name() string { return "small" }
func (*smallScenario) short() string {
	return "Small requests' bandwidth as a fraction of the raw peak of the same backend"
}
func (*smallScenario) long() string {
	return `small moves whole requests of --tokens tokens (KV already written: one chunk,
Receive → READY) between two engines in this process, with one request in
flight and with --concurrency, and in the same run measures the backend's
raw peak (the best of 1, 4 and 16 MiB single-segment batches, rotating
over --peak-span of distinct source and destination memory, as a request's
own pages are, so that the peak's bytes do not stay in a CPU cache; with
one endpoint, the peak of one request in flight, and with --concurrency
endpoints at once sharing the span, the peak of that many in flight), the
same peak cache-resident (every batch on one source and one destination,
as the peak was measured before --peak-span), and its raw bandwidth at
the request's size, alternating --rounds times; it reports medians, the
fraction of the peak of as many endpoints as requests in flight (OF PEAK;
with --concurrency in flight, the better of one and --concurrency
endpoints), of the cache-resident peak (OF CACHE
PEAK), of the raw bandwidth at the request's size (OF RAW: what the
engine costs) and of --concurrency raw endpoints at that size running at
once (OF RAW ×N: the backend's bound for that many requests in flight),
segments per request, latency and where one request's time goes (setup
until the op can leave, the data, the finish until READY).`
}
func (*smallScenario) example() string {
	return examples("the published anchor: 128- and 512-token Llama-3.1-8B requests, 16-token blocks", "kvxfer bench small --json",
		"32-token blocks on shared memory, 8 in flight", "kvxfer bench small --backend shm --tokens-per-block 32 --concurrency 8")
}
func (*smallScenario) keys() ([]string, map[string]string) {
	return []string{config.Model, config.TokensPerBlock, config.Workers, config.Backend, config.Timeout},
		map[string]string{config.TokensPerBlock: "16", config.Backend: "loopback", config.Timeout: "1m"}
}
func (sm *smallScenario) flags(f *pflag.FlagSet) {
	f.IntSliceVar(&sm.tokens, "tokens", sm.tokens, "request sizes in tokens")
	f.IntVar(&sm.requests, "requests", sm.requests, "requests per sample")
	f.IntVar(&sm.concurrency, "concurrency", sm.concurrency, "requests in flight in the concurrent samples")
	f.IntVar(&sm.rounds, "rounds", sm.rounds, "rounds of raw and engine samples (medians are reported)")
	f.StringVar(&sm.rawBytes, "raw-bytes", sm.rawBytes, "bytes each raw sample moves")
	f.StringVar(&sm.peakSpan, "peak-span", sm.peakSpan, "distinct memory the peak's batches rotate over, in the source and in the destination (beyond the CPU's caches)")
}
func (sm *smallScenario) steps() int                    { return bench.SmallSteps(sm.rounds, len(sm.tokens)) }
func (sm *smallScenario) check(s config.Settings) error { return engineBackend(s, "small") }
func (sm *smallScenario) sizedBy() (string, string) {
	return fmt.Sprintf("--tokens %s and --concurrency %d", joinInts(sm.tokens), sm.concurrency), "--tokens or --concurrency"
}
func (sm *smallScenario) run(ctx context.Context, s config.Settings, p bench.ProgressFunc, res *report.Results) error {
	tpb := s.TokensPerBlock
	if tpb == 0 {
		tpb = 16
	}
	for _, v := range []struct {
		flag string
		n    int
	}{{"requests", sm.requests}, {"concurrency", sm.concurrency}, {"rounds", sm.rounds}} {
		if v.n < 1 {
			return fmt.Errorf("--%s %d: want at least 1", v.flag, v.n)
		}
	}
	if err := checkRequests(sm.requests); err != nil {
		return err
	}
	if len(sm.tokens) == 0 {
		return fmt.Errorf("--tokens: no request size given")
	}
	for _, n := range sm.tokens {
		if n < 1 {
			return fmt.Errorf("--tokens %d: want at least 1", n)
		}
	}
	raw, err := config.ParseSize(sm.rawBytes)
	if err != nil {
		return fmt.Errorf("--raw-bytes: %w", err)
	}
	span, err := config.ParseSize(sm.peakSpan)
	if err != nil {
		return fmt.Errorf("--peak-span: %w", err)
	}
	r, err := bench.Small(ctx, bench.SmallConfig{Backend: s.Backend, Model: s.Model, TokensPerBlock: tpb, Tokens: sm.tokens,
		Requests: sm.requests, Concurrency: sm.concurrency, Workers: s.Workers, Rounds: sm.rounds, RawBytes: raw,
		PeakSpanBytes: span, Timeout: s.Timeout, Progress: p})
	if err != nil {
		return err
	}
	res.Small = &r
	return nil
}
func (*smallScenario) print(w io.Writer, res *report.Results, asJSON bool) error {
	r := res.Small
	if asJSON {
		return jsonLines(w, r.Sizes...)
	}
	fmt.Fprintf(w, "%s, %d tokens per block, %s backend, %d workers; raw peak over distinct memory: one endpoint %s GB/s (%s segments over %s: OF PEAK, 1 in flight), %d at once %s GB/s (%s segments over %s in all; OF PEAK, %d in flight: the better of the two); cache-resident %s GB/s (%s segments, one region: OF CACHE PEAK)\n",
		r.Model, r.TokensPerBlock, r.Backend, r.Workers, gb(r.PeakBytesPerSec), config.FormatSize(r.PeakSegmentBytes),
		config.FormatSize(uint64(r.PeakSlots)*r.PeakSegmentBytes), r.Concurrency, gb(r.ParallelPeakBytesPerSec), config.FormatSize(r.ParallelPeakSegmentBytes),
		config.FormatSize(uint64(r.ParallelPeakSlots*r.Concurrency)*r.ParallelPeakSegmentBytes), r.Concurrency,
		gb(r.CachePeakBytesPerSec), config.FormatSize(r.CachePeakSegmentBytes))
	tw := table(w)
	fmt.Fprintf(tw, "TOKENS\tBYTES\tSEGS/REQ\tGB/s %d IN FLIGHT\tOF PEAK\tOF CACHE PEAK\tOF RAW\tOF RAW ×%d\tGB/s 1 IN FLIGHT\tOF PEAK\tOF RAW\tRAW GB/s AT SIZE\tRAW ×%d\tP50 µs\tP99 µs\tSETUP µs\tDATA µs\tFINISH µs\tRAW COPY µs\t\n",
		r.Concurrency, r.Concurrency, r.Concurrency)
	for _, z := range r.Sizes {
		b := z.Breakdown
		fmt.Fprintf(tw, "%d\t%s\t%.1f\t%s\t%.0f%%\t%.0f%%\t%.2f\t%.2f\t%s\t%.0f%%\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", z.Tokens, config.FormatSize(z.RequestBytes),
			z.SegmentsPerRequest, gb(z.BytesPerSec), 100*z.FractionOfPeak, 100*z.FractionOfCachePeak, z.FractionOfRaw, z.FractionOfParallelRaw, gb(z.SerialBytesPerSec),
			100*z.SerialFractionOfPeak, z.SerialFractionOfRaw, gb(z.RawBytesPerSec), gb(z.ParallelRawBytesPerSec), micros(z.LatencyP50),
			micros(z.LatencyP99), micros(b.Setup), micros(b.Data), micros(b.Finish), micros(b.RawCopy))
	}
	return tw.Flush()
}

// checkRequests bounds a scenario's --requests as kvxfer ctx, gen and
// demo bound theirs (proc.MaxRequests): --requests 100000000 (a few zeros
// too many) was taken, and bench e2e and small laid out a result for every
// request before the first one ran, their memory growing for minutes
// towards the machine's.
func checkRequests(n int) error {
	if n > proc.MaxRequests {
		return fmt.Errorf("--requests %d: want at most %d (as kvxfer ctx, gen and demo): a scenario keeps every request's result until it ends", n, proc.MaxRequests)
	}
	return nil
}

// engineBackend checks that s.Backend is one a bench Pair runs, and
// s.TokensPerBlock one the model's layout takes, named as the user gave
// it (checkTokensPerBlock, as ctx and gen): kvcache named its own field,
// "bench small: kvcache: bad layout: TokensPerBlock = 100000000, must be
// ≤ 65536".
func engineBackend(s config.Settings, scenario string) error {
	if !slices.Contains(bench.Backends(), s.Backend) {
		return s.Invalid(config.Backend, "bench "+scenario+" runs "+strings.Join(bench.Backends(), " or "))
	}
	return checkTokensPerBlock(&s)
}

// joinInts is ns comma-separated, as a flag takes them.
func joinInts(ns []int) string {
	var b strings.Builder
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, n)
	}
	return b.String()
}

// ---- fragmented ----

type fragmentedScenario struct {
	tokens   int
	requests int
	rounds   int
	seed     uint64
}

func newFragmentedScenario() *fragmentedScenario {
	return &fragmentedScenario{tokens: 512, requests: 16, rounds: 3, seed: 1}
}

func (*fragmentedScenario) name() string { return "fragmented" }
func (*fragmentedScenario) short() string {
	return "Segments per request and bandwidth with shuffled block ids on both sides, against fresh pools"
}
func (*fragmentedScenario) long() string {
	return `fragmented moves --tokens-token requests one at a time between a pair of
fresh pools (block ids consecutive on both sides: whole runs coalesce into
one segment) and a pair whose pools were fragmented (every free list
shuffled, so ids are scattered on both sides), alternating --rounds times,
and reports the segments the context engine posted per request, bandwidth
and latency of each, and their ratio.`
}
func (*fragmentedScenario) example() string {
	return examples("", "kvxfer bench fragmented --tokens 2048 --tokens-per-block 16")
}
func (*fragmentedScenario) keys() ([]string, map[string]string) {
	return []string{config.Model, config.TokensPerBlock, config.Workers, config.Backend, config.Timeout},
		map[string]string{config.TokensPerBlock: "16", config.Backend: "loopback", config.Timeout: "1m"}
}
func (fr *fragmentedScenario) flags(f *pflag.FlagSet) {
	f.IntVar(&fr.tokens, "tokens", fr.tokens, "tokens per request")
	f.IntVar(&fr.requests, "requests", fr.requests, "requests per sample")
	f.IntVar(&fr.rounds, "rounds", fr.rounds, "rounds (medians are reported)")
	f.Uint64Var(&fr.seed, "seed", fr.seed, "seed of the shuffle")
}
func (fr *fragmentedScenario) steps() int                    { return 2 * fr.rounds }
func (fr *fragmentedScenario) check(s config.Settings) error { return engineBackend(s, "fragmented") }
func (fr *fragmentedScenario) sizedBy() (string, string) {
	return fmt.Sprintf("--tokens %d", fr.tokens), "--tokens"
}
func (fr *fragmentedScenario) run(ctx context.Context, s config.Settings, p bench.ProgressFunc, res *report.Results) error {
	for _, v := range []struct {
		flag string
		n    int
	}{{"tokens", fr.tokens}, {"requests", fr.requests}, {"rounds", fr.rounds}} {
		if v.n < 1 {
			return fmt.Errorf("--%s %d: want at least 1", v.flag, v.n)
		}
	}
	if err := checkRequests(fr.requests); err != nil {
		return err
	}
	tpb := s.TokensPerBlock
	if tpb == 0 {
		tpb = 16
	}
	r, err := bench.Fragmented(ctx, bench.FragmentedConfig{Backend: s.Backend, Model: s.Model, TokensPerBlock: tpb, Tokens: fr.tokens,
		Requests: fr.requests, Rounds: fr.rounds, Workers: s.Workers, Timeout: s.Timeout, Seed: fr.seed, Progress: p})
	if err != nil {
		return err
	}
	res.Fragmented = &r
	return nil
}
func (*fragmentedScenario) print(w io.Writer, res *report.Results, asJSON bool) error {
	r := res.Fragmented
	if asJSON {
		return jsonLines(w, r)
	}
	fmt.Fprintf(w, "%s, %d tokens per block, %d-token requests (%s), one in flight, %s backend\n", r.Model, r.TokensPerBlock,
		r.Tokens, config.FormatSize(r.RequestBytes), r.Backend)
	tw := table(w)
	fmt.Fprintf(tw, "POOLS\tSEGS/REQ\tGB/s\tP50 µs\t\n")
	fmt.Fprintf(tw, "contiguous\t%.1f\t%s\t%s\t\n", r.Contiguous.SegmentsPerRequest, gb(r.Contiguous.BytesPerSec), micros(r.Contiguous.LatencyP50))
	fmt.Fprintf(tw, "fragmented\t%.1f\t%s\t%s\t\n", r.Fragmented.SegmentsPerRequest, gb(r.Fragmented.BytesPerSec), micros(r.Fragmented.LatencyP50))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "fragmented / contiguous bandwidth: %.2f\n", r.Ratio)
	return nil
}

// ---- e2e ----

type e2eScenario struct {
	requests, minTokens, maxTokens, chunkTokens, concurrency int
	compute                                                  time.Duration
	seed                                                     uint64
}

func newE2EScenario() *e2eScenario {
	return &e2eScenario{requests: 16, minTokens: 512, maxTokens: 2048, chunkTokens: 256, concurrency: 4,
		compute: 10 * time.Millisecond, seed: 1}
}

func (*e2eScenario) name() string { return "e2e" }
func (*e2eScenario) short() string {
	return "Whole requests of a preset, pipelined: bytes/s and exposed latency p50/p99"
}
func (*e2eScenario) long() string {
	return `e2e moves --requests requests of the model, prompts spread over
[--min-tokens, --max-tokens], with chunked prefill (--chunk-tokens,
--compute per chunk) and --concurrency in flight, between two engines in
this process: pipelined, then (for comparison) transferring only after
prefill. It reports bytes/s over the batch's wall time and the exposed
latency (last fence → READY) p50 and p99 of each.`
}
func (*e2eScenario) example() string {
	return examples("", "kvxfer bench e2e --model Qwen3-8B --max-tokens 4096 --concurrency 2",
		"on shared memory", "kvxfer bench e2e --backend shm --json")
}
func (*e2eScenario) keys() ([]string, map[string]string) {
	return []string{config.Model, config.Pool, config.TokensPerBlock, config.Workers, config.Backend, config.Timeout},
		map[string]string{config.Backend: "loopback", config.Timeout: "1m"}
}

// defaultDocs say what e2e's settings left unset mean (addSettingFlags).
func (*e2eScenario) defaultDocs() map[string]string {
	return map[string]string{config.Pool: "sized to hold the scenario's requests", config.TokensPerBlock: presetBlockDoc}
}
func (e *e2eScenario) flags(f *pflag.FlagSet) {
	f.IntVar(&e.requests, "requests", e.requests, "number of requests")
	f.IntVar(&e.minTokens, "min-tokens", e.minTokens, "shortest prompt")
	f.IntVar(&e.maxTokens, "max-tokens", e.maxTokens, "longest prompt")
	f.IntVar(&e.chunkTokens, "chunk-tokens", e.chunkTokens, "prefill chunk size in tokens")
	f.DurationVar(&e.compute, "compute", e.compute, "simulated prefill compute per chunk")
	f.IntVar(&e.concurrency, "concurrency", e.concurrency, "requests in flight")
	f.Uint64Var(&e.seed, "seed", e.seed, "seed of the prompt-length shuffle")
}
func (*e2eScenario) steps() int { return 2 }
func (e *e2eScenario) sizedBy() (string, string) {
	return fmt.Sprintf("--max-tokens %d and --concurrency %d", e.maxTokens, e.concurrency), "--max-tokens or --concurrency (or a --pool that fits)"
}
func (e *e2eScenario) check(s config.Settings) error {
	if err := engineBackend(s, "e2e"); err != nil {
		return err
	}
	if err := poolHoldsABlock(s); err != nil {
		return err
	}
	return e.chunkFitsBlocks(s)
}

// chunkFitsBlocks refuses a --chunk-tokens that is not a multiple of the
// block size, naming both as demo does: kvcache named neither flag,
// "kvcache: misaligned chunk: chunk size 256 tokens is not a positive
// multiple of TokensPerBlock 3". An unknown model is named elsewhere.
func (e *e2eScenario) chunkFitsBlocks(s config.Settings) error {
	l, err := kvcache.Preset(s.Model)
	if err != nil {
		return nil
	}
	tpb, from := l.TokensPerBlock, l.Name+"'s preset"
	if s.TokensPerBlock > 0 {
		tpb, from = s.TokensPerBlock, settingName(s, config.TokensPerBlock)
	}
	if e.chunkTokens > 0 && e.chunkTokens%tpb != 0 {
		return fmt.Errorf("--chunk-tokens = %d: want a positive multiple of the block size, %d tokens (%s)", e.chunkTokens, tpb, from)
	}
	return nil
}

// poolHoldsABlock refuses a --pool (or its variable or YAML key) that
// holds no block of the model's layout, or more blocks than a pool may
// (messages.MaxBlocks), naming it as ctx and gen do: the engine refused
// it naming its own field ("kvxfer: bad config: PoolBytes = 1048576
// holds no block", "PoolBytes = 8589934592000 holds 2048000 blocks per
// layer group …: use a smaller pool or more TokensPerBlock"), the latter
// only once the scenarios before e2e had run. An unknown model or a bad
// --tokens-per-block is named elsewhere.
func poolHoldsABlock(s config.Settings) error {
	if !s.Set(config.Pool) || s.Pool == 0 {
		return nil
	}
	l, err := kvcache.Preset(s.Model)
	if err != nil {
		return nil
	}
	if s.TokensPerBlock > 0 {
		l = l.WithTokensPerBlock(s.TokensPerBlock)
	}
	if l.Validate() != nil {
		return nil
	}
	var perSet uint64
	for g := range l.Groups {
		perSet += uint64(l.BlockBytes(g))
	}
	if s.Pool < perSet {
		return s.Invalid(config.Pool, fmt.Sprintf("holds no block: one block of every layer group of %s is %d bytes", l.Name, perSet))
	}
	// Past the largest host region the region is the mistake (poolHint).
	if n := s.Pool / perSet; n > messages.MaxBlocks && s.Pool <= kvcache.MaxHostRegion {
		return s.Invalid(config.Pool, fmt.Sprintf("holds %d blocks per layer group (one block of every group of %s is %d bytes), more than the %d blocks a pool may hold: use a smaller one, or a larger --tokens-per-block",
			n, l.Name, perSet, messages.MaxBlocks))
	}
	return nil
}
func (e *e2eScenario) run(ctx context.Context, s config.Settings, p bench.ProgressFunc, res *report.Results) error {
	if err := e.validate(); err != nil {
		return err
	}
	r, err := bench.E2E(ctx, bench.E2EConfig{Backend: s.Backend, Model: s.Model, TokensPerBlock: s.TokensPerBlock, Requests: e.requests,
		MinTokens: e.minTokens, MaxTokens: e.maxTokens, ChunkTokens: e.chunkTokens, Compute: e.compute, Concurrency: e.concurrency,
		Workers: s.Workers, PoolBytes: s.Pool, Timeout: s.Timeout, Seed: e.seed, Progress: p})
	if err != nil {
		return err
	}
	res.E2E = &r
	return nil
}

// validate names the first bad e2e flag and its value.
func (e *e2eScenario) validate() error {
	for _, v := range []struct {
		flag string
		n    int
	}{{"requests", e.requests}, {"min-tokens", e.minTokens}, {"chunk-tokens", e.chunkTokens}, {"concurrency", e.concurrency}} {
		if v.n < 1 {
			return fmt.Errorf("--%s %d: want at least 1", v.flag, v.n)
		}
	}
	if err := checkRequests(e.requests); err != nil {
		return err
	}
	switch {
	case e.maxTokens < e.minTokens:
		return fmt.Errorf("--max-tokens %d: want at least --min-tokens (%d)", e.maxTokens, e.minTokens)
	case e.compute < 0:
		return fmt.Errorf("--compute %v: want zero or more", e.compute)
	}
	return nil
}

func (*e2eScenario) print(w io.Writer, res *report.Results, asJSON bool) error {
	r := res.E2E
	if asJSON {
		type row struct {
			Mode        string  `json:"mode"`
			Model       string  `json:"model"`
			Backend     string  `json:"backend"`
			Requests    int     `json:"requests"`
			Bytes       uint64  `json:"bytes"`
			WallSec     float64 `json:"wall_s"`
			BytesPerSec float64 `json:"bytes_per_sec"`
			ExposedP50  float64 `json:"exposed_p50_us"`
			ExposedP99  float64 `json:"exposed_p99_us"`
		}
		var rows []row
		for _, m := range r.Modes {
			rows = append(rows, row{m.Mode, r.Model, r.Backend, r.Requests, m.Bytes, m.Wall.Seconds(), m.BytesPerSec, us(m.ExposedP50), us(m.ExposedP99)})
		}
		return jsonLines(w, rows...)
	}
	fmt.Fprintf(w, "%d %s requests of %d..%d tokens, chunks of %d tokens, %v compute per chunk, %d in flight, %s backend\n",
		r.Requests, r.Model, r.MinTokens, r.MaxTokens, r.ChunkTokens, r.Compute, r.Concurrency, r.Backend)
	tw := table(w)
	fmt.Fprintf(tw, "MODE\tGiB\tWALL s\tGB/s\tEXPOSED P50 ms\tEXPOSED P99 ms\t\n")
	for _, m := range r.Modes {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%s\t%s\t%s\t\n", m.Mode, float64(m.Bytes)/(1<<30), m.Wall.Seconds(), gb(m.BytesPerSec),
			millis(m.ExposedP50), millis(m.ExposedP99))
	}
	return tw.Flush()
}
