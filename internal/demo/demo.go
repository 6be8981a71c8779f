// Package demo is kvxfer's main job: one process, a context engine and a
// generation engine on the embedded loopback backend, a batch of requests
// with chunked prefill, run once pipelined (each chunk leaves as soon as
// its fence fires) and once transferring only after prefill ends. Every
// transferred byte is verified and every block accounted for.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sync/semaphore"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/cpustat"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// Mode is one way of running the batch.
type Mode struct {
	Name      string
	Pipelined bool
}

// Row is one mode's figures. Its JSON names each field in snake_case with
// its unit: durations in nanoseconds (_ns), shares as fractions of 1.
type Row struct {
	Mode     string `json:"mode"`
	Requests int    `json:"requests"`
	Bytes    uint64 `json:"bytes"`
	// Wall runs from the mode's start to the last request's transfer end
	// (READY, and the context side done): the byte check that follows a
	// request's transfer is not the transfer's time.
	Wall        time.Duration `json:"wall_ns"`
	BytesPerSec float64       `json:"bytes_per_sec"`
	ExposedP50  time.Duration `json:"exposed_p50_ns"`
	ExposedP99  time.Duration `json:"exposed_p99_ns"`
	// Hidden is the fraction of the transfer time hidden behind prefill
	// (pipelined row only; the median over requests of 1 − exposed
	// pipelined / exposed after prefill). Below 0, the pipelined requests
	// were exposed longer than after prefill: nothing was hidden.
	Hidden        float64 `json:"hidden_fraction"`
	BytesVerified uint64  `json:"bytes_verified"`
	Mismatches    int     `json:"mismatches"`
	LeakedBlocks  int     `json:"leaked_blocks"`
	// ChunkCompute is the median time a chunk held its prefill device:
	// the CPU's write of its KV, then the rest of Compute slept. Above
	// Compute, the write itself was slower than Compute (it shares the
	// memory bus with the copies and the byte checks), and the devices
	// offered less than Compute promises. DeviceBusy is the share of the
	// devices' time (devices × Wall) spent computing chunks.
	ChunkCompute time.Duration `json:"chunk_compute_p50_ns"`
	DeviceBusy   float64       `json:"device_busy_fraction"`
	// Steal is the share of the machine's CPU time the host took while
	// the mode ran (a virtual machine's steal; cpustat), -1 where the
	// machine does not say. A latency figure moves with it.
	Steal   float64 `json:"steal_fraction"`
	exposed []time.Duration
}

// Report is a whole run. Options are those the run used, a zero that
// stands for a default replaced by its value (the block size, ...).
type Report struct {
	Options Options `json:"options"`
	Rows    []Row   `json:"rows"`
	// Raw is the backend's raw figure at one chunk's size, measured in the
	// same run (nil when it could not be measured: RawErr says why).
	Raw    *rdmabench.Result `json:"raw"`
	RawErr error             `json:"-"`
	// RawSteal is the steal share while Raw was measured (-1: unknown).
	RawSteal float64 `json:"raw_steal_fraction"`
	// LayerParts is how many layer parts each pipelined chunk left in.
	LayerParts int `json:"layer_parts"`
}

