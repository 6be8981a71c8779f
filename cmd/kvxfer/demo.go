package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/demo"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// demoKeys are the common settings demo takes, and its defaults.
var (
	demoKeys     = []string{config.Model, config.Pool, config.TokensPerBlock, config.Workers, config.Backend, config.Timeout, config.MetricsAddr}
	demoDefaults = map[string]string{config.Pool: "2GiB", config.Backend: "loopback", config.Timeout: "5m"}
	demoDocs     = map[string]string{config.TokensPerBlock: presetBlockDoc}
)

// demoFlags holds `kvxfer demo`'s own flags.
type demoFlags struct {
	o         demo.Options
	trace     traceFlags
	json      bool
	progress  bool
	processes int
	// cluster: context TP2 and generation TP1 as three processes that
	// find each other through an etcd this process runs.
	cluster bool
	// pool and the settings below are resolved from internal/config.
	pool        string
	timeout     string
	metricsAddr string
	backend     string
}

func newDemoCmd(a *app) *cobra.Command {
	f := demoFlags{o: demo.DefaultOptions()}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the demo workload and verify every byte",
		Long: `demo starts a context engine and a generation engine in this process on the
loopback backend (or --backend shm or ucx) and moves a batch of requests with chunked prefill, once
pipelined (each chunk leaves when its fence fires) and once transferring only
after prefill ends. It verifies every transferred byte, prints a table and
exits non-zero if a byte differs or a block leaks.

With --cluster this process starts an embedded etcd (TLS with client
certificates and etcd's user auth, as a production etcd runs), and a context
instance of TP2 (two kvxfer ctx processes) and a generation instance of TP1
(one kvxfer gen process) register there and find each other's endpoints and
CURVE public keys through it; a small workload by default (4 requests of 128..512
tokens, 192MiB pools), every byte verified, 0 leaked.

With --processes 2 the two engines run as separate processes (kvxfer ctx and
kvxfer gen) over ZeroMQ with CURVE and, by default, the ucx backend (shm in a
build without UCX).

Each engine's pool is --pool (2GiB by default). When the default cannot hold
the longest prompt (--max-tokens) of the model, the pool is sized to hold it:
2560MiB for Llama-3.1-70B, 4GiB for Gemma-3-27B. A --pool you set that is too
small for a prompt is an error at once, naming the size that fits. The two
pools are faulted in whole before the clock starts: a run whose pools exceed
the memory available (MemAvailable) is refused at once too, naming --pool,
or --max-tokens when the longest prompt alone needs pools that large.

A progress bar shows finished requests when standard output is a terminal;
otherwise each finished request is a log line on standard error.

--trace DIR records a replayable trace of each engine into a file of DIR
(kvxfer replay, kvxfer trace export). ` + traceRotationHelp,
		Example: examples(
			"the README's demo: 16 Llama-3.1-8B requests of 512..8192 tokens", "kvxfer demo",
			"a bigger model: pools sized to its 8k-token prompts (2560MiB each)", "kvxfer demo --model Llama-3.1-70B",
			"more workers, settings from a file overridden by a flag", "kvxfer demo --config kvxfer.yaml --model Llama-3.1-70B --workers 8",
			"machine-readable", "kvxfer demo --json > demo.json",
			"two processes (ucx, shm in a build without UCX), metrics of the context engine on :9464 (the generation engine's on :9465)", "kvxfer demo --processes 2 --metrics-addr 127.0.0.1:9464",
			"three processes (context TP2, generation TP1) discovering each other through an embedded etcd", "kvxfer demo --cluster",
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.processes != 1 && f.processes != 2 {
				return fmt.Errorf("--processes = %d: want 1 or 2", f.processes)
			}
			what := "demo --processes 2"
			if f.cluster {
				what = "demo --cluster"
			}
			if f.processes == 2 || f.cluster {
				for _, name := range slices.Sorted(maps.Keys(notAcrossProcesses)) {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s is not used by %s: %s", name, what, notAcrossProcesses[name])
					}
				}
			}
			s, err := a.settings(cmd, demoDefaults, demoKeys...)
			if err != nil {
				return err
			}
			f.o.Model, f.o.PoolBytes, f.o.TokensPerBlock, f.o.Workers, f.o.Timeout = s.Model, s.Pool, s.TokensPerBlock, s.Workers, s.Timeout
			f.o.PoolName = settingName(s, config.Pool)
			f.pool, f.timeout, f.metricsAddr = s.Origin(config.Pool).Raw, s.Timeout.String(), s.MetricsAddr
			if f.cluster {
				if err := clusterDefaults(cmd, &s, &f); err != nil {
					return err
				}
				if s.MetricsAddr != "" {
					return s.Invalid(config.MetricsAddr, "not served by demo --cluster (three engines; run kvxfer ctx and gen yourself)")
				}
			}
			if s.Origin(config.Pool).Source == config.SourceDefault {
				if err := fitPool(a, &f); err != nil {
					return err
				}
			}
			if f.o.TraceMaxBytes, f.o.TraceKeep, err = f.trace.resolve(cmd.Flags(), f.o.TraceDir, true); err != nil {
				return err
			}
			// Every option error, a pool too small for a prompt among
			// them, before anything starts: never a wait.
			if err := f.o.Check(); err != nil {
				return err
			}
			f.backend = s.Backend
			switch {
			case s.Backend == cudaipc.Backend:
				return s.Invalid(config.Backend, "demo runs over host memory: run kvxfer ctx and kvxfer gen with --backend cudaipc (each on its GPU: --device) for GPU to GPU")
			case (f.processes == 2 || f.cluster) && s.Origin(config.Backend).Source == config.SourceDefault:
				f.backend = crossProcessBackend()
			case f.processes == 2 || f.cluster:
				if err := checkCrossProcessBackend(s, what); err != nil {
					return err
				}
			case s.Backend == ucx.Backend && !ucx.Available:
				return s.Invalid(config.Backend, ucx.ErrUnavailable.Error())
			}
			f.o.Backend = f.backend
			if s.MetricsAddr != "" {
				gen, err := nextPort(s.MetricsAddr)
				if err != nil {
					return s.Invalid(config.MetricsAddr, err.Error())
				}
				f.o.MetricsAddr, f.o.GenMetricsAddr = s.MetricsAddr, gen
				f.o.Started = func(mode string, ce, ge *kvxfer.Engine) {
					a.log.Info().Str("mode", mode).Str("ctx", "http://"+ce.MetricsAddr()+"/metrics").
						Str("gen", "http://"+ge.MetricsAddr()+"/metrics").Msg("metrics")
				}
			}
			ctx, got, stop := interruptible(cmd.Context())
			defer stop()
			if f.cluster {
				return interrupted(got, runCluster(ctx, a, cmd, f))
			}
			if f.processes == 2 {
				return interrupted(got, runTwoProcesses(ctx, a, cmd, f))
			}
			return interrupted(got, runDemo(ctx, a, cmd, f))
		},
	}
	fl := cmd.Flags()
	addSettingFlags(fl, demoDefaults, demoDocs, demoKeys...)
	fl.IntVar(&f.o.Requests, "requests", f.o.Requests, "number of requests")
	fl.IntVar(&f.o.MinTokens, "min-tokens", f.o.MinTokens, "shortest prompt")
	fl.IntVar(&f.o.MaxTokens, "max-tokens", f.o.MaxTokens, "longest prompt")
	fl.IntVar(&f.o.ChunkTokens, "chunk-tokens", f.o.ChunkTokens, "prefill chunk size in tokens (a multiple of the block size)")
	fl.DurationVar(&f.o.Compute, "compute", f.o.Compute, "simulated prefill compute time per chunk")
	fl.IntVar(&f.o.Concurrency, "concurrency", f.o.Concurrency, "requests in flight")
	fl.IntVar(&f.o.LayerParts, "layer-parts", f.o.LayerParts, "layer ranges each chunk leaves in, each as the simulated forward pass computes it (0: one per layer; 1: the whole chunk at its end)")
	fl.IntVar(&f.o.PrefillDevices, "prefill-devices", f.o.PrefillDevices, "chunks the simulated prefill computes at once, shared by the requests in flight (0: one per request)")
	fl.Uint64Var(&f.o.Seed, "seed", f.o.Seed, "seed of the prompt-length shuffle")
	fl.StringVar(&f.o.TraceDir, "trace", "", "a directory (made if missing) to record a replayable trace of every session into, a file per engine and mode (kvxfer replay, kvxfer trace export); tracing slows the run")
	addTraceFlags(fl, &f.trace)
	fl.BoolVar(&f.json, "json", false, "print the report as JSON")
	fl.BoolVar(&f.progress, "progress", true, "report finished requests (a bar on a terminal, log lines otherwise)")
	fl.IntVar(&f.processes, "processes", 1, "1: both engines in this process; 2: separate ctx and gen processes (ZeroMQ with CURVE; ucx, or shm in a build without UCX)")
	fl.BoolVar(&f.cluster, "cluster", false, "an etcd in this process, a TP2 context (two processes) and a TP1 generation process that find each other through it")
	return cmd
}

