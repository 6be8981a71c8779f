package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/internal/demo"
)

// demoFlags holds `kvxfer demo`'s flags.
type demoFlags struct {
	o         demo.Options
	pool      string
	json      bool
	progress  bool
	processes int
}

func newDemoCmd() *cobra.Command {
	f := demoFlags{o: demo.DefaultOptions()}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the demo workload in one process and verify every byte",
		Long: `demo starts a context engine and a generation engine in this process on the
loopback backend and moves a batch of requests with chunked prefill, once
pipelined (each chunk leaves when its fence fires) and once transferring only
after prefill ends. It verifies every transferred byte, prints a table and
exits non-zero if a byte differs or a block leaks.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := ParseSize(f.pool)
			if err != nil {
				return fmt.Errorf("--pool: %w", err)
			}
			f.o.PoolBytes = n
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			switch f.processes {
			case 1:
				return runDemo(ctx, cmd, f)
			case 2:
				return runTwoProcesses(ctx, cmd, f)
			}
			return fmt.Errorf("--processes = %d: want 1 or 2", f.processes)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.o.Model, "model", f.o.Model, "model preset (see kvxfer info)")
	fl.IntVar(&f.o.Requests, "requests", f.o.Requests, "number of requests")
	fl.IntVar(&f.o.MinTokens, "min-tokens", f.o.MinTokens, "shortest prompt")
	fl.IntVar(&f.o.MaxTokens, "max-tokens", f.o.MaxTokens, "longest prompt")
	fl.IntVar(&f.o.ChunkTokens, "chunk-tokens", f.o.ChunkTokens, "prefill chunk size in tokens (a multiple of the block size)")
	fl.DurationVar(&f.o.Compute, "compute", f.o.Compute, "simulated prefill compute time per chunk")
	fl.IntVar(&f.o.Workers, "workers", f.o.Workers, "sender workers per engine")
	fl.IntVar(&f.o.Concurrency, "concurrency", f.o.Concurrency, "requests in flight")
	fl.Uint64Var(&f.o.Seed, "seed", f.o.Seed, "seed of the prompt-length shuffle")
	fl.StringVar(&f.pool, "pool", "2GiB", "each side's pool size")
	fl.BoolVar(&f.json, "json", false, "print the report as JSON")
	fl.BoolVar(&f.progress, "progress", true, "print a line per finished request")
	fl.IntVar(&f.processes, "processes", 1, "1: both engines in this process (loopback); 2: separate ctx and gen processes (ZeroMQ + shared memory)")
	return cmd
}

func runDemo(ctx context.Context, cmd *cobra.Command, f demoFlags) error {
	out := cmd.OutOrStdout()
	var progress = cmd.ErrOrStderr()
	if !f.progress || f.json {
		progress = nil
	}
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
	if !rep.OK() {
		return fmt.Errorf("demo failed: a byte differed or a block leaked")
	}
	return nil
}