// measureRaw measures the demo's backend moving one chunk's bytes with no
// engine (rdmabench: Post, flush, Done), so that the demo's figures can be
// read as ratios on whatever machine runs it.
func measureRaw(o Options) (*rdmabench.Result, error) {
	l, err := o.layout()
	if err != nil {
		return nil, err
	}
	backend := o.Backend
	if backend == "" {
		backend = loopback.Backend
	}
	chunk := uint64(l.BytesPerToken()) * uint64(o.ChunkTokens)
	r, err := rdmabench.Measure(backend, rdmabench.Shape{SegmentBytes: chunk, Segments: 1},
		rdmabench.Config{Rounds: 3, MinBytes: 4 * chunk})
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// steal ends m: the share of CPU time the host took, -1 when unknown.
func steal(m cpustat.Meter) float64 {
	if s, ok := m.Stop(); ok {
		return s.Steal
	}
	return -1
}

// OK reports whether every byte matched and no block leaked.
func (r Report) OK() bool {
	for _, row := range r.Rows {
		if row.Mismatches > 0 || row.LeakedBlocks > 0 || row.BytesVerified != row.Bytes {
			return false
		}
	}
	return len(r.Rows) > 0
}

// Run runs both modes and returns the report. progress receives one line
// per finished request (nil for none). Options that Check refuses, a pool
// too small for a prompt among them, fail before any engine starts.
func Run(ctx context.Context, o Options, progress io.Writer) (Report, error) {
	if err := o.Check(); err != nil {
		return Report{}, err
	}
	prompts := o.prompts()
	l, err := o.layout()
	if err != nil {
		return Report{}, err
	}
	rep := Report{Options: o.effective(l), LayerParts: len(o.parts(l.Layers))}
	meter := cpustat.Start()
	rep.Raw, rep.RawErr = measureRaw(o)
	rep.RawSteal = steal(meter)
	for _, m := range Modes {
		meter := cpustat.Start()
		row, err := runMode(ctx, o, m, prompts, progress)
		if err != nil {
			return rep, fmt.Errorf("demo %s: %w", m.Name, err)
		}
		row.Steal = steal(meter)
		rep.Rows = append(rep.Rows, row)
	}
	// Fraction hidden: per request, 1 - exposed(pipelined)/exposed(after
	// prefill), where the latter is the whole transfer, exposed.
	p, s := rep.Rows[0].exposed, rep.Rows[1].exposed
	var fr []float64
	for i := range p {
		if s[i] > 0 {
			fr = append(fr, 1-float64(p[i])/float64(s[i]))
		}
	}
	sort.Float64s(fr)
	if len(fr) > 0 {
		rep.Rows[0].Hidden = fr[len(fr)/2]
	}
	return rep, nil
}

// Modes are the demo's two runs, in order: chunks sent as prefill
// computes them, and the whole prompt after prefill.
var Modes = []Mode{{"pipelined", true}, {"after-prefill", false}}

func runMode(ctx context.Context, o Options, m Mode, prompts []int, progress io.Writer) (row Row, err error) {
	link := control.NewMemLink()
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	var ctxAgent, genAgent rdma.Agent // nil: each engine's own loopback agent
	var genRegion *kvcache.Region
	// A pool the host cannot map says which flag set it.
	poolErr := func(err error) error {
		return fmt.Errorf("%s = %s: %w", o.poolName(), config.FormatSize(o.PoolBytes), err)
	}
	switch o.Backend {
	case "", loopback.Backend:
	case shm.Backend:
		r, c, err := shm.NewRegion("", o.PoolBytes)
		if err != nil {
			return Row{}, poolErr(err)
		}
		genRegion = r
		ctxAgent, genAgent = shm.New(), shm.New()
		// After both engines closed (deferred first, so run last).
		defer func() { err = errors.Join(err, ctxAgent.Close(), genAgent.Close(), c.Close()) }()
	case ucx.Backend:
		ca, err := ucx.New()
		if err != nil {
			return Row{}, err
		}
		ga, err := ucx.New()
		if err != nil {
			return Row{}, errors.Join(err, ca.Close())
		}
		// The generation pool in memory UCX allocated: its transports
		// write that with one copy (a Go heap destination goes through
		// UCX's software RMA).
		r, c, err := ga.Alloc(o.PoolBytes)
		if err != nil {
			return Row{}, errors.Join(poolErr(err), ca.Close(), ga.Close())
		}
		genRegion = r
		ctxAgent, genAgent = ca, ga
		// The writer's agent first, then the pool, then its owner.
		defer func() { err = errors.Join(err, ctxAgent.Close(), c.Close(), genAgent.Close()) }()
	default:
		return Row{}, fmt.Errorf("demo: backend %q: want loopback, shm or ucx", o.Backend)
	}
	var rec actors.Recorder
	if o.Probe != nil {
		rec = o.Probe
		if ctxAgent == nil {
			la := loopback.New()
			defer func() { err = errors.Join(err, la.Close()) }()
			ctxAgent = la
		}
		ctxAgent = o.Probe.Agent(m.Name, ctxAgent)
	}
	start := func(inst string, agent rdma.Agent, region *kvcache.Region, metricsAddr string) (*kvxfer.Engine, error) {
		cfg := kvxfer.Config{Instance: inst, Model: o.Model, PoolBytes: o.PoolBytes, TokensPerBlock: o.TokensPerBlock,
			Workers: o.Workers, Link: link, TransferTimeout: timeout, Agent: agent, Region: region, MetricsAddr: metricsAddr,
			Recorder: rec}
		if o.TraceDir != "" {
			cfg.TracePath, cfg.TraceMaxBytes, cfg.TraceKeep = traceFile(o.TraceDir, inst), o.TraceMaxBytes, o.TraceKeep
		}
		e, err := kvxfer.Start(ctx, cfg)
		// A pool the host cannot map, or of more blocks than the wire
		// can name (Start names PoolBytes), is the pool setting's.
		var tooMany *kvxfer.TooManyBlocksError
		if errors.Is(err, kvcache.ErrBadRegion) || errors.As(err, &tooMany) {
			err = poolErr(err)
		}
		return e, err
	}
	ce, err := start("ctx-"+m.Name, ctxAgent, nil, o.MetricsAddr)
	if err != nil {
		return Row{}, err
	}
	ge, err := start("gen-"+m.Name, genAgent, genRegion, o.GenMetricsAddr)
	if err != nil {
		_ = ce.Close(ctx)
		return Row{}, err
	}
	if o.Started != nil {
		o.Started(m.Name, ce, ge)
	}
	row = Row{Mode: m.Name, Requests: len(prompts), exposed: make([]time.Duration, len(prompts))}
	// A request larger than a pool would wait for ever on the admission
	// semaphore below (Acquire of more than its size blocks until ctx
	// ends): refuse the run before the first request. Check has refused
	// it already unless the engines carve their pools otherwise.
	if err := fitsPools(ce, ge, prompts); err != nil {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return Row{}, errors.Join(err, ce.Close(cctx), ge.Close(cctx))
	}
	// The scheduler admits a request only when the generation side can
	// take it, as a disaggregated server's router does: prefill never
	// starts for a request whose destination blocks are not there.
	var genBlocks int64
	for _, st := range ge.Pools().Stats() {
		genBlocks += int64(st.Total)
	}
	admit := semaphore.NewWeighted(genBlocks)
	var mu sync.Mutex
	var firstErr error
	var computes []time.Duration // every chunk's time on its device
	var end time.Time            // the last transfer's end
	sem := make(chan struct{}, o.Concurrency)
	// The simulated prefill devices: a request computes a chunk only
	// while it holds one (FIFO among the waiters).
	devices := make(chan struct{}, o.devices())
	var wg sync.WaitGroup
	// Fault both pools in before the clock starts, as a serving process
	// that has run for a while has: a first write into a huge page can
	// stall for compaction, which no steady-state transfer pays.
	for _, e := range []*kvxfer.Engine{ce, ge} {
		b := e.Region().Bytes()
		for i := 0; i < len(b); i += 4096 {
			b[i] = 0
		}
	}
	t0 := time.Now()
	o.mark(ProbeEvent{Mode: m.Name, Chunk: -1, Kind: ProbeModeStart, At: t0})
	gl, cl, cshape := ge.Layout(), ce.Layout(), ce.Shape() // copies: once, not per request
	for i, n := range prompts {
		sem <- struct{}{}
		wg.Add(1)
		go func(i, n int) {
			defer func() { <-sem; wg.Done() }()
			need := int64(len(gl.Groups) * gl.BlocksFor(n))
			o.mark(ProbeEvent{Mode: m.Name, Request: fmt.Sprintf("%s-%d", m.Name, i), Chunk: -1, Kind: ProbeAdmit})
			if err := admit.Acquire(ctx, need); err != nil {
				mu.Lock()
				firstErr = errors.Join(firstErr, err)
				mu.Unlock()
				return
			}
			res, err := runRequest(ctx, o, m, ce, ge, cl, cshape, devices, i, n)
			admit.Release(need)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			row.Bytes += res.bytes
			row.BytesVerified += res.verified
			row.Mismatches += res.mismatches
			row.exposed[i] = res.exposed
			computes = append(computes, res.computes...)
			if res.end.After(end) {
				end = res.end
			}
			if progress != nil {
				fmt.Fprintf(progress, "  %-13s request %2d  %5d tokens  %8.1f MiB  exposed %s\n", m.Name, i, n,
					float64(res.bytes)/(1<<20), duration(res.exposed))
			}
		}(i, n)
	}
	wg.Wait()
	o.mark(ProbeEvent{Mode: m.Name, Chunk: -1, Kind: ProbeModeEnd})
	if end.IsZero() { // no request got as far as its transfer's end
		end = time.Now()
	}
	row.Wall = end.Sub(t0)
	row.BytesPerSec = float64(row.Bytes) / row.Wall.Seconds()
	if len(computes) > 0 {
		var busy time.Duration
		for _, c := range computes {
			busy += c
		}
		slices.Sort(computes)
		row.ChunkCompute = computes[len(computes)/2]
		row.DeviceBusy = busy.Seconds() / (float64(o.devices()) * row.Wall.Seconds())
	}
	row.LeakedBlocks = ce.Pools().Used() + ge.Pools().Used()
	ex := append([]time.Duration(nil), row.exposed...)
	sort.Slice(ex, func(a, b int) bool { return ex[a] < ex[b] })
	row.ExposedP50 = ex[len(ex)/2]
	row.ExposedP99 = ex[(len(ex)*99)/100]
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cerr := errors.Join(ce.Close(cctx), ge.Close(cctx))
	return row, errors.Join(firstErr, cerr)
}

// fitsPools fails, wrapping kvcache.ErrPoolTooSmall, when the longest of
// prompts needs more blocks in some layer group than either engine's pool
// holds: the source side allocates every block of the prompt in every
// group, the admission semaphore counts as many on the generation side.
func fitsPools(ce, ge *kvxfer.Engine, prompts []int) error {
	longest, n := longestPrompt(prompts)
	for _, side := range []struct {
		name string
		e    *kvxfer.Engine
	}{{"context", ce}, {"generation", ge}} {
		l, pools := side.e.Layout(), side.e.Pools()
		for g := range pools.Groups() {
			if err := pools.Geometry(g).CheckFits(l.BlocksFor(n)); err != nil {
				return fmt.Errorf("demo: request %d (%d tokens of %s), %s pool, layer group %d: %w",
					longest, n, l.Name, side.name, g, err)
			}
		}
	}
	return nil
}

type reqResult struct {
	bytes, verified uint64
	mismatches      int
	exposed         time.Duration
	computes        []time.Duration // each chunk's time on its prefill device
	end             time.Time       // both sides done with the transfer
}

// errNone stands for a side's nil error in a failed request's message.
var errNone = errors.New("no error")

// orNone is err, or errNone for nil.
func orNone(err error) error {
	if err == nil {
		return errNone
	}
	return err
}

// runRequest moves request i of promptLen tokens in mode m, then checks
// every byte that arrived (the request holds its --concurrency slot until
// then).
func runRequest(ctx context.Context, o Options, m Mode, ce, ge *kvxfer.Engine, l kvcache.Layout, shape kvcache.Shape,
	devices chan struct{}, i, promptLen int) (reqResult, error) {
	var res reqResult
	id := fmt.Sprintf("%s-%d", m.Name, i)
	nblk := l.BlocksFor(promptLen)
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = nblk
	}
	chunks, err := kvcache.Chunks(promptLen, o.ChunkTokens, l.TokensPerBlock)
	if err != nil {
		return res, fmt.Errorf("request %s: %w", id, err)
	}
	// Source blocks first, then destination: a request never holds
	// destination blocks while it waits for source blocks, so requests
	// waiting for pool space cannot deadlock.
	src, err := ce.Pools().AllocWait(ctx, counts)
	if err != nil {
		return res, err
	}
	o.mark(ProbeEvent{Mode: m.Name, Request: id, Chunk: -1, Kind: ProbeAllocated})
	rx, err := ge.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: promptLen, Context: "ctx-" + m.Name})
	if err != nil {
		_ = ce.Pools().Free(src)
		return res, err
	}
	// genTimedOut adds to err, when the generation side's deadline passed
	// first and it cancelled the request, that it did: the context side's
	// error said only "cancelled by peer", not that --timeout was too
	// short.
	genTimedOut := func(err error, ro kvxfer.Outcome) error {
		if !ro.OK && errors.Is(ro.Err, kvxfer.ErrTimeout) && !errors.Is(err, kvxfer.ErrTimeout) {
			return fmt.Errorf("%w (the generation side's deadline passed first, --timeout %v: %w)", err, o.Timeout, ro.Err)
		}
		return err
	}
	tx, err := ce.Send(ctx, kvxfer.SendRequest{ID: id, PromptLen: promptLen})
	if err != nil {
		_ = ce.Pools().Free(src)
		rx.Cancel()
		ro := <-rx.Done()
		if ro.OK {
			err = errors.Join(err, ge.FreeBlocks(ro.Blocks))
		}
		return res, genTimedOut(err, ro)
	}
	// abandon ends a request whose chunk was refused: it cancels both
	// sides and frees the source blocks once the context side released
	// its pins, so that the requests waiting for blocks still get them.
	abandon := func(err error) (reqResult, error) {
		tx.Cancel()
		rx.Cancel()
		<-tx.Done()
		ro := <-rx.Done()
		if ro.OK {
			err = errors.Join(err, ge.FreeBlocks(ro.Blocks))
		}
		err = genTimedOut(err, ro)
		return res, errors.Join(err, ce.Pools().Free(src))
	}
	runs := func(c kvcache.Chunk) []kvcache.BlockRun { return c.Runs(l.TokensPerBlock, src) }
	mark := func(chunk int, k ProbeKind, bytes uint64) {
		o.mark(ProbeEvent{Mode: m.Name, Request: id, Chunk: chunk, Kind: k, Bytes: bytes})
	}
	parts := o.parts(l.Layers)
	// compute simulates the prefill of chunk k on a prefill device: layer
	// part by layer part, it sleeps to the part's share of Compute less
	// the time its fill takes (the last part's, an estimate), then writes
	// the part's KV with the CPU. each, when set, hands the part over
	// before it is computed and returns what fires its fence after. The
	// KV is written at the end of its compute, as a forward pass writes
	// it, so that an engine that read a part before its fence fired would
	// move the blocks' earlier contents, which the check refuses: written
	// first, the right bytes were there long before the fence (a review's
	// mutation firing every fence at once passed 5 demos in 5).
	var fillTook time.Duration
	compute := func(k int, c kvcache.Chunk, each func(part kvcache.LayerPart) (func(), error)) error {
		devices <- struct{}{}
		t := time.Now()
		defer func() {
			res.computes = append(res.computes, time.Since(t))
			<-devices
		}()
		mark(k, ProbeCompute, 0)
		b0, b1 := c.Blocks(l.TokensPerBlock)
		var filled uint64
		for pi, part := range parts {
			var fire func()
			if each != nil {
				var err error
				if fire, err = each(part); err != nil {
					return err
				}
			}
			if rest := o.Compute*time.Duration(pi+1)/time.Duration(len(parts)) - fillTook - time.Since(t); rest > 0 {
				time.Sleep(rest) // simulated prefill compute
			}
			fillAt := time.Now()
			for g := range l.Groups {
				per := int(shape.BlockBytes(l, g)) / max(1, len(shape.Layers[g]))
				for b := b0; b < b1; b++ {
					blk := blockBytes(ce, g, src[g][b])
					if part.Whole() {
						FillBlock(blk, i, g, b)
						filled += uint64(len(blk))
						continue
					}
					for li, layer := range shape.Layers[g] {
						if part.Contains(layer) {
							fillRange(blk, i, g, b, li*per, (li+1)*per)
							filled += uint64(per)
						}
					}
				}
			}
			fillTook = time.Since(fillAt)
			if pi == len(parts)-1 {
				mark(k, ProbeFilled, filled)
			}
			if fire != nil {
				fire()
			}
		}
		mark(k, ProbeComputed, 0)
		return nil
	}
	var lastFence time.Time
	if m.Pipelined {
		for k, c := range chunks {
			handed := false
			err := compute(k, c, func(part kvcache.LayerPart) (func(), error) {
				pc := c
				pc.Layers = part
				f := &actors.ManualFence{}
				if err := tx.Chunk(pc, runs(c), f); err != nil {
					return nil, err
				}
				if !handed {
					mark(k, ProbeHanded, 0)
					handed = true
				}
				return func() {
					if part.Final() {
						lastFence = time.Now()
						mark(k, ProbeFence, 0)
					}
					f.Fire(nil)
				}, nil
			})
			if err != nil {
				return abandon(err)
			}
		}
	} else {
		for k, c := range chunks {
			if err := compute(k, c, nil); err != nil {
				return abandon(err)
			}
		}
		lastFence = time.Now()
		mark(len(chunks)-1, ProbeFence, 0)
		for k, c := range chunks {
			if err := tx.Chunk(c, runs(c), nil); err != nil {
				return abandon(err)
			}
			mark(k, ProbeHanded, 0)
		}
	}
	ro := <-rx.Done()
	res.exposed = time.Since(lastFence)
	mark(-1, ProbeReady, 0)
	to := <-tx.Done()
	res.end = time.Now()
	if err := ce.Pools().Free(src); err != nil {
		return res, fmt.Errorf("request %s: free source: %w", id, err)
	}
	if !ro.OK || !to.OK {
		// Both causes wrapped (errors.Is ErrTimeout when a deadline
		// ended it, whichever side's): a chunk handed over before the
		// generation side's deadline cancelled the request ends here, not
		// in abandon.
		return res, fmt.Errorf("request %s: rx %s (%w), tx %s (%w)", id, ro.Status, orNone(ro.Err), to.Status, orNone(to.Err))
	}
	mark(-1, ProbeVerify, 0)
	res.bytes, res.verified, res.mismatches = verifyOutcome(ge, l, promptLen, i, ro)
	mark(-1, ProbeVerified, res.verified)
	if err := ge.FreeBlocks(ro.Blocks); err != nil {
		return res, fmt.Errorf("request %s: free destination: %w", id, err)
	}
	return res, nil
}

