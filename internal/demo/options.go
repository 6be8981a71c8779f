package demo

import (
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// ErrBadOption is a demo option out of its range. The message names the
// option by its `kvxfer demo` flag, the value and what the flag accepts.
var ErrBadOption = errors.New("demo: bad option")

// bad is the error for a value of flag outside what it accepts (want).
func bad(flag string, value any, want string) error {
	return fmt.Errorf("%w: --%s = %v: %s", ErrBadOption, flag, value, want)
}

// Options configures a demo run. Its JSON (demo --json's "options") names
// each field in snake_case with its unit: durations are nanoseconds
// (compute_ns, timeout_ns), sizes bytes.
type Options struct {
	Model       string `json:"model"`
	Requests    int    `json:"requests"`
	MinTokens   int    `json:"min_tokens"`
	MaxTokens   int    `json:"max_tokens"`
	ChunkTokens int    `json:"chunk_tokens"`
	// PoolBytes caps each side's pool, so requests wait for blocks
	// (0: kvxfer.DefaultPoolBytes). A prompt that needs more blocks than
	// the pool holds is an error at once (Check); FitPool sizes a pool to
	// the model.
	PoolBytes uint64 `json:"pool_bytes"`
	// PoolName is the pool's setting as the user gave it ("--pool",
	// "KVXFER_POOL", a file's key and line), named by errors about the
	// pool; empty is "--pool".
	PoolName string `json:"-"`
	// Compute is the simulated prefill time of one chunk.
	Compute     time.Duration `json:"compute_ns"`
	Workers     int           `json:"workers"`
	Concurrency int           `json:"concurrency"`
	// PrefillDevices is how many chunks the simulated context server
	// computes at once: the requests in flight share them, as a chunked-
	// prefill scheduler shares one GPU's forward passes between the
	// requests it admitted. 0 means one per request in flight (each request
	// its own device).
	PrefillDevices int `json:"prefill_devices"`
	// LayerParts is how many layer ranges the simulated forward pass hands
	// each chunk over in (pipelined mode), each as soon as it is computed;
	// 0 means one per layer, as a serving framework's per-layer save hook
	// (vLLM's save_kv_layer) does, and 1 the whole chunk at its end.
	LayerParts int    `json:"layer_parts"`
	Seed       uint64 `json:"seed"`
	// TokensPerBlock overrides the preset's block size when > 0.
	TokensPerBlock int `json:"tokens_per_block"`
	// Backend is "loopback" (the default), "shm" (the generation pool is
	// then a shared-memory file the context engine writes into, as across
	// processes) or "ucx" (two UCX agents; the pool is memory the
	// generation agent allocated).
	Backend string `json:"backend"`
	// Timeout bounds each request (default 5 minutes).
	Timeout time.Duration `json:"timeout_ns"`
	// MetricsAddr and GenMetricsAddr, when set, serve the context and the
	// generation engine's Prometheus metrics (kvxfer.Config.MetricsAddr).
	MetricsAddr    string `json:"metrics_addr,omitempty"`
	GenMetricsAddr string `json:"gen_metrics_addr,omitempty"`
	// TraceDir, when set, is a directory each engine of the run records a
	// replayable trace of every session into (kvxfer.Config.TracePath):
	// TraceFiles names them. Tracing costs each step an encode, so the
	// run's figures are not comparable with an untraced run's.
	TraceDir string `json:"trace_dir,omitempty"`
	// TraceMaxBytes and TraceKeep bound and rotate each trace file
	// (kvxfer.Config.TraceMaxBytes, TraceKeep).
	TraceMaxBytes int64 `json:"trace_max_bytes,omitempty"`
	TraceKeep     int   `json:"trace_keep,omitempty"`
	// Started, when set, is called once both engines of a mode run.
	Started func(mode string, ctx, gen *kvxfer.Engine) `json:"-"`
	// Probe, when set, observes the run (probe.go).
	Probe Probe `json:"-"`
}

// effective is o with each zero that stands for a default replaced by the
// value the run uses (the block size of l, the default pool, workers,
// timeout and backend): what a report says the run ran with.
func (o Options) effective(l kvcache.Layout) Options {
	o.TokensPerBlock = l.TokensPerBlock
	if o.PoolBytes == 0 {
		o.PoolBytes = kvxfer.DefaultPoolBytes
	}
	if o.Workers == 0 {
		o.Workers = kvxfer.DefaultWorkers
	}
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.Backend == "" {
		o.Backend = loopback.Backend
	}
	return o
}

// DefaultOptions is the demo of the README: Llama-3.1-8B, 16 requests of
// 512 to 8k tokens, 2 GiB pools.
func DefaultOptions() Options {
	return Options{Model: "Llama-3.1-8B", Requests: 16, MinTokens: 512, MaxTokens: 8192, ChunkTokens: 512,
		PoolBytes: 2 << 30, Compute: 15 * time.Millisecond, Workers: 4, Concurrency: 4, PrefillDevices: 1, Seed: 1}
}

// devices is the number of chunks the simulated prefill computes at once.
func (o Options) devices() int {
	if o.PrefillDevices == 0 || o.PrefillDevices > o.Concurrency {
		return o.Concurrency
	}
	return o.PrefillDevices
}

// parts splits a model of layers layers into o.LayerParts layer ranges (0:
// one per layer); one part is the whole chunk (the zero LayerPart).
func (o Options) parts(layers int) []kvcache.LayerPart {
	return kvcache.SplitLayers(layers, o.LayerParts)
}

// defaultTimeout bounds each request when Options.Timeout is 0.
const defaultTimeout = 5 * time.Minute

// maxRequests bounds Options.Requests: a run keeps a few words per request.
const maxRequests = 1 << 20

// fitStep is the granule FitPool rounds a model-sized pool up to.
const fitStep = 256 << 20

// Check validates o before any engine starts, so that a run either starts
// or fails at once; it never leaves a request waiting for blocks it can
// never get. It returns the first problem: an error wrapping ErrBadOption
// for an option out of range (naming the flag, the value and the range or
// the choices), or one wrapping kvcache.ErrPoolTooSmall when a prompt needs
// more blocks than a pool of o.PoolBytes holds (naming the request, the
// numbers and the --pool that fits). A PoolBytes of 0 stands for
// kvxfer.DefaultPoolBytes, a Workers of 0 for kvxfer.DefaultWorkers, a
// Timeout of 0 for 5 minutes and a TokensPerBlock of 0 for the model's.
func (o Options) Check() error {
	return o.check(meminfo.Available)
}

// check is Check with the memory available read by avail (ok false: not
// known, not checked).
func (o Options) check(avail func() (uint64, bool)) error {
	l, err := o.layout()
	if err != nil {
		return err
	}
	switch {
	case o.Requests < 1 || o.Requests > maxRequests:
		return bad("requests", o.Requests, fmt.Sprintf("want 1 to %d", maxRequests))
	case o.MinTokens < 1:
		return bad("min-tokens", o.MinTokens, "want at least 1")
	case o.MaxTokens < o.MinTokens:
		return bad("max-tokens", o.MaxTokens, fmt.Sprintf("want at least --min-tokens (%d)", o.MinTokens))
	case o.ChunkTokens < 1 || o.ChunkTokens%l.TokensPerBlock != 0:
		return bad("chunk-tokens", o.ChunkTokens, fmt.Sprintf("want a positive multiple of the block size, %d tokens (--tokens-per-block)", l.TokensPerBlock))
	case o.Concurrency < 1:
		return bad("concurrency", o.Concurrency, "want at least 1")
	case o.LayerParts < 0 || o.LayerParts > l.Layers:
		return bad("layer-parts", o.LayerParts, fmt.Sprintf("want 1 to %d, the layers of %s (0: one per layer)", l.Layers, l.Name))
	case o.PrefillDevices < 0:
		return bad("prefill-devices", o.PrefillDevices, "want at least 1 (0: one per request in flight)")
	case o.Workers < 0:
		return bad("workers", o.Workers, fmt.Sprintf("want at least 1 (0: %d)", kvxfer.DefaultWorkers))
	case o.Compute < 0:
		return bad("compute", o.Compute, "want 0 or more")
	case o.Timeout < 0:
		return bad("timeout", o.Timeout, fmt.Sprintf("want more than 0 (0: %v)", defaultTimeout))
	}
	switch o.Backend {
	case "", loopback.Backend, shm.Backend, ucx.Backend:
	default:
		return bad("backend", fmt.Sprintf("%q", o.Backend), fmt.Sprintf("want %s, %s or %s", loopback.Backend, shm.Backend, ucx.Backend))
	}
	if err := o.checkTraceDir(); err != nil {
		return err
	}
	if err := o.checkPool(l); err != nil {
		return err
	}
	return o.checkMemory(l, avail)
}

// checkTraceDir makes a TraceDir that does not exist, and refuses one that
// is not a directory this process can create files in, before either
// mode's engines run.
func (o Options) checkTraceDir() error {
	if o.TraceDir == "" {
		return nil
	}
	st, err := os.Stat(o.TraceDir)
	if errors.Is(err, fs.ErrNotExist) {
		// Made as bench --report makes its directory.
		if err := os.MkdirAll(o.TraceDir, 0o755); err != nil {
			return bad("trace", o.TraceDir, fmt.Sprintf("want a directory to write the traces into: %v", err))
		}
		st, err = os.Stat(o.TraceDir)
	}
	if err != nil {
		return bad("trace", o.TraceDir, fmt.Sprintf("want a directory to write the traces into: %v", err))
	}
	if !st.IsDir() {
		return bad("trace", o.TraceDir, "want a directory to write the traces into, not a file")
	}
	f, err := os.CreateTemp(o.TraceDir, ".kvxfer-demo-*")
	if err != nil {
		return bad("trace", o.TraceDir, fmt.Sprintf("cannot write into it: %v", err))
	}
	name := f.Name()
	return errors.Join(f.Close(), os.Remove(name))
}

// TraceFiles are the trace files a run with TraceDir writes: one per
// engine of each mode (Modes), in order.
func (o Options) TraceFiles() []string {
	if o.TraceDir == "" {
		return nil
	}
	var files []string
	for _, m := range Modes {
		files = append(files, traceFile(o.TraceDir, "ctx-"+m.Name), traceFile(o.TraceDir, "gen-"+m.Name))
	}
	return files
}

// traceFile is the trace of the engine named instance in dir.
func traceFile(dir, instance string) string {
	return filepath.Join(dir, instance+".jsonl")
}

// poolsAtOnce is how many pools of PoolBytes a demo run maps at once (the
// context and the generation engine's, or the two processes' of
// --processes 2), each touched in whole before the clock starts.
const poolsAtOnce = 2

// checkMemory fails, before anything is mapped, when the pools a run maps
// and touches exceed the memory available (MemAvailable): past it the run
// would fail with a bare mmap error, or push the host into swap or the
// OOM killer while it faults the pools in. It names --max-tokens when the
// longest prompt alone needs pools that large, else --pool, and the
// memory available.
func (o Options) checkMemory(l kvcache.Layout, avail func() (uint64, bool)) error {
	have, ok := avail()
	if !ok {
		return nil
	}
	pool := o.PoolBytes
	if pool == 0 {
		pool = kvxfer.DefaultPoolBytes
	}
	if hi, need := bits.Mul64(pool, poolsAtOnce); hi == 0 && need <= have {
		return nil
	}
	longest, err := poolFor(l, o.MaxTokens)
	if err != nil {
		return err
	}
	longest = roundUp(longest, 1<<20)
	if hi, need := bits.Mul64(longest, poolsAtOnce); hi != 0 || need > have {
		return bad("max-tokens", o.MaxTokens, fmt.Sprintf("each engine's pool must hold a %d-token prompt of %s, %s; %d such pools (context and generation, every page touched) are more than the %s of memory available (MemAvailable): use a smaller --max-tokens",
			o.MaxTokens, l.Name, config.FormatSize(longest), poolsAtOnce, roughSize(have)))
	}
	return fmt.Errorf("%w: %s = %v: %d pools of it (context and generation, every page touched) are more than the %s of memory available (MemAvailable): use a %s of at most %s (a %d-token prompt of %s, --max-tokens, needs %s)",
		ErrBadOption, o.poolName(), config.FormatSize(pool), poolsAtOnce, roughSize(have), o.poolName(), config.FormatSize(have/poolsAtOnce/(1<<20)*(1<<20)), o.MaxTokens, l.Name, config.FormatSize(longest))
}

// poolName is how the user set the pool: PoolName, or "--pool".
func (o Options) poolName() string {
	if o.PoolName == "" {
		return "--pool"
	}
	return o.PoolName
}

// roughSize is n bytes in GiB or MiB to one decimal ("22.8GiB"), for a
// figure such as the memory available that is no exact multiple.
func roughSize(n uint64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
}

// checkPool fails when some prompt of o needs more blocks, in some layer
// group, than an engine carves out of a pool of o.PoolBytes.
func (o Options) checkPool(l kvcache.Layout) error {
	pool := o.PoolBytes
	if pool == 0 {
		pool = kvxfer.DefaultPoolBytes
	}
	geoms, err := poolGeometries(l, pool)
	if err != nil {
		return err
	}
	longest, n := longestPrompt(o.prompts())
	for g, geom := range geoms {
		if err := geom.CheckFits(l.BlocksFor(n)); err != nil {
			need, nerr := poolFor(l, n)
			use := "a larger pool"
			if nerr == nil {
				use = o.poolName() + " ≥ " + config.FormatSize(roundUp(need, 1<<20))
			}
			return fmt.Errorf("demo: %s = %s is too small: request %d (%d tokens of %s), layer group %d: %w; use %s",
				o.poolName(), config.FormatSize(pool), longest, n, l.Name, g, err, use)
		}
	}
	return nil
}

// PoolFor returns the smallest pool, in bytes, in which each engine of a
// demo run holds o's longest prompt (MaxTokens) in every layer group. Its
// error wraps ErrBadOption for an unknown model or block size, or a prompt
// whose pool would not fit in 64 bits.
func PoolFor(o Options) (uint64, error) {
	l, err := o.layout()
	if err != nil {
		return 0, err
	}
	return poolFor(l, o.MaxTokens)
}

// layout is o's model layout with o's block size.
func (o Options) layout() (kvcache.Layout, error) {
	l, err := kvcache.Preset(o.Model)
	if err != nil {
		return l, bad("model", fmt.Sprintf("%q", o.Model), "unknown model (known: "+strings.Join(kvcache.Presets(), ", ")+")")
	}
	switch {
	case o.TokensPerBlock < 0:
		return l, bad("tokens-per-block", o.TokensPerBlock, fmt.Sprintf("want at least 1 (0: the model's, %d)", l.TokensPerBlock))
	case o.TokensPerBlock > 0:
		l = l.WithTokensPerBlock(o.TokensPerBlock)
		if err := l.Validate(); err != nil {
			return l, bad("tokens-per-block", o.TokensPerBlock, err.Error())
		}
	}
	return l, nil
}

// FitPool returns the pool a demo of o runs with when the user chose none:
// o.PoolBytes, or, when o's longest prompt needs more (Llama-3.1-70B's 8k
// tokens take 2560MiB, Gemma-3-27B's 3968MiB), that need rounded up to a
// multiple of 256MiB. Each of the two engines of a mode has a pool that
// size; a pool that holds one longest prompt runs the longest prompts one
// at a time.
func FitPool(o Options) (uint64, error) {
	need, err := PoolFor(o)
	if err != nil {
		return 0, err
	}
	return max(o.PoolBytes, roundUp(need, fitStep)), nil
}

// poolFor is the bytes a pool needs for n tokens of l in every layer group:
// kvxfer.Start gives every group PoolBytes / (one block of each group)
// blocks (a single rank, tensor and pipeline parallelism 1).
func poolFor(l kvcache.Layout, n int) (uint64, error) {
	if n < 1 {
		return 0, bad("max-tokens", n, "want at least 1")
	}
	set, err := blockSet(l)
	if err != nil {
		return 0, err
	}
	hi, need := bits.Mul64(uint64(l.BlocksFor(n)), set)
	if hi != 0 {
		return 0, bad("max-tokens", n, fmt.Sprintf("its %d blocks of %d bytes do not fit in 64 bits", l.BlocksFor(n), set))
	}
	return need, nil
}

// poolGeometries is how kvxfer.Start carves a pool of poolBytes for l.
func poolGeometries(l kvcache.Layout, poolBytes uint64) ([]kvcache.PoolGeometry, error) {
	set, err := blockSet(l)
	if err != nil {
		return nil, err
	}
	geoms := make([]kvcache.PoolGeometry, len(l.Groups))
	var off uint64
	for g := range l.Groups {
		bb := uint64(l.BlockBytes(g))
		geoms[g] = kvcache.PoolGeometry{Offset: off, BlockBytes: bb, Blocks: int(poolBytes / set)}
		off += bb * (poolBytes / set)
	}
	return geoms, nil
}

// blockSet is the bytes of one block of every layer group of l on a single
// rank.
func blockSet(l kvcache.Layout) (uint64, error) {
	p := kvcache.Parallel{TP: 1, PP: 1}
	shape, err := l.Shape(p, kvcache.Rank{})
	if err != nil {
		return 0, fmt.Errorf("%w: model %s: %w", ErrBadOption, l.Name, err)
	}
	var set uint64
	for g := range l.Groups {
		set += shape.BlockBytes(l, g)
	}
	return set, nil
}

func roundUp(n, step uint64) uint64 { return (n + step - 1) / step * step }

// prompts are the prompt lengths of o's requests, request i's at index i:
// spread evenly from MinTokens to MaxTokens (MaxTokens alone for one
// request), shuffled by Seed.
func (o Options) prompts() []int {
	rng := rand.New(rand.NewPCG(o.Seed, 0x6b7678666572))
	prompts := make([]int, o.Requests)
	for i := range prompts {
		if o.Requests == 1 {
			prompts[i] = o.MaxTokens
		} else {
			prompts[i] = o.MinTokens + (o.MaxTokens-o.MinTokens)*i/(o.Requests-1)
		}
	}
	rng.Shuffle(len(prompts), func(i, j int) { prompts[i], prompts[j] = prompts[j], prompts[i] })
	return prompts
}

// longestPrompt returns the first request with the longest prompt, and
// that prompt's length.
func longestPrompt(prompts []int) (request, tokens int) {
	for i, n := range prompts {
		if n > prompts[request] {
			request = i
		}
	}
	return request, prompts[request]
}
