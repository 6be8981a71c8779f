package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
)

// E2EConfig configures E2E.
type E2EConfig struct {
	Backend string // default loopback
	Model   string // default Llama-3.1-8B
	// TokensPerBlock overrides the preset's when > 0.
	TokensPerBlock int
	// Requests prompts spread evenly over [MinTokens, MaxTokens], shuffled
	// (defaults 16, 512, 2048); ChunkTokens per prefill chunk (default
	// 256), Compute per chunk (0: none, the transfer alone; the CLI's
	// default is 10ms); Concurrency requests in flight (default 4).
	Requests             int
	MinTokens, MaxTokens int
	ChunkTokens          int
	Compute              time.Duration
	Concurrency          int
	Workers              int
	PoolBytes            uint64 // each side; default: Concurrency+1 largest requests
	Timeout              time.Duration
	Seed                 uint64
	Progress             ProgressFunc
}

func (c *E2EConfig) defaults() {
	if c.Backend == "" {
		c.Backend = "loopback"
	}
	if c.Model == "" {
		c.Model = "Llama-3.1-8B"
	}
	if c.Requests == 0 {
		c.Requests = 16
	}
	if c.MinTokens == 0 {
		c.MinTokens = 512
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = 2048
	}
	if c.ChunkTokens == 0 {
		c.ChunkTokens = 256
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
}

// E2EResult is a batch of whole requests, pipelined and (for comparison)
// transferred only after prefill.
type E2EResult struct {
	Backend     string        `json:"backend"`
	Model       string        `json:"model"`
	Requests    int           `json:"requests"`
	MinTokens   int           `json:"min_tokens"`
	MaxTokens   int           `json:"max_tokens"`
	ChunkTokens int           `json:"chunk_tokens"`
	Compute     time.Duration `json:"compute_per_chunk_ns"`
	Concurrency int           `json:"concurrency"`
	Modes       []E2EMode     `json:"modes"`
}

// E2EMode is one way of running the batch.
type E2EMode struct {
	Mode  string        `json:"mode"` // "pipelined" or "after-prefill"
	Bytes uint64        `json:"bytes"`
	Wall  time.Duration `json:"wall_ns"`
	// BytesPerSec is Bytes over Wall (prefill compute included).
	BytesPerSec float64 `json:"bytes_per_sec"`
	// Exposed is each request's last fence → READY, in request order.
	ExposedP50 time.Duration   `json:"exposed_p50_ns"`
	ExposedP99 time.Duration   `json:"exposed_p99_ns"`
	Exposed    []time.Duration `json:"exposed_ns"`
}

// E2E runs the batch pipelined, then after prefill, on one pair.
func E2E(ctx context.Context, cfg E2EConfig) (E2EResult, error) {
	cfg.defaults()
	if cfg.Requests < 1 || cfg.MinTokens < 1 || cfg.MaxTokens < cfg.MinTokens || cfg.Concurrency < 1 {
		return E2EResult{}, fmt.Errorf("bench e2e: requests %d, tokens %d..%d, concurrency %d",
			cfg.Requests, cfg.MinTokens, cfg.MaxTokens, cfg.Concurrency)
	}
	l, err := kvcache.Preset(cfg.Model)
	if err != nil {
		return E2EResult{}, err
	}
	if cfg.TokensPerBlock > 0 {
		l = l.WithTokensPerBlock(cfg.TokensPerBlock)
	}
	if err := l.Validate(); err != nil {
		return E2EResult{}, err
	}
	if _, err := kvcache.Chunks(cfg.MaxTokens, cfg.ChunkTokens, l.TokensPerBlock); err != nil {
		return E2EResult{}, err
	}
	prompts := make([]int, cfg.Requests)
	for i := range prompts {
		prompts[i] = cfg.MaxTokens
		if cfg.Requests > 1 {
			prompts[i] = cfg.MinTokens + (cfg.MaxTokens-cfg.MinTokens)*i/(cfg.Requests-1)
		}
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x653265))
	rng.Shuffle(len(prompts), func(i, j int) { prompts[i], prompts[j] = prompts[j], prompts[i] })
	pool := cfg.PoolBytes
	if pool == 0 {
		var perSet uint64
		for g := range l.Groups {
			perSet += uint64(l.BlockBytes(g))
		}
		pool = uint64(cfg.Concurrency+1)*uint64(l.BlocksFor(cfg.MaxTokens)+1)*perSet + 1<<20
	}
	p, err := NewPair(ctx, PairConfig{Backend: cfg.Backend, Layout: l, PoolBytes: pool, Workers: cfg.Workers, Timeout: cfg.Timeout})
	if err != nil {
		return E2EResult{}, err
	}
	defer func() { _ = p.Close(ctx) }()
	res := E2EResult{Backend: p.cfg.Backend, Model: l.Name, Requests: cfg.Requests, MinTokens: cfg.MinTokens,
		MaxTokens: cfg.MaxTokens, ChunkTokens: cfg.ChunkTokens, Compute: cfg.Compute, Concurrency: cfg.Concurrency}
	done := 0
	for _, mode := range []struct {
		name      string
		pipelined bool
	}{{"pipelined", true}, {"after-prefill", false}} {
		t0 := time.Now()
		s, err := sampleSpecs(ctx, p, cfg.Concurrency, len(prompts), func(i int) RequestSpec {
			return RequestSpec{ID: fmt.Sprintf("%s-%d", mode.name, i), Tokens: prompts[i], ChunkTokens: cfg.ChunkTokens,
				Compute: cfg.Compute, Pipelined: mode.pipelined}
		})
		if err != nil {
			return res, fmt.Errorf("bench e2e %s: %w", mode.name, err)
		}
		m := E2EMode{Mode: mode.name, Wall: time.Since(t0)}
		for _, r := range s.results {
			m.Bytes += r.Bytes
			m.Exposed = append(m.Exposed, r.Exposed())
		}
		m.BytesPerSec = float64(m.Bytes) / m.Wall.Seconds()
		m.ExposedP50, m.ExposedP99 = quantile(m.Exposed, 0.5), quantile(m.Exposed, 0.99)
		res.Modes = append(res.Modes, m)
		cfg.Progress.step(&done, 2, mode.name)
	}
	return res, nil
}