// verifyOutcome checks request i's destination blocks in ge, READY in ro,
// against the pattern its source was filled with. The bytes the request
// should have moved come from the layout, not from the engine's outcome:
// a plan short of blocks would otherwise verify every block it has and
// call the request whole. A block missing, or one past those the prompt
// needs, is a mismatch, and so is an outcome that counts other bytes.
func verifyOutcome(ge *kvxfer.Engine, l kvcache.Layout, promptLen, i int, ro kvxfer.Outcome) (bytes, verified uint64, mismatches int) {
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
		bytes += uint64(end-first) * ge.Pools().Geometry(g).BlockBytes
		if g >= len(ro.Blocks) {
			mismatches += end - first
			continue
		}
		if n := len(ro.Blocks[g]); n != end-first {
			mismatches += max(n, end-first) - min(n, end-first)
		}
		for bi, dst := range ro.Blocks[g] {
			if first+bi >= end {
				break // counted above
			}
			if b := blockBytes(ge, g, dst); CheckBlock(b, i, g, first+bi) {
				verified += uint64(len(b))
			} else {
				mismatches++
			}
		}
	}
	if ro.Bytes != bytes {
		mismatches++ // the engine says it moved another amount than the prompt's
	}
	return bytes, verified, mismatches
}

func blockBytes(e *kvxfer.Engine, g int, id kvcache.BlockID) []byte {
	geom := e.Pools().Geometry(g)
	off := geom.Offset + uint64(id)*geom.BlockBytes
	return e.Region().Bytes()[off : off+geom.BlockBytes]
}