// fitPool sizes the default pool to the model: 2GiB holds two 8k-token
// prompts of Llama-3.1-8B but not one of Llama-3.1-70B (2560MiB) or
// Gemma-3-27B (3968MiB), so when the longest prompt needs more, the pool
// grows to hold it (demo.FitPool). A pool the user chose is never changed:
// if it is too small, Check says so.
func fitPool(a *app, f *demoFlags) error {
	pool, err := demo.FitPool(f.o)
	if err != nil || pool == f.o.PoolBytes {
		return err
	}
	a.log.Info().Str("model", f.o.Model).Int("max_tokens", f.o.MaxTokens).Str("default", f.pool).
		Str("pool", config.FormatSize(pool)).Msg("pool sized to hold the longest prompt (set --pool to choose)")
	f.o.PoolBytes, f.pool = pool, config.FormatSize(pool)
	return nil
}

// nextPort is addr with its port plus one (port 0 stays 0).
func nextPort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65534 {
		return "", fmt.Errorf("port %q leaves no next port for the generation engine", port)
	}
	if n == 0 {
		return addr, nil
	}
	return net.JoinHostPort(host, strconv.Itoa(n+1)), nil
}

func runDemo(ctx context.Context, a *app, cmd *cobra.Command, f demoFlags) error {
	out := cmd.OutOrStdout()
	var progress io.Writer // one line per finished request, from demo.Run
	if f.progress {
		p := a.newProgress(cmd, 2*f.o.Requests, "demo", f.json)
		defer p.Done()
		progress = &lineWriter{p: p, total: 2 * f.o.Requests}
	}
	a.log.Debug().Str("backend", f.o.Backend).Str("model", f.o.Model).Int("workers", f.o.Workers).
		Str("pool", config.FormatSize(f.o.PoolBytes)).Msg("demo starting")
	rep, err := demo.Run(ctx, f.o, progress)
	if err != nil {
		return err
	}
	if f.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.Print(out)
	}
	if files := f.o.TraceFiles(); len(files) > 0 {
		ev := a.log.Info().Strs("traces", files)
		if f.o.TraceKeep > 0 {
			ev = ev.Int("trace_keep", f.o.TraceKeep).Str("rotated", "FILE.1 (newest) … FILE.N beside each, when it reached --trace-max-bytes")
		}
		ev.Msg("traces written (kvxfer replay FILE; kvxfer trace export --perfetto FILE OUT)")
	}
	if !rep.OK() {
		return fmt.Errorf("demo failed: a byte differed or a block leaked")
	}
	return nil
}
