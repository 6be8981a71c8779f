package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

// ProgressFunc is told each time a scenario finishes a step: done of total
// (total is the same at every call of one scenario), and what the step was.
type ProgressFunc func(done, total int, what string)

func (f ProgressFunc) step(done *int, total int, what string) {
	*done++
	if f != nil {
		f(*done, total, what)
	}
}

// SmallConfig configures Small.
type SmallConfig struct {
	// Backend is "loopback" (default) or "shm".
	Backend string
	// Model is a preset (default Llama-3.1-8B); TokensPerBlock overrides
	// its block size (default 16).
	Model          string
	TokensPerBlock int
	// Tokens are the request sizes (default 128 and 512).
	Tokens []int
	// Requests per sample (default 32); Concurrency of the concurrent
	// samples (default 4); Workers per engine (default 4).
	Requests    int
	Concurrency int
	Workers     int
	// Rounds: raw peak, raw at each size and the engine at each size
	// alternate this many times (default 3); medians are reported.
	Rounds int
	// RawBytes is what each raw sample moves (default 256 MiB).
	RawBytes uint64
	// PeakSpanBytes is the distinct memory the peak's operations rotate
	// over, in the source and in the destination (default PeakSpan).
	PeakSpanBytes uint64
	Timeout       time.Duration
	Progress      ProgressFunc
}