// words views an 8-byte-aligned block as uint64 words.
func words(b []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
}

func seed(req, g, blk int) uint64 {
	return uint64(req+1)*0x9E3779B97F4A7C15 ^ uint64(g+1)*0xBF58476D1CE4E5B9 ^ uint64(blk+1)*0x94D049BB133111EB
}

// FillBlock writes the block's pattern: word k = seed + k*odd constant, so
// every word of every block of every request differs.
func FillBlock(b []byte, req, g, blk int) {
	fillRange(b, req, g, blk, 0, len(b))
}

// patternStep is FillBlock's odd constant: word k = seed + k*patternStep.
const patternStep = 0xD6E8FEB86659FD93

// fillRange writes FillBlock's pattern into bytes [lo, hi) of the block
// only (8-byte aligned): the layers a layer part computes.
//
// The simulated device writes its KV as a GPU's kernel would from the
// host's side: without reading each line first, and without evicting what
// the transfers beside it cache (non-temporal stores where the CPU has
// them). Ordinary stores cost the memory bus a read for every line written
// (twice the write), which on a small machine took the copies' bandwidth
// and made a chunk overrun its compute time: the figure then measured the
// simulator, not the transfer.
func fillRange(b []byte, req, g, blk, lo, hi int) {
	k0, k1 := lo/8, hi/8
	if k1 <= k0 {
		return
	}
	w, v := words(b)[k0:k1], seed(req, g, blk)+uint64(k0)*patternStep
	// In pieces: the goroutine cannot be preempted inside the assembly
	// loop, and a piece takes microseconds, not a block's milliseconds.
	for len(w) > 0 {
		n := min(len(w), fillPiece)
		fillWords(&w[0], n, v, patternStep)
		w, v = w[n:], v+uint64(n)*patternStep
	}
}

