package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// Backends are the backends a Pair runs on.
func Backends() []string { return []string{loopback.Backend, shm.Backend} }

// PairConfig configures a Pair.
type PairConfig struct {
	// Backend is "loopback" (default) or "shm" (the generation pool is a
	// shared-memory file, as in a two-process deployment).
	Backend string
	Layout  kvcache.Layout
	// PoolBytes is each engine's pool.
	PoolBytes uint64
	// Workers per engine (default 4).
	Workers int
	// Timeout bounds each request (default 1 minute).
	Timeout time.Duration
	// Fragment shuffles both pools' free lists, so that every request gets
	// scattered block ids on both sides (seeded by Seed).
	Fragment bool
	Seed     uint64
	// Record keeps every context-side session's chunk events (Pair.Timeline).
	Record bool
}

// Pair is a context engine and a generation engine in this process,
// connected by an in-memory control link and a backend. Its context agent
// counts what is posted.
type Pair struct {
	Ctx, Gen *kvxfer.Engine
	Layout   kvcache.Layout
	cfg      PairConfig
	counts   *postCounts
	timeline *Timeline
	closers  []io.Closer
}

// NewPair starts both engines.
func NewPair(ctx context.Context, cfg PairConfig) (_ *Pair, err error) {
	if cfg.Backend == "" {
		cfg.Backend = loopback.Backend
	}
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	p := &Pair{Layout: cfg.Layout, cfg: cfg, counts: &postCounts{}}
	defer func() {
		if err != nil {
			_ = p.Close(ctx)
		}
	}()
	var ctxAgent, genAgent rdma.Agent
	var genRegion *kvcache.Region
	switch cfg.Backend {
	case loopback.Backend:
		net := loopback.NewNetwork()
		ctxAgent, genAgent = loopback.New(loopback.WithNetwork(net)), loopback.New(loopback.WithNetwork(net))
	case shm.Backend:
		ctxAgent, genAgent = shm.New(), shm.New()
		r, c, err := shm.NewRegion("", cfg.PoolBytes)
		if err != nil {
			return nil, fmt.Errorf("bench: shm region of %d bytes: %w", cfg.PoolBytes, err)
		}
		genRegion = r
		p.closers = append(p.closers, c)
	default:
		return nil, fmt.Errorf("bench: unknown backend %q (want loopback or shm)", cfg.Backend)
	}
	// Agents close after the engines (Close runs closers last to first).
	p.closers = append([]io.Closer{ctxAgent, genAgent}, p.closers...)
	var rec actors.Recorder
	if cfg.Record {
		p.timeline = newTimeline()
		rec = p.timeline
	}
	link := control.NewMemLink()
	l := cfg.Layout
	p.Ctx, err = kvxfer.Start(ctx, kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: cfg.PoolBytes, Workers: cfg.Workers,
		Agent: &countingAgent{Agent: ctxAgent, c: p.counts}, Link: link, TransferTimeout: cfg.Timeout, Recorder: rec})
	if err != nil {
		return nil, err
	}
	p.Gen, err = kvxfer.Start(ctx, kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: cfg.PoolBytes, Region: genRegion,
		Workers: cfg.Workers, Agent: genAgent, Link: link, TransferTimeout: cfg.Timeout})
	if err != nil {
		return nil, err
	}
	// Write both pools once. Untouched anonymous memory reads as the
	// shared zero page, which no real KV cache is and which copies far
	// faster than memory does; and the first write into a page faults it
	// in, which a serving process paid long before its first transfer.
	fillPattern(p.Ctx.Region().Bytes())
	fillPattern(p.Gen.Region().Bytes())
	if cfg.Fragment {
		rng := rand.New(rand.NewPCG(cfg.Seed, 0x66726167))
		for _, e := range []*kvxfer.Engine{p.Ctx, p.Gen} {
			if err := fragment(e.Pools(), rng); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// fillPattern writes a non-zero, non-repeating pattern into b.
func fillPattern(b []byte) {
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

// fragment allocates every block, shuffles each group's ids and frees them
// in that order: the pool's free list, a stack, then hands them out
// scattered.
func fragment(pools *actors.Pools, rng *rand.Rand) error {
	counts := make([]int, pools.Groups())
	for g, st := range pools.Stats() {
		counts[g] = st.Free
	}
	ids, err := pools.Alloc(counts)
	if err != nil {
		return err
	}
	for _, g := range ids {
		rng.Shuffle(len(g), func(i, j int) { g[i], g[j] = g[j], g[i] })
	}
	return pools.Free(ids)
}

// Close stops both engines and releases the backend.
func (p *Pair) Close(ctx context.Context) error {
	var errs []error
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, e := range []*kvxfer.Engine{p.Ctx, p.Gen} {
		if e != nil {
			errs = append(errs, e.Close(cctx))
		}
	}
	for i := len(p.closers) - 1; i >= 0; i-- {
		errs = append(errs, p.closers[i].Close())
	}
	return errors.Join(errs...)
}

// Posts is what the context engine posted so far: batches, segments, bytes.
func (p *Pair) Posts() (batches, segments int64, bytes uint64) {
	return p.counts.batches.Load(), p.counts.segments.Load(), p.counts.bytes.Load()
}

// Timeline is the pair's recorder (nil unless PairConfig.Record).
func (p *Pair) Timeline() *Timeline { return p.timeline }

// RequestSpec is one request a Pair moves.
type RequestSpec struct {
	ID     string
	Tokens int
	// ChunkTokens is the prefill chunk size (0: the whole prompt in one
	// chunk).
	ChunkTokens int
	// Compute is the simulated prefill time of each chunk.
	Compute time.Duration
	// Pipelined hands each chunk over before its compute with a fence
	// that fires after it; otherwise every chunk is handed over, already
	// written, after the whole prefill.
	Pipelined bool
}

// RequestResult is one request's timing.
type RequestResult struct {
	ID     string
	Tokens int
	Bytes  uint64
	// Start is when the generation side called Receive; ComputeStart when
	// prefill began; LastFence when the last chunk's KV was written; Ready
	// when READY was delivered.
	Start, ComputeStart, LastFence, Ready time.Time
}

// Latency is Receive → READY.
func (r RequestResult) Latency() time.Duration { return r.Ready.Sub(r.Start) }

// Exposed is last fence → READY: the transfer time prefill did not hide.
func (r RequestResult) Exposed() time.Duration { return r.Ready.Sub(r.LastFence) }

// Run moves one request: it allocates source blocks (waiting for room),
// opens the generation side, then the context side, hands the chunks over
// as spec says, waits for READY and frees both sides' blocks.
func (p *Pair) Run(ctx context.Context, spec RequestSpec) (RequestResult, error) {
	l := p.Layout
	res := RequestResult{ID: spec.ID, Tokens: spec.Tokens}
	chunkTokens := spec.ChunkTokens
	if chunkTokens <= 0 {
		chunkTokens = l.BlocksFor(spec.Tokens) * l.TokensPerBlock
	}
	chunks, err := kvcache.Chunks(spec.Tokens, chunkTokens, l.TokensPerBlock)
	if err != nil {
		return res, err
	}
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(spec.Tokens)
	}
	src, err := p.Ctx.Pools().AllocWait(ctx, counts)
	if err != nil {
		return res, err
	}
	defer func() { _ = p.Ctx.Pools().Free(src) }()
	res.Start = time.Now()
	rx, err := p.Gen.Receive(ctx, kvxfer.ReceiveRequest{ID: spec.ID, PromptLen: spec.Tokens, Context: "ctx"})
	if err != nil {
		return res, err
	}
	tx, err := p.Ctx.Send(context.Background(), kvxfer.SendRequest{ID: spec.ID, PromptLen: spec.Tokens})
	if err != nil {
		rx.Cancel()
		<-rx.Done()
		return res, err
	}
	runs := func(c kvcache.Chunk) []kvcache.BlockRun { return c.Runs(l.TokensPerBlock, src) }
	res.ComputeStart = time.Now()
	if spec.Pipelined {
		for _, c := range chunks {
			f := &kvxfer.ManualFence{}
			if err := tx.Chunk(c, runs(c), f); err != nil {
				return res, p.abandon(tx, rx, err)
			}
			compute(spec.Compute)
			res.LastFence = time.Now()
			f.Fire(nil)
		}
	} else {
		compute(spec.Compute * time.Duration(len(chunks)))
		res.LastFence = time.Now()
		for _, c := range chunks {
			if err := tx.Chunk(c, runs(c), nil); err != nil {
				return res, p.abandon(tx, rx, err)
			}
		}
	}
	ro := <-rx.Done()
	res.Ready = time.Now()
	to := <-tx.Done()
	if !ro.OK || !to.OK {
		return res, fmt.Errorf("request %s: rx %s (%v), tx %s (%v)", spec.ID, ro.Status, ro.Err, to.Status, to.Err)
	}
	res.Bytes = ro.Bytes
	return res, p.Gen.FreeBlocks(ro.Blocks)
}

// abandon cancels both sides of a request that could not be handed over
// and waits until both released their blocks.
func (p *Pair) abandon(tx *kvxfer.TxHandle, rx *kvxfer.RxHandle, err error) error {
	tx.Cancel()
	rx.Cancel()
	<-tx.Done()
	<-rx.Done()
	return err
}

// compute stands for prefill compute of d.
func compute(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

// RequestBytes is what a request of tokens tokens moves with layout l
// (every resident block of every group).
func RequestBytes(l kvcache.Layout, tokens int) uint64 {
	var n uint64
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(tokens, grp.Window, l.TokensPerBlock, 0)
		n += uint64(end-first) * uint64(l.BlockBytes(g))
	}
	return n
}

// postCounts is what a countingAgent's endpoints posted.
type postCounts struct {
	batches, segments atomic.Int64
	bytes             atomic.Uint64
}

// countingAgent wraps an agent and counts every batch its endpoints post.
type countingAgent struct {
	rdma.Agent
	c *postCounts
}

var _ rdma.Agent = (*countingAgent)(nil)

// CompletionsDeliver is the wrapped agent's (rdma.Delivering): counting
// changes nothing about when a batch's Done runs.
func (a *countingAgent) CompletionsDeliver() bool { return rdma.CompletionsDeliver(a.Agent) }

func (a *countingAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	return &countingEndpoint{Endpoint: ep, c: a.c}, nil
}

type countingEndpoint struct {
	rdma.Endpoint
	c *postCounts
}

// Post counts before it posts, so that the counts are complete by the time
// the batch's Done runs, and takes a refused batch back out.
func (e *countingEndpoint) Post(b rdma.Batch) error {
	var n uint64
	for _, s := range b.Segments {
		n += s.Len
	}
	e.c.batches.Add(1)
	e.c.segments.Add(int64(len(b.Segments)))
	e.c.bytes.Add(n)
	if err := e.Endpoint.Post(b); err != nil {
		e.c.batches.Add(-1)
		e.c.segments.Add(-int64(len(b.Segments)))
		e.c.bytes.Add(-n)
		return err
	}
	return nil
}
