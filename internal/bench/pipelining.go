package bench

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// PipeliningResult compares the exposed latency of a pipelined request
// (from its last chunk's fence to READY) with one chunk's whole transfer.
type PipeliningResult struct {
	ChunkTokens int
	ChunkBytes  uint64
	Chunks      int
	Compute     time.Duration
	// OneChunk is the median fence→READY latency of a one-chunk request whose
	// fence fires after one chunk's compute (as a pipelined chunk's does):
	// one chunk's transfer, fully exposed.
	OneChunk time.Duration
	// Exposed is the median fence→READY latency of the last chunk of a
	// pipelined Chunks-chunk request with Compute per chunk.
	Exposed time.Duration
	// Serial is the median fence→READY latency when all chunks are handed
	// over only after prefill ends.
	Serial time.Duration
	// Bound is 1.1 × OneChunk + 100 µs.
	Bound time.Duration
	// Warmup is the fence→READY latency of the warm-up request (pipelined,
	// no compute) run before the measured ones and left out of the
	// medians: the first request through fresh pools pays their page
	// faults, which would make a one-rep run's figures nonsense.
	Warmup time.Duration
}

// Pipelining measures, on the loopback backend with the given preset,
// reps requests of each kind, one at a time.
func Pipelining(ctx context.Context, model string, chunkTokens, chunks int, compute time.Duration, reps int) (PipeliningResult, error) {
	link := control.NewMemLink()
	l, err := kvcache.Preset(model)
	if err != nil {
		return PipeliningResult{}, err
	}
	prompt := chunkTokens * chunks
	pool := uint64(l.BlocksFor(prompt)+8) * uint64(l.BlockBytes(0)) * uint64(len(l.Groups))
	start := func(inst string) (*kvxfer.Engine, error) {
		return kvxfer.Start(ctx, kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: pool, Link: link, TransferTimeout: time.Minute})
	}
	ce, err := start("ctx")
	if err != nil {
		return PipeliningResult{}, err
	}
	defer func() { _ = ce.Close(ctx) }()
	ge, err := start("gen")
	if err != nil {
		return PipeliningResult{}, err
	}
	defer func() { _ = ge.Close(ctx) }()
	r := PipeliningResult{ChunkTokens: chunkTokens, Chunks: chunks, Compute: compute,
		ChunkBytes: uint64(chunkTokens * l.BytesPerToken())}
	// A warm-up request first, as Timelines runs one: it touches the
	// pages of both pools' blocks.
	if r.Warmup, err = exposed(ctx, ce, ge, l, "warm", prompt, chunkTokens, 0, true); err != nil {
		return r, fmt.Errorf("warm-up request: %w", err)
	}
	var one, pipe, serial []time.Duration
	for i := 0; i < reps; i++ {
		// One chunk alone, its fence fired after the same compute as a
		// pipelined chunk: both are measured from an engine that sat idle
		// through a chunk's compute (waking idle threads costs a few
		// hundred µs on 2 cores), so the bound compares like with like.
		d, err := exposed(ctx, ce, ge, l, fmt.Sprintf("one-%d", i), chunkTokens, chunkTokens, compute, true)
		if err != nil {
			return r, err
		}
		one = append(one, d)
		if d, err = exposed(ctx, ce, ge, l, fmt.Sprintf("pipe-%d", i), prompt, chunkTokens, compute, true); err != nil {
			return r, err
		}
		pipe = append(pipe, d)
		if d, err = exposed(ctx, ce, ge, l, fmt.Sprintf("serial-%d", i), prompt, chunkTokens, compute, false); err != nil {
			return r, err
		}
		serial = append(serial, d)
	}
	r.OneChunk, r.Exposed, r.Serial = median(one), median(pipe), median(serial)
	r.Bound = r.OneChunk*11/10 + 100*time.Microsecond
	return r, nil
}

func median(d []time.Duration) time.Duration {
	sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
	return d[len(d)/2]
}

// exposed runs one request and returns the time from its last fence to the
// generation side's READY.
func exposed(ctx context.Context, ce, ge *kvxfer.Engine, l kvcache.Layout, id string, prompt, chunkTokens int, compute time.Duration, pipelined bool) (time.Duration, error) {
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(prompt)
	}
	src, err := ce.Pools().Alloc(counts)
	if err != nil {
		return 0, err
	}
	defer func() { _ = ce.Pools().Free(src) }()
	rx, err := ge.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: prompt, Context: "ctx"})
	if err != nil {
		return 0, err
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: prompt})
	if err != nil {
		return 0, err
	}
	cs, err := kvcache.Chunks(prompt, chunkTokens, l.TokensPerBlock)
	if err != nil {
		return 0, err
	}
	runs := func(c kvcache.Chunk) []kvcache.BlockRun { return c.Runs(l.TokensPerBlock, src) }
	var last time.Time
	if pipelined {
		for _, c := range cs {
			f := &kvxfer.ManualFence{}
			if err := tx.Chunk(c, runs(c), f); err != nil {
				return 0, err
			}
			time.Sleep(compute) // simulated prefill of this chunk
			last = time.Now()
			f.Fire(nil)
		}
	} else {
		time.Sleep(compute * time.Duration(len(cs)))
		last = time.Now()
		for _, c := range cs {
			if err := tx.Chunk(c, runs(c), nil); err != nil {
				return 0, err
			}
		}
	}
	o := <-rx.Done()
	d := time.Since(last)
	to := <-tx.Done()
	if !o.OK || !to.OK {
		return 0, fmt.Errorf("%s: rx %s %v, tx %s %v", id, o.Status, o.Err, to.Status, to.Err)
	}
	return d, ge.FreeBlocks(o.Blocks)
}