// fillPiece is the words fillWords writes in one call (256 KiB).
const fillPiece = 32 << 10

// CheckBlock reports whether b holds FillBlock's pattern for (req, g, blk).
func CheckBlock(b []byte, req, g, blk int) bool {
	v := seed(req, g, blk)
	for _, x := range words(b) {
		if x != v {
			return false
		}
		v += patternStep
	}
	return true
}

// Print writes the report table.
func (r Report) Print(w io.Writer) {
	handed := "pipelined chunks leave whole"
	if r.LayerParts > 1 {
		handed = fmt.Sprintf("pipelined chunks leave in %d layer parts", r.LayerParts)
	}
	fmt.Fprintf(w, "\nkvxfer demo: %s, %d requests of %d..%d tokens, chunks of %d tokens, %v compute per chunk, pools %d MiB, %d workers, %s\n\n",
		r.Options.Model, r.Options.Requests, r.Options.MinTokens, r.Options.MaxTokens, r.Options.ChunkTokens,
		r.Options.Compute, r.Options.PoolBytes>>20, r.Options.Workers, handed)
	fmt.Fprintf(w, "%-14s %8s %10s %8s %12s %12s %8s %14s %7s\n", "mode", "requests", "GiB", "GB/s", "exposed p50", "exposed p99", "hidden", "bytes verified", "leaked")
	longer := false
	for i, row := range r.Rows {
		hidden := "-" // after prefill: nothing to hide
		if i == 0 && len(r.Rows) > 1 {
			hidden = fmt.Sprintf("%.1f%%", row.Hidden*100)
			if row.Hidden < 0 {
				hidden, longer = "none", true
			}
		}
		fmt.Fprintf(w, "%-14s %8d %10.2f %8.2f %12s %12s %8s %14d %7d\n", row.Mode, row.Requests,
			float64(row.Bytes)/(1<<30), row.BytesPerSec/1e9, duration(row.ExposedP50),
			duration(row.ExposedP99), hidden, row.BytesVerified, row.LeakedBlocks)
	}
	if longer {
		fmt.Fprintf(w, "hidden none: pipelined took longer than after prefill (its exposed window %.1fx, the median request's)\n",
			1-r.Rows[0].Hidden)
	}
	r.printRaw(w)
	if r.OK() {
		fmt.Fprintln(w, "\nOK: every transferred byte verified, 0 leaked blocks")
	} else {
		fmt.Fprintln(w, "\nFAILED: byte mismatch or leaked blocks")
	}
}

