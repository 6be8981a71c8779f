// Package bench holds kvxfer's engine-level benchmarks, shared by
// testing.B benchmarks and `kvxfer bench`.
package bench

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// tinyLayout makes every chunk a 2-byte write: what is measured is the
// engine's path, not the copy.
func tinyLayout() kvcache.Layout {
	return kvcache.Layout{Name: "tiny", Layers: 1, KVHeads: 1, HeadDim: 1, DTypeBytes: 1, TokensPerBlock: 1,
		Groups: kvcache.FullAttention(1)}
}

// opRecorder watches completions of one request's ops.
type opRecorder struct {
	mu   sync.Mutex
	done map[int]time.Time
	ch   chan int
}

func (r *opRecorder) Record(_ string, msg any, at time.Time) {
	m, ok := msg.(actors.TxCompleted)
	if !ok {
		return
	}
	r.mu.Lock()
	r.done[m.Op.Seq] = at
	r.mu.Unlock()
	if r.ch != nil {
		r.ch <- m.Op.Seq
	}
}

// OverheadResult is the per-chunk engine overhead with ~0-byte writes.
type OverheadResult struct {
	Chunks       int
	P50, P99     time.Duration // chunk handed over → its op completed, one chunk in flight
	OpsPerSec    float64       // chunks per second with every chunk queued at once
	Workers      int
	ThroughputNs float64 // ns per chunk-op at saturation
}

type tinyPair struct {
	ctx, gen *kvxfer.Engine
	rec      *opRecorder
}

func startTiny(ctx context.Context, workers, blocks int, rec *opRecorder) (*tinyPair, error) {
	l := tinyLayout()
	link := control.NewMemLink()
	ce, err := kvxfer.Start(ctx, kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: uint64(blocks) * 2,
		Workers: workers, Link: link, Recorder: rec, TransferTimeout: 10 * time.Minute})
	if err != nil {
		return nil, err
	}
	ge, err := kvxfer.Start(ctx, kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: uint64(blocks) * 2,
		Workers: workers, Link: link, TransferTimeout: 10 * time.Minute})
	if err != nil {
		_ = ce.Close(ctx)
		return nil, err
	}
	return &tinyPair{ctx: ce, gen: ge, rec: rec}, nil
}

func (p *tinyPair) close(ctx context.Context) error {
	return errorsJoin(p.ctx.Close(ctx), p.gen.Close(ctx))
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// runTiny sends one request of n one-token chunks. With paced set, each
// chunk waits for the previous op to complete.
func runTiny(ctx context.Context, p *tinyPair, id string, n int, paced bool) ([]time.Duration, time.Duration, error) {
	src, err := p.ctx.Pools().Alloc([]int{n})
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = p.ctx.Pools().Free(src) }()
	rx, err := p.gen.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: n, Context: "ctx"})
	if err != nil {
		return nil, 0, err
	}
	tx, err := p.ctx.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: n})
	if err != nil {
		return nil, 0, err
	}
	sent := make([]time.Time, n)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		c := kvcache.Chunk{Start: i, End: i + 1, FirstBlock: i, Last: i == n-1}
		sent[i] = time.Now()
		if err := tx.Chunk(c, []kvcache.BlockRun{{First: i, IDs: src[0][i : i+1]}}, nil); err != nil {
			return nil, 0, err
		}
		if paced {
			select {
			case <-p.rec.ch:
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
		}
	}
	to := <-tx.Done()
	elapsed := time.Since(t0)
	ro := <-rx.Done()
	if !to.OK || !ro.OK {
		return nil, 0, fmt.Errorf("bench request %s: tx %s %v, rx %s %v", id, to.Status, to.Err, ro.Status, ro.Err)
	}
	if err := p.gen.FreeBlocks(ro.Blocks); err != nil {
		return nil, 0, err
	}
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		if at, ok := p.rec.done[i]; ok {
			lat = append(lat, at.Sub(sent[i]))
		}
	}
	p.rec.done = map[int]time.Time{}
	return lat, elapsed, nil
}