// PipeliningSweep is Pipelining at each chunk size for one prompt, with
// prefill compute proportional to the chunk (computePerToken), so that the
// whole prefill takes the same time at every size.
type PipeliningSweep struct {
	Model           string             `json:"model"`
	Prompt          int                `json:"prompt_tokens"`
	ComputePerToken time.Duration      `json:"compute_per_token_ns"`
	Points          []PipeliningResult `json:"points"`
}

// CheckChunkSize says why a pipelining chunk of chunkTokens does not fit a
// prompt of model (nil when it does): it must be a positive multiple of
// the preset's block size that divides prompt.
func CheckChunkSize(model string, prompt, chunkTokens int) error {
	l, err := kvcache.Preset(model)
	if err != nil {
		return err
	}
	switch {
	case chunkTokens < 1 || chunkTokens%l.TokensPerBlock != 0:
		return fmt.Errorf("a chunk of %d tokens is not a positive multiple of %s's block, %d tokens", chunkTokens, l.Name, l.TokensPerBlock)
	case prompt%chunkTokens != 0:
		return fmt.Errorf("a chunk of %d tokens does not divide the %d-token prompt", chunkTokens, prompt)
	}
	return nil
}

// SweepPipelining runs Pipelining for each chunk size (each a multiple of
// the preset's block size dividing prompt; all are checked before any
// runs).
func SweepPipelining(ctx context.Context, model string, prompt int, chunkSizes []int, computePerToken time.Duration, reps int, progress ProgressFunc) (PipeliningSweep, error) {
	sw := PipeliningSweep{Model: model, Prompt: prompt, ComputePerToken: computePerToken}
	if computePerToken < 0 || reps < 1 {
		return sw, fmt.Errorf("bench pipelining: compute per token %v, reps %d: want 0 or more, and at least 1", computePerToken, reps)
	}
	for _, ct := range chunkSizes {
		if err := CheckChunkSize(model, prompt, ct); err != nil {
			return sw, fmt.Errorf("bench pipelining: %w", err)
		}
	}
	done := 0
	for _, ct := range chunkSizes {
		r, err := Pipelining(ctx, model, ct, prompt/ct, computePerToken*time.Duration(ct), reps)
		if err != nil {
			return sw, fmt.Errorf("bench pipelining: chunks of %d tokens: %w", ct, err)
		}
		sw.Points = append(sw.Points, r)
		progress.step(&done, len(chunkSizes), fmt.Sprintf("chunks of %d tokens", ct))
	}
	return sw, nil
}

// ChunkBar is one chunk on a request's timeline, as offsets from the start
// of its prefill: compute (handed over → fence fired; after prefill, the
// chunk's slot in the prefill), then in transfer (its fence fired → its op
// completed: waiting for the endpoint, posted, copied).
type ChunkBar struct {
	Chunk         int           `json:"chunk"`
	ComputeStart  time.Duration `json:"compute_start_ns"`
	ComputeEnd    time.Duration `json:"compute_end_ns"`
	TransferStart time.Duration `json:"transfer_start_ns"`
	TransferEnd   time.Duration `json:"transfer_end_ns"`
}

// ChunkTimeline is one request's chunks and when it was READY.
type ChunkTimeline struct {
	Mode    string        `json:"mode"`
	Chunks  []ChunkBar    `json:"chunks"`
	Ready   time.Duration `json:"ready_ns"`
	Exposed time.Duration `json:"exposed_ns"`
}

// Timelines records one request pipelined and one after prefill (chunks of
// chunkTokens, compute per chunk) and returns their chunk timelines.
func Timelines(ctx context.Context, model string, chunkTokens, chunks int, compute time.Duration) ([]ChunkTimeline, error) {
	l, err := kvcache.Preset(model)
	if err != nil {
		return nil, err
	}
	prompt := chunkTokens * chunks
	pool := uint64(l.BlocksFor(prompt)+8) * uint64(l.BlockBytes(0)) * uint64(len(l.Groups))
	p, err := NewPair(ctx, PairConfig{Layout: l, PoolBytes: pool, Record: true})
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Close(ctx) }()
	if _, err := p.Run(ctx, RequestSpec{ID: "warm", Tokens: prompt, ChunkTokens: chunkTokens}); err != nil {
		return nil, err
	}
	var out []ChunkTimeline
	for _, pipelined := range []bool{true, false} {
		mode := map[bool]string{true: "pipelined", false: "after-prefill"}[pipelined]
		r, err := p.Run(ctx, RequestSpec{ID: mode, Tokens: prompt, ChunkTokens: chunkTokens, Compute: compute, Pipelined: pipelined})
		if err != nil {
			return nil, err
		}
		tl, ok := p.Timeline().Request(mode)
		if !ok {
			return nil, fmt.Errorf("bench timeline: no events recorded for request %s", mode)
		}
		t0 := r.ComputeStart
		ct := ChunkTimeline{Mode: mode, Ready: r.Ready.Sub(t0), Exposed: r.Exposed()}
		for i, c := range tl.Chunks {
			b := ChunkBar{Chunk: i, TransferStart: c.Fenced.Sub(t0), TransferEnd: c.Done.Sub(t0)}
			if pipelined {
				b.ComputeStart, b.ComputeEnd = c.Handed.Sub(t0), c.Fenced.Sub(t0)
			} else {
				b.ComputeStart, b.ComputeEnd = compute*time.Duration(i), compute*time.Duration(i+1)
			}
			ct.Chunks = append(ct.Chunks, b)
		}
		out = append(out, ct)
	}
	return out, nil
}