// printSteal says how much CPU time the host took from this machine during
// the raw baseline and each mode: on a virtual machine whose host is
// busy, every figure above moves with it, and a ratio of two runs is fair
// only when both lost about the same.
func (r Report) printSteal(w io.Writer) {
	if r.RawSteal < 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CPU time the host took (steal): raw %.0f%%", 100*r.RawSteal)
	for _, row := range r.Rows {
		if row.Steal < 0 {
			return
		}
		fmt.Fprintf(&b, ", %s %.0f%%", row.Mode, 100*row.Steal)
	}
	fmt.Fprintln(w, b.String())
}

// printRaw writes the raw backend's figure beside the table and the
// pipelined row's ratios to it: what a figure means on this machine.
func (r Report) printRaw(w io.Writer) {
	if r.Raw == nil {
		if r.RawErr != nil {
			fmt.Fprintf(w, "\nraw baseline not measured: %v\n", r.RawErr)
		}
		return
	}
	chunk := time.Duration(float64(r.Raw.SizeBytes) / r.Raw.BytesPerSec * float64(time.Second))
	fmt.Fprintf(w, "\nbaseline, same run: raw %s at one chunk (%.1f MiB): %.2f GB/s, one chunk's transfer %s\n",
		r.Raw.Backend, float64(r.Raw.SizeBytes)/(1<<20), r.Raw.BytesPerSec/1e9, duration(chunk))
	r.printSteal(w)
	if len(r.Rows) == 0 || r.Rows[0].BytesPerSec == 0 || chunk <= 0 {
		return
	}
	p := r.Rows[0]
	fmt.Fprintf(w, "%s: GB/s / raw %.2f, exposed p50 / one chunk's raw transfer %.1fx\n",
		p.Mode, p.BytesPerSec/r.Raw.BytesPerSec, float64(p.ExposedP50)/float64(chunk))
	if o := r.Options; o.Compute > 0 && o.Concurrency > 0 {
		// What the prefill asks of the backend: each prefill device hands
		// over one chunk per Compute. Above the raw rate the chunks queue
		// and the last one's transfer cannot hide behind compute.
		d := o.devices()
		offered := float64(d) * float64(r.Raw.SizeBytes) / o.Compute.Seconds()
		verdict := "below the raw rate: the transfer can hide behind compute"
		if offered > r.Raw.BytesPerSec {
			// With one device, fewer is no advice.
			fix := "a longer --compute, or a smaller --chunk-tokens"
			if d > 1 {
				fix = "fewer --prefill-devices, " + fix
			}
			verdict = "above the raw rate: chunks queue, the exposed window grows (" + fix + ", to see the overlap)"
		}
		fmt.Fprintf(w, "offered: %d prefill device(s) × one chunk per %v = %.2f GB/s, %.1fx raw, %s\n",
			d, o.Compute, offered/1e9, offered/r.Raw.BytesPerSec, verdict)
		if p.ChunkCompute > 0 && p.DeviceBusy > 0 {
			// What the devices offered in fact: a chunk holds its device
			// for Compute, or longer when the CPU's write of its KV takes
			// longer (a machine's memory bandwidth is shared by that
			// write, the transfer's copies and the byte checks), and a
			// request's last chunk is short but computes as long. While
			// busy they produced GB/s / DeviceBusy: GB/s is their pace
			// times the share of the wall they were kept busy.
			pace := p.BytesPerSec / p.DeviceBusy
			fmt.Fprintf(w, "%s prefill: a chunk held its device %s (p50); the devices wrote %.2f GB/s of KV while computing (%.2fx raw) and were busy %.0f%% of the wall\n",
				p.Mode, duration(p.ChunkCompute), pace/1e9, pace/r.Raw.BytesPerSec, 100*p.DeviceBusy)
		}
	}
}

// duration formats d for the report: under a millisecond in µs with one
// decimal (a tiny run's figures are not rounded to 0s), above rounded to
// 10µs.
func duration(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	}
	return d.Round(10 * time.Microsecond).String()
}
