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
A trace whose process was killed or crashed while writing it ends in a
partial record: the whole records before it are replayed and a note names
the partial one (so does one cut at its size bound, and one whose machine
crashed, which can leave zero bytes at its end). A divergence in a trace
another kvxfer build recorded is noted as such: it may be a change of
behaviour between the builds, not a fault of the run.
Each trace file is replayed on its own (a two-process run writes one per
process): one that cannot be read is reported in its place, the others
are still replayed, and the exit status is non-zero if any failed or
diverged.
A trace rotated with --trace-keep is a set of files, FILE.N (oldest) …
FILE.1, FILE, each replayable on its own: a file a rotation started begins
with the engines' records again, and a note names the sessions and tables
that began in an earlier file, whose records there are skipped (their state
at the rotation is not recorded), not counted as a divergence; everything
born in the file is replayed as usual. Files joined into one (cat) are
refused: replay each on its own.`,
		Example: examples(
			"replay the traces kvxfer ctx --trace ctx.trace and kvxfer gen --trace gen.trace recorded",
			"kvxfer replay ctx.trace gen.trace",
			"one JSON object per trace", "kvxfer replay --json ctx.trace",
		),
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("want one or more trace files to replay (kvxfer ctx or gen --trace FILE records one)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			diverged, failed := 0, 0
			var firstErr error
			for i, path := range args {
				err := notADir(path, "kvxfer replay %s")
				var res *trace.Result
				if err == nil {
					res, err = trace.ReplayFile(path)
				}
				if err != nil {
					// One unreadable trace does not stop the others:
					// it is reported in its place and counted.
					failed++
					err = fmt.Errorf("replay %s: %w", path, err)
					if firstErr == nil {
						firstErr = err
					}
				} else if !res.Identical() {
					diverged++
				}
				if asJSON {
					rec := replayRecord{Trace: path, Result: res}
					if err != nil {
						rec.Error = err.Error()
					}
					b, jerr := json.Marshal(rec)
					if jerr != nil {
						return jerr
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
				if err != nil {
					// A lone trace's failure is the command's error,
					// which cobra prints ("Error: …"): said once.
					if len(args) > 1 {
						fmt.Fprintf(out, "FAILED: %v\n", err)
					}
					continue
				}
				res.Print(out)
			}
			switch {
			case failed == 1 && len(args) == 1:
				return firstErr
			case failed > 0 && diverged > 0:
				return fmt.Errorf("replay failed on %d and diverged in %d of %d traces (first failure: %w)", failed, diverged, len(args), firstErr)
			case failed > 0:
				return fmt.Errorf("replay failed on %d of %d traces (first: %w)", failed, len(args), firstErr)
			case diverged > 0:
				return fmt.Errorf("replay diverged in %d of %d traces", diverged, len(args))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each trace's result as one JSON object (with \"error\" for a trace that could not be replayed)")
	return cmd
}

// replayRecord is one trace's line of replay --json: its result, or the
// error that stopped its replay.
type replayRecord struct {
	Trace string `json:"trace"`
	Error string `json:"error,omitempty"`
	*trace.Result
}
