// Command kvxfer runs kvxfer standalone. Each subcommand lives in its own
// file and adds itself to the root in newRootCmd: bench (bench.go) now;
// demo, ctx, gen, replay and info to come.
package main

import (
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		os.Exit(1) // cobra has printed the error
	}
}

// newRootCmd builds the command tree.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvxfer",
		Short:         "kvxfer moves KV-cache pages between LLM serving instances",
		SilenceUsage:  true, // a failed run prints its error, not the usage
		SilenceErrors: false,
	}
	root.AddCommand(newBenchCmd(), newDemoCmd(), newCtxCmd(), newGenCmd(), newKeygenCmd(), newReplayCmd(), newTraceCmd())
	return root
}
