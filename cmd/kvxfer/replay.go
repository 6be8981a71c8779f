package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/trace"
)

func newReplayCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "replay TRACE...",
		Short: "Re-run a recorded trace through the session, parent and worker step functions and check it reproduces",
		Long: `replay reads a trace written with --trace (kvxfer.Config.TracePath), rebuilds
every session from its birth record, steps each recorded message in per-actor
sequence order at its recorded time, and compares the state after each step
with the one recorded. It does the same for the tx and rx parents, the
allocation queue, the listener and each sender worker: their tables are made
anew and every recorded call is made on them again, its outputs compared with
the recorded ones. It prints the final state of every session and the calls
replayed on every table, or the first divergence (line, actor, sequence,
message or method, field, expected, got, and a table call's inputs) and exits
non-zero. Traces of the older format (sessions only) replay as before.
Each trace file is replayed on its own (a two-process run writes one per
process).`,
		Example: examples(
			"replay the traces kvxfer ctx --trace ctx.trace and kvxfer gen --trace gen.trace recorded",
			"kvxfer replay ctx.trace gen.trace",
			"one JSON object per trace", "kvxfer replay --json ctx.trace",
		),
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			diverged := 0
			for i, path := range args {
				res, err := trace.ReplayFile(path)
				if err != nil {
					return fmt.Errorf("replay %s: %w", path, err)
				}
				if !res.Identical() {
					diverged++
				}
				if asJSON {
					b, err := json.Marshal(struct {
						Trace string `json:"trace"`
						*trace.Result
					}{path, res})
					if err != nil {
						return err
					}
					fmt.Fprintln(out, string(b))
					continue
				}
				if i > 0 {
					fmt.Fprintln(out)
				}
				if len(args) > 1 {
					fmt.Fprintf(out, "%s:\n", path)
				}
				res.Print(out)
			}
			if diverged > 0 {
				return fmt.Errorf("replay diverged in %d of %d traces", diverged, len(args))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each trace's result as one JSON object")
	return cmd
}