// ChunkOverhead measures the per-chunk engine path: latency with one chunk
// in flight, and chunk-ops/s with n chunks queued at once.
func ChunkOverhead(ctx context.Context, n, workers int) (OverheadResult, error) {
	rec := &opRecorder{done: map[int]time.Time{}}
	p, err := startTiny(ctx, workers, 2*n+16, rec)
	if err != nil {
		return OverheadResult{}, err
	}
	defer func() { _ = p.close(ctx) }()
	// Saturated: every chunk queued at once.
	_, elapsed, err := runTiny(ctx, p, "sat", n, false)
	if err != nil {
		return OverheadResult{}, err
	}
	// Paced: one chunk in flight at a time.
	rec.ch = make(chan int, 1)
	lat, _, err := runTiny(ctx, p, "paced", n, true)
	if err != nil {
		return OverheadResult{}, err
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	r := OverheadResult{Chunks: n, Workers: workers, OpsPerSec: float64(n) / elapsed.Seconds(),
		ThroughputNs: float64(elapsed.Nanoseconds()) / float64(n)}
	if len(lat) > 0 {
		r.P50 = lat[len(lat)/2]
		r.P99 = lat[len(lat)*99/100]
	}
	return r, nil
}

// RequestOverheadResult is the engine's whole-request path with a 2-byte
// request: what every request pays on top of moving its bytes.
type RequestOverheadResult struct {
	Requests int `json:"requests"`
	Workers  int `json:"workers"`
	// P50 and P99 of Receive → READY, one request in flight.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// PerSec is requests per second one at a time (1 / mean latency).
	PerSec float64 `json:"per_sec"`
	// Breakdown: medians of the setup, data and finish phases.
	Breakdown Breakdown `json:"breakdown"`
	// Allocs is the heap allocations per request in the timed sample,
	// both engines and the caller together (one process): runtime's
	// Mallocs over the sample, divided by its requests.
	Allocs float64 `json:"allocs_per_request"`
	// BytesAlloc is the heap bytes allocated per request, and GCs the
	// collections that ran during the sample (both from runtime.MemStats).
	BytesAlloc float64 `json:"bytes_per_request"`
	GCs        uint32  `json:"gcs"`
}

// RequestOverhead moves n one-token, 2-byte requests one at a time
// between a pair on loopback and reports their latency and its phases.
func RequestOverhead(ctx context.Context, n, workers int) (RequestOverheadResult, error) {
	l := tinyLayout()
	p, err := NewPair(ctx, PairConfig{Layout: l, PoolBytes: 64, Workers: workers, Timeout: time.Minute, Record: true})
	if err != nil {
		return RequestOverheadResult{}, err
	}
	defer func() { _ = p.Close(ctx) }()
	if _, err := sample(ctx, p, "warm", 1, 1, 16); err != nil {
		return RequestOverheadResult{}, err
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	s, err := sample(ctx, p, "req", 1, 1, n)
	if err != nil {
		return RequestOverheadResult{}, err
	}
	el := time.Since(t0)
	runtime.ReadMemStats(&m1)
	r := RequestOverheadResult{Requests: n, Workers: workers, P50: quantile(s.lat, 0.5), P99: quantile(s.lat, 0.99),
		PerSec: float64(n) / el.Seconds(), Allocs: float64(m1.Mallocs-m0.Mallocs) / float64(n),
		BytesAlloc: float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n), GCs: m1.NumGC - m0.NumGC}
	var setup, data, finish []time.Duration
	for _, rr := range s.results {
		if tl, ok := p.Timeline().Request(rr.ID); ok {
			if su, d, f, ok := split(rr, tl); ok {
				setup, data, finish = append(setup, su), append(data, d), append(finish, f)
			}
		}
	}
	r.Breakdown = Breakdown{Setup: quantile(setup, 0.5), Data: quantile(data, 0.5), Finish: quantile(finish, 0.5)}
	return r, nil
}