func (c *SmallConfig) defaults() {
	if c.Backend == "" {
		c.Backend = "loopback"
	}
	if c.Model == "" {
		c.Model = "Llama-3.1-8B"
	}
	if c.TokensPerBlock == 0 {
		c.TokensPerBlock = 16
	}
	if len(c.Tokens) == 0 {
		c.Tokens = []int{128, 512}
	}
	if c.Requests == 0 {
		c.Requests = 32
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Rounds == 0 {
		c.Rounds = 3
	}
	if c.PeakSpanBytes == 0 {
		c.PeakSpanBytes = PeakSpan
	}
}

// PeakSizes are the segment sizes whose best raw bandwidth is the peak.
var PeakSizes = []uint64{1 << 20, 4 << 20, 16 << 20}

// PeakSpan is how much distinct memory the peak's operations rotate over
// by default, in the source and again in the destination (rdmabench
// Shape.Slots: 256 slots of 1 MiB, 16 of 16 MiB): a request's bytes are
// its own pages, never the last request's, so a peak whose bytes stay in a
// CPU cache is not one the engine could reach. On a 2-vCPU VM whose lscpu
// reports a 480 MiB L3, loopback at 1 MiB ran at 29 GB/s on one region,
// 13 GB/s over 16 MiB and 6.3-6.5 GB/s over 64 to 512 MiB (rough, one run):
// the cache that matters ends well below 64 MiB there. 256 MiB a side is
// four times that, four times a 512-token Llama-3.1-8B request (64 MiB),
// and 512 MiB touched per rotation, more than that whole L3. One rig of it
// holds three buffers of the span (768 MiB).
const PeakSpan = 256 << 20

// SmallResult compares whole small requests through the engine with the
// raw peak of the same backend, measured in the same run.
//
// Before PeakBytesPerSec was measured over PeakSpanBytes of distinct
// memory, it was what CachePeakBytesPerSec is now: one source and one
// destination of the segment's size, reused by every operation, which at
// 1 MiB stay in the CPU's cache (27.7 GB/s where 64 MiB of distinct pages
// copied at 6.5-7 GB/s), so a request's fraction of it read about half of
// what the backend allows.
type SmallResult struct {
	Backend        string `json:"backend"`
	Model          string `json:"model"`
	TokensPerBlock int    `json:"tokens_per_block"`
	Concurrency    int    `json:"concurrency"`
	Workers        int    `json:"workers"`
	Rounds         int    `json:"rounds"`
	// PeakBytesPerSec is the best, over PeakSizes, of the median raw Post
	// bandwidth of one segment per batch (rdmabench, one endpoint, 256
	// batches in flight), the batches rotating over PeakSpanBytes of
	// distinct source and destination memory: the backend's rate over
	// memory that does not stay in a cache. PeakSegmentBytes is the size
	// that reached it, PeakSlots how many slots of it its rig rotated over
	// (rdmabench.SlotsFor: at least PeakSpanBytes).
	PeakBytesPerSec  float64 `json:"peak_bytes_per_sec"`
	PeakSegmentBytes uint64  `json:"peak_segment_bytes"`
	PeakSlots        int     `json:"peak_slots"`
	PeakSpanBytes    uint64  `json:"peak_span_bytes"`
	// CachePeakBytesPerSec is the same with every batch reusing one source
	// and one destination of the segment's size (cache-resident where
	// they fit a cache: the peak before PeakSpanBytes);
	// CachePeakSegmentBytes is the size that reached it.
	CachePeakBytesPerSec  float64 `json:"cache_peak_bytes_per_sec"`
	CachePeakSegmentBytes uint64  `json:"cache_peak_segment_bytes"`
	// ParallelPeakBytesPerSec is the best, over PeakSizes, of Concurrency
	// such rigs running at once, an endpoint each, each rotating over
	// PeakSpanBytes/Concurrency (PeakSpanBytes together):
	// the backend's peak for Concurrency requests in flight, where its
	// copies run on several cores. ParallelPeakSegmentBytes is the size
	// that reached it. The concurrent samples' FractionOfPeak is over the
	// higher of it and PeakBytesPerSec (ConcurrentPeakBytesPerSec), the
	// serial samples' over PeakBytesPerSec: each against the peak of the
	// same number of endpoints.
	// ParallelPeakSlots is how many slots each of those rigs rotated over.
	ParallelPeakBytesPerSec  float64     `json:"parallel_peak_bytes_per_sec"`
	ParallelPeakSegmentBytes uint64      `json:"parallel_peak_segment_bytes"`
	ParallelPeakSlots        int         `json:"parallel_peak_slots"`
	Sizes                    []SmallSize `json:"sizes"`
}

// ConcurrentPeakBytesPerSec is the peak the concurrent samples are
// measured against: the higher of one endpoint's and Concurrency
// endpoints' at once.
func (r SmallResult) ConcurrentPeakBytesPerSec() float64 {
	return max(r.PeakBytesPerSec, r.ParallelPeakBytesPerSec)
}

// SmallSize is one request size's figures (medians over the rounds).
type SmallSize struct {
	Tokens       int    `json:"tokens"`
	RequestBytes uint64 `json:"request_bytes"`
	// SegmentsPerRequest and BatchesPerRequest are what the context engine
	// posted, per request.
	SegmentsPerRequest float64 `json:"segments_per_request"`
	BatchesPerRequest  float64 `json:"batches_per_request"`
	// BytesPerSec is Requests requests' bytes over their wall time with
	// Concurrency in flight; FractionOfPeak is it over
	// ConcurrentPeakBytesPerSec (SmallResult.ConcurrentPeakBytesPerSec:
	// the better of one endpoint and Concurrency endpoints at once, over
	// PeakSpanBytes of distinct memory). PeakBytesPerSec is one
	// endpoint's (SmallResult.PeakBytesPerSec).
	BytesPerSec               float64 `json:"bytes_per_sec"`
	PeakBytesPerSec           float64 `json:"peak_bytes_per_sec"`
	ConcurrentPeakBytesPerSec float64 `json:"concurrent_peak_bytes_per_sec"`
	PeakSpanBytes             uint64  `json:"peak_span_bytes"`
	FractionOfPeak            float64 `json:"fraction_of_peak"`
	// CachePeakBytesPerSec is SmallResult.CachePeakBytesPerSec, the
	// cache-resident peak, and FractionOfCachePeak BytesPerSec over it: the
	// fraction of peak as figures before PeakSpanBytes reported it.
	CachePeakBytesPerSec float64 `json:"cache_peak_bytes_per_sec"`
	FractionOfCachePeak  float64 `json:"fraction_of_cache_peak"`
	// Serial*: the same with one request in flight, over PeakBytesPerSec.
	SerialBytesPerSec    float64 `json:"serial_bytes_per_sec"`
	SerialFractionOfPeak float64 `json:"serial_fraction_of_peak"`
	// RawBytesPerSec is the raw backend with batches of one segment of
	// RequestBytes: the bound for one request's data. FractionOfRaw and
	// SerialFractionOfRaw are BytesPerSec and SerialBytesPerSec over it:
	// what the engine costs at the request's size.
	RawBytesPerSec      float64 `json:"raw_bytes_per_sec"`
	FractionOfRaw       float64 `json:"fraction_of_raw"`
	SerialFractionOfRaw float64 `json:"serial_fraction_of_raw"`
	// ParallelRawBytesPerSec is Concurrency raw rigs of one RequestBytes
	// segment per batch, an endpoint each, running at once: the backend's
	// bound for Concurrency requests of this size in flight (on a machine
	// whose memory bus, not one core's copy, bounds it, more than
	// RawBytesPerSec). FractionOfParallelRaw is BytesPerSec over it.
	ParallelRawBytesPerSec float64 `json:"parallel_raw_bytes_per_sec"`
	FractionOfParallelRaw  float64 `json:"fraction_of_parallel_raw"`
	// LatencyP50/P99: Receive → READY, one request in flight.
	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	// ConcurrentLatencyP50: the same with Concurrency in flight.
	ConcurrentLatencyP50 time.Duration `json:"concurrent_latency_p50_ns"`
	// Breakdown splits the serial latency (medians).
	Breakdown Breakdown `json:"breakdown"`
}

// Breakdown splits one request's Receive → READY latency at the context
// session's events (Timeline): Setup until its op could leave (RequestData
// reached the session and the chunk's fence fired), Data until the session
// stepped on the op's completion (worker hop, post, the backend's copy, the
// completion's hop back), Finish until READY reached the caller (flush,
// Result frame, the generation session, the handle). RawCopy is the
// request's bytes at the raw backend's rate at that size: what Data would be
// with no engine around the copy.
type Breakdown struct {
	Setup   time.Duration `json:"setup_ns"`
	Data    time.Duration `json:"data_ns"`
	Finish  time.Duration `json:"finish_ns"`
	RawCopy time.Duration `json:"raw_copy_ns"`
}

// Small measures whole requests of cfg.Tokens tokens (Receive → READY, KV
// already written) against the raw peak of the same backend, over
// distinct memory and cache-resident.
func Small(ctx context.Context, cfg SmallConfig) (SmallResult, error) {
	cfg.defaults()
	l, err := kvcache.Preset(cfg.Model)
	if err != nil {
		return SmallResult{}, err
	}
	l = l.WithTokensPerBlock(cfg.TokensPerBlock)
	if err := l.Validate(); err != nil {
		return SmallResult{}, err
	}
	res := SmallResult{Backend: cfg.Backend, Model: l.Name, TokensPerBlock: cfg.TokensPerBlock,
		Concurrency: cfg.Concurrency, Workers: cfg.Workers, Rounds: cfg.Rounds, PeakSpanBytes: cfg.PeakSpanBytes}
	var maxBytes uint64
	for _, n := range cfg.Tokens {
		if n < 1 {
			return res, fmt.Errorf("bench small: request of %d tokens", n)
		}
		maxBytes = max(maxBytes, RequestBytes(l, n))
	}
	// Room for every request in flight, and two more being freed.
	pool := uint64(cfg.Concurrency+2)*(maxBytes+uint64(l.BlockBytes(0))) + 1<<20
	p, err := NewPair(ctx, PairConfig{Backend: cfg.Backend, Layout: l, PoolBytes: pool, Workers: cfg.Workers, Timeout: cfg.Timeout, Record: true})
	if err != nil {
		return res, err
	}
	defer func() { _ = p.Close(ctx) }()

	type samples struct {
		raw, parRaw, serial, conc, segs, batches []float64
		lat, concLat                             []time.Duration
		setup, data, finish                      []time.Duration
	}
	per := make([]samples, len(cfg.Tokens))
	peak, cachePeak, parPeak := make([][]float64, len(PeakSizes)), make([][]float64, len(PeakSizes)), make([][]float64, len(PeakSizes))
	peakSlots, parSlots := make([]int, len(PeakSizes)), make([]int, len(PeakSizes))
	total := SmallSteps(cfg.Rounds, len(cfg.Tokens))
	done := 0
	// Warm up: touch the pools and start every goroutine.
	for i, n := range cfg.Tokens {
		if _, err := sample(ctx, p, fmt.Sprintf("warm-%d", i), n, cfg.Concurrency, 2*cfg.Concurrency+2); err != nil {
			return res, err
		}
	}
	for r := range cfg.Rounds {
		for i, size := range PeakSizes {
			s := rdmabench.Shape{SegmentBytes: size, Segments: 1}
			s.Slots = rdmabench.SlotsFor(s, cfg.PeakSpanBytes)
			m, err := rdmabench.Measure(cfg.Backend, s, rdmabench.Config{Rounds: 1, MinBytes: cfg.RawBytes})
			if err != nil {
				return res, err
			}
			peak[i], peakSlots[i] = append(peak[i], m.BytesPerSec), max(1, m.Slots)
			cfg.Progress.step(&done, total, fmt.Sprintf("raw %s over %s", config.FormatSize(size), config.FormatSize(s.SpanBytes())))

			s.Slots = 1
			m, err = rdmabench.Measure(cfg.Backend, s, rdmabench.Config{Rounds: 1, MinBytes: cfg.RawBytes})
			if err != nil {
				return res, err
			}
			cachePeak[i] = append(cachePeak[i], m.BytesPerSec)
			cfg.Progress.step(&done, total, fmt.Sprintf("raw %s, one region", config.FormatSize(size)))

			ps := rdmabench.Shape{SegmentBytes: size, Segments: 1}
			ps.Slots = rdmabench.SlotsFor(ps, cfg.PeakSpanBytes/uint64(cfg.Concurrency))
			pr, err := rawParallel(cfg.Backend, ps, cfg.Concurrency, cfg.RawBytes)
			if err != nil {
				return res, err
			}
			parPeak[i], parSlots[i] = append(parPeak[i], pr), ps.Slots
			cfg.Progress.step(&done, total, fmt.Sprintf("raw %s over %s, %d at once", config.FormatSize(size), config.FormatSize(cfg.PeakSpanBytes), cfg.Concurrency))
		}
		for i, n := range cfg.Tokens {
			b := RequestBytes(l, n)
			m, err := rdmabench.Measure(cfg.Backend, rdmabench.Shape{SegmentBytes: b, Segments: 1}, rdmabench.Config{Rounds: 1, MinBytes: cfg.RawBytes})
			if err != nil {
				return res, err
			}
			per[i].raw = append(per[i].raw, m.BytesPerSec)
			cfg.Progress.step(&done, total, fmt.Sprintf("raw %s", config.FormatSize(b)))

			pr, err := rawParallel(cfg.Backend, rdmabench.Shape{SegmentBytes: b, Segments: 1}, cfg.Concurrency, cfg.RawBytes)
			if err != nil {
				return res, err
			}
			per[i].parRaw = append(per[i].parRaw, pr)
			cfg.Progress.step(&done, total, fmt.Sprintf("raw %s, %d at once", config.FormatSize(b), cfg.Concurrency))

			s, err := sample(ctx, p, fmt.Sprintf("s%d-%d", r, i), n, 1, max(cfg.Requests/2, 1))
			if err != nil {
				return res, err
			}
			per[i].serial = append(per[i].serial, s.bytesPerSec)
			per[i].lat = append(per[i].lat, s.lat...)
			for _, rr := range s.results {
				if tl, ok := p.Timeline().Request(rr.ID); ok {
					if su, d, f, ok := split(rr, tl); ok {
						per[i].setup = append(per[i].setup, su)
						per[i].data = append(per[i].data, d)
						per[i].finish = append(per[i].finish, f)
					}
				}
			}
			cfg.Progress.step(&done, total, fmt.Sprintf("%d tokens, 1 in flight", n))

			s, err = sample(ctx, p, fmt.Sprintf("c%d-%d", r, i), n, cfg.Concurrency, cfg.Requests)
			if err != nil {
				return res, err
			}
			per[i].conc = append(per[i].conc, s.bytesPerSec)
			per[i].concLat = append(per[i].concLat, s.lat...)
			per[i].segs = append(per[i].segs, s.segments)
			per[i].batches = append(per[i].batches, s.batches)
			cfg.Progress.step(&done, total, fmt.Sprintf("%d tokens, %d in flight", n, cfg.Concurrency))
		}
	}
	for i, size := range PeakSizes {
		if m := rdmabench.Median(peak[i]); m > res.PeakBytesPerSec {
			res.PeakBytesPerSec, res.PeakSegmentBytes, res.PeakSlots = m, size, peakSlots[i]
		}
		if m := rdmabench.Median(cachePeak[i]); m > res.CachePeakBytesPerSec {
			res.CachePeakBytesPerSec, res.CachePeakSegmentBytes = m, size
		}
		if m := rdmabench.Median(parPeak[i]); m > res.ParallelPeakBytesPerSec {
			res.ParallelPeakBytesPerSec, res.ParallelPeakSegmentBytes, res.ParallelPeakSlots = m, size, parSlots[i]
		}
	}
	for i, n := range cfg.Tokens {
		s := per[i]
		sz := SmallSize{Tokens: n, RequestBytes: RequestBytes(l, n), SegmentsPerRequest: rdmabench.Median(s.segs),
			BatchesPerRequest: rdmabench.Median(s.batches), BytesPerSec: rdmabench.Median(s.conc), PeakBytesPerSec: res.PeakBytesPerSec,
			ConcurrentPeakBytesPerSec: res.ConcurrentPeakBytesPerSec(),
			PeakSpanBytes:             res.PeakSpanBytes, CachePeakBytesPerSec: res.CachePeakBytesPerSec,
			SerialBytesPerSec: rdmabench.Median(s.serial), RawBytesPerSec: rdmabench.Median(s.raw), ParallelRawBytesPerSec: rdmabench.Median(s.parRaw),
			LatencyP50: quantile(s.lat, 0.5), LatencyP99: quantile(s.lat, 0.99), ConcurrentLatencyP50: quantile(s.concLat, 0.5)}
		sz.Breakdown = Breakdown{Setup: quantile(s.setup, 0.5), Data: quantile(s.data, 0.5), Finish: quantile(s.finish, 0.5),
			RawCopy: time.Duration(float64(sz.RequestBytes) / sz.RawBytesPerSec * 1e9)}
		sz.FractionOfPeak = sz.BytesPerSec / sz.ConcurrentPeakBytesPerSec
		sz.SerialFractionOfPeak = sz.SerialBytesPerSec / res.PeakBytesPerSec
		sz.FractionOfCachePeak = sz.BytesPerSec / res.CachePeakBytesPerSec
		sz.FractionOfRaw = sz.BytesPerSec / sz.RawBytesPerSec
		sz.SerialFractionOfRaw = sz.SerialBytesPerSec / sz.RawBytesPerSec
		sz.FractionOfParallelRaw = sz.BytesPerSec / sz.ParallelRawBytesPerSec
		res.Sizes = append(res.Sizes, sz)
	}
	return res, nil
}

// SmallSteps is how many progress steps Small reports for rounds rounds
// of tokens request sizes.
func SmallSteps(rounds, tokens int) int { return rounds * (3*len(PeakSizes) + 4*tokens) }

// rawParallel runs n raw rigs of shape s at once, an endpoint each, each
// moving at least minBytes after a warm-up, and returns their bytes over
// the wall time from their common start to the last one's end. Every
// rig's bytes are checked.
func rawParallel(backend string, s rdmabench.Shape, n int, minBytes uint64) (_ float64, err error) {
	rigs := make([]*rdmabench.Rig, 0, n)
	defer func() {
		for _, r := range rigs {
			if cerr := r.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}
	}()
	for range n {
		r, err := rdmabench.NewRig(backend, s)
		if err != nil {
			return 0, err
		}
		rigs = append(rigs, r)
	}
	ops := int(max(1, (minBytes+s.Bytes()-1)/s.Bytes()))
	for _, r := range rigs {
		if err := r.Run(min(ops, r.Window())); err != nil { // fault the pages in, start the goroutines
			return 0, fmt.Errorf("bench small: raw warm-up: %w", err)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range rigs {
		wg.Go(func() { errs[i] = r.Run(ops) })
	}
	wg.Wait()
	d := time.Since(start)
	for i, r := range rigs {
		if errs[i] == nil {
			errs[i] = r.Verify()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("bench small: %d raw rigs at once: %w", n, err)
	}
	return float64(n*ops) * float64(s.Bytes()) / d.Seconds(), nil
}

// split cuts a one-chunk request's latency at its session's events.
func split(r RequestResult, tl RequestTimeline) (setup, data, finish time.Duration, ok bool) {
	if len(tl.Chunks) == 0 || tl.PeerRequest.IsZero() {
		return 0, 0, 0, false
	}
	c := tl.Chunks[len(tl.Chunks)-1]
	if c.Fenced.IsZero() || c.Done.IsZero() {
		return 0, 0, 0, false
	}
	leave := tl.PeerRequest
	if c.Fenced.After(leave) {
		leave = c.Fenced
	}
	return leave.Sub(r.Start), c.Done.Sub(leave), r.Ready.Sub(c.Done), true
}

// sampleResult is one batch of requests' figures.
type sampleResult struct {
	bytesPerSec       float64
	segments, batches float64 // per request
	lat               []time.Duration
	results           []RequestResult
}

// sample moves n requests of tokens tokens (one chunk, KV written) with
// conc in flight and measures their aggregate rate.
func sample(ctx context.Context, p *Pair, prefix string, tokens, conc, n int) (sampleResult, error) {
	return sampleSpecs(ctx, p, conc, n, func(i int) RequestSpec {
		return RequestSpec{ID: fmt.Sprintf("%s-%d", prefix, i), Tokens: tokens}
	})
}

func sampleSpecs(ctx context.Context, p *Pair, conc, n int, spec func(i int) RequestSpec) (sampleResult, error) {
	b0, s0, _ := p.Posts()
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		first   error
		bytes   uint64
		results = make([]RequestResult, n)
	)
	sem := make(chan struct{}, conc)
	t0 := time.Now()
	issued := 0
	for i := range n {
		// No request after ctx ended (an interrupt) or one failed: the
		// rest would fail one by one, and a long batch went on issuing
		// them for minutes after Ctrl-C.
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		mu.Lock()
		stop := first != nil || ctx.Err() != nil
		mu.Unlock()
		if stop {
			break
		}
		issued++
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			r, err := p.Run(ctx, spec(i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			bytes += r.Bytes
			results[i] = r
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	if first != nil {
		return sampleResult{}, first
	}
	if issued < n {
		return sampleResult{}, fmt.Errorf("stopped after %d of %d requests: %w", issued, n, context.Cause(ctx))
	}
	b1, s1, _ := p.Posts()
	out := sampleResult{bytesPerSec: float64(bytes) / el.Seconds(), results: results,
		segments: float64(s1-s0) / float64(n), batches: float64(b1-b0) / float64(n)}
	for _, r := range results {
		out.lat = append(out.lat, r.Latency())
	}
	return out, nil
}

// quantile is the q-quantile (nearest rank) of ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
