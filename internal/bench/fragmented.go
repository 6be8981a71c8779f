package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

// FragmentedConfig configures Fragmented.
type FragmentedConfig struct {
	Backend        string // default loopback
	Model          string // default Llama-3.1-8B
	TokensPerBlock int    // default 16
	Tokens         int    // per request, default 512
	Requests       int    // per sample, default 16
	Rounds         int    // default 3
	Workers        int
	Timeout        time.Duration
	Seed           uint64
	Progress       ProgressFunc
}

// FragmentedResult compares requests between fresh pools (block ids
// consecutive on both sides: one segment per chunk) with requests between
// fragmented pools (ids shuffled on both sides).
type FragmentedResult struct {
	Backend        string         `json:"backend"`
	Model          string         `json:"model"`
	TokensPerBlock int            `json:"tokens_per_block"`
	Tokens         int            `json:"tokens"`
	RequestBytes   uint64         `json:"request_bytes"`
	Requests       int            `json:"requests"`
	Rounds         int            `json:"rounds"`
	Contiguous     FragmentedSide `json:"contiguous"`
	Fragmented     FragmentedSide `json:"fragmented"`
	// Ratio is the fragmented bandwidth over the contiguous one.
	Ratio float64 `json:"ratio"`
}

// FragmentedSide is one pool state's figures (medians; one request in
// flight).
type FragmentedSide struct {
	SegmentsPerRequest float64       `json:"segments_per_request"`
	BytesPerSec        float64       `json:"bytes_per_sec"`
	LatencyP50         time.Duration `json:"latency_p50_ns"`
}

// Fragmented alternates samples of one-at-a-time requests on a contiguous
// pair and a fragmented pair.
func Fragmented(ctx context.Context, cfg FragmentedConfig) (FragmentedResult, error) {
	if cfg.Model == "" {
		cfg.Model = "Llama-3.1-8B"
	}
	if cfg.TokensPerBlock == 0 {
		cfg.TokensPerBlock = 16
	}
	if cfg.Tokens == 0 {
		cfg.Tokens = 512
	}
	if cfg.Requests == 0 {
		cfg.Requests = 16
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 3
	}
	l, err := kvcache.Preset(cfg.Model)
	if err != nil {
		return FragmentedResult{}, err
	}
	l = l.WithTokensPerBlock(cfg.TokensPerBlock)
	if err := l.Validate(); err != nil {
		return FragmentedResult{}, err
	}
	res := FragmentedResult{Backend: cfg.Backend, Model: l.Name, TokensPerBlock: cfg.TokensPerBlock, Tokens: cfg.Tokens,
		RequestBytes: RequestBytes(l, cfg.Tokens), Requests: cfg.Requests, Rounds: cfg.Rounds}
	if res.Backend == "" {
		res.Backend = "loopback"
	}
	// Four requests' worth: a fragmented pool scatters over all of it.
	pool := 4*(res.RequestBytes+uint64(l.BlockBytes(0))) + 1<<20
	var pairs [2]*Pair
	for i, frag := range []bool{false, true} {
		p, err := NewPair(ctx, PairConfig{Backend: cfg.Backend, Layout: l, PoolBytes: pool, Workers: cfg.Workers,
			Timeout: cfg.Timeout, Fragment: frag, Seed: cfg.Seed})
		if err != nil {
			return res, err
		}
		defer func() { _ = p.Close(ctx) }()
		pairs[i] = p
		if _, err := sample(ctx, p, "warm", cfg.Tokens, 1, 4); err != nil {
			return res, err
		}
	}
	var bw, segs [2][]float64
	var lat [2][]time.Duration
	total, done := 2*cfg.Rounds, 0
	for r := range cfg.Rounds {
		for i, p := range pairs {
			s, err := sample(ctx, p, fmt.Sprintf("r%d", r), cfg.Tokens, 1, cfg.Requests)
			if err != nil {
				return res, err
			}
			bw[i] = append(bw[i], s.bytesPerSec)
			segs[i] = append(segs[i], s.segments)
			lat[i] = append(lat[i], s.lat...)
			cfg.Progress.step(&done, total, []string{"contiguous", "fragmented"}[i])
		}
	}
	side := func(i int) FragmentedSide {
		return FragmentedSide{SegmentsPerRequest: rdmabench.Median(segs[i]), BytesPerSec: rdmabench.Median(bw[i]), LatencyP50: quantile(lat[i], 0.5)}
	}
	res.Contiguous, res.Fragmented = side(0), side(1)
	res.Ratio = res.Fragmented.BytesPerSec / res.Contiguous.BytesPerSec
	return res, nil
}
