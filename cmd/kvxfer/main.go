// Command kvxfer runs kvxfer standalone. Each subcommand is built in its
// own file and added to the root in newRootCmd: demo (demo.go), ctx, gen
// and keygen (proc.go), bench (bench.go, bench_scenarios.go), replay,
// trace export, info and version. The engine commands take their common
// settings from a YAML file, the environment and flags (internal/config,
// docs/configuration.md); logs go to standard error through zerolog.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	"github.com/kvxfer/kvxfer/internal/sysmon"
)

func main() {
	// First of all: GODEBUG is read once, at the runtime's start (see
	// internal/sysmon for why and how to opt out).
	if err := sysmon.Reexec(); err != nil {
		fmt.Fprintf(os.Stderr, "kvxfer: %v; the Go runtime's sysmon keeps its default deep sleep (set %s=deep to skip this)\n", err, sysmon.OptOut)
	}
	// After the re-exec, so that it is said once.
	if v := os.Getenv(sysmon.OptOut); v != "" && v != "deep" {
		fmt.Fprintf(os.Stderr, "kvxfer: warning: %s=%q ignored: the only value it takes is deep (leave the Go runtime's sysmon its default deep sleep)\n", sysmon.OptOut, v)
	}
	// The collector waits for a heap floor (internal/gcfloor).
	if _, err := gcfloor.FromEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "kvxfer: %v\n", err)
		os.Exit(2)
	}
	if err := newRootCmd().Execute(); err != nil {
		os.Exit(exitCode(err)) // cobra has printed the error
	}
}

// newRootCmd builds the command tree.
func newRootCmd() *cobra.Command {
	return newRootCmdWith(newApp())
}

func newRootCmdWith(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvxfer",
		Short: "kvxfer moves KV-cache pages between LLM serving instances",
		Long: `kvxfer moves a prompt's KV cache, chunk by chunk while prefill runs, from a
context (prefill) engine into a generation (decode) engine's paged pool.
This command runs it standalone: a demo, the two roles as separate
processes, benchmarks, and tools for recorded traces.

Settings common to the engine commands (model, pool, workers, backend,
timeout, log level, metrics address) come from --config FILE, KVXFER_*
variables and flags, each overriding the one before: see
docs/configuration.md.`,
		Example: examples(
			"the demo: two engines in this process, every byte verified", "kvxfer demo",
			"the same across two processes over ZeroMQ and UCX (shm in a build without UCX)", "kvxfer demo --processes 2",
			"every benchmark, with a Markdown report and plots", "kvxfer bench --report bench-report",
		),
		SilenceUsage:  true, // a failed run prints its error, not the usage
		SilenceErrors: false,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.setupLog(cmd)
		},
	}
	root.SetFlagErrorFunc(flagError) // the subcommands inherit it
	root.PersistentFlags().StringVar(&a.configFile, "config", "", "read settings from this YAML file ["+config.ConfigEnv+"] (docs/configuration.md)")
	config.AddFlags(root.PersistentFlags(), nil, config.LogLevel)
	root.AddCommand(newBenchCmd(a), newDemoCmd(a), newCtxCmd(a), newGenCmd(a), newKeygenCmd(), newReplayCmd(), newTraceCmd(), newVersionCmd(), newInfoCmd())
	return root
}
