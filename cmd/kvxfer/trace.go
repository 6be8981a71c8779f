package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/trace"
)

func newTraceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Work with recorded traces (see also kvxfer replay)",
		Example: examples(
			"open the result in ui.perfetto.dev", "kvxfer trace export --perfetto ctx.trace ctx.perfetto.json",
		),
		// Runnable, so that an unknown subcommand is an error (cobra.NoArgs:
		// "unknown command"), as it is for kvxfer itself, and not help
		// with exit status 0.
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(newTraceExportCmd())
	return cmd
}

func newTraceExportCmd() *cobra.Command {
	var perfetto bool
	cmd := &cobra.Command{
		Use:   "export --perfetto TRACE OUT.json",
		Short: "Turn a trace into a timeline that Perfetto or chrome://tracing opens",
		Long: `export --perfetto writes a trace as Chrome trace-event JSON, which
ui.perfetto.dev and chrome://tracing open:
  - one process per engine ("engine ctx/0"), one thread track per session
    ("tx req-3"), with a slice for the session's life (birth to release),
    nested slices for its states (INIT, READY, TRANSFERRING, DONE, …),
    and an instant for every message it stepped on (category timeout,
    peer, worker or local; the message, its effects and the state after
    it are in the instant's arguments);
  - async slices for ops, one group per request and peer, from the step
    that submitted an op to the step that made it quiescent (its outcome
    is on the end event);
  - a thread track above the sessions for each parent, the allocation
    queue, the listener and each sender worker ("tx (TxTable)",
    "worker-1 (WorkerTable)"), with an instant for every call on its table
    (category table; inputs and outputs in the arguments).
Timestamps are microseconds since the trace began; otherData.trace_start
(trace_start_ns) is that moment on the wall clock, which lines up the
exports of a run's two processes (each counts from its own start) and
their log lines. OUT is written whole or
not at all (a temporary file beside it, renamed over it once the export
succeeded); an OUT that is TRACE itself, or a link to it, is refused.`,
		Example: examples(
			"record, export, then open ctx.perfetto.json in ui.perfetto.dev",
			"kvxfer ctx --trace ctx.trace --bind ipc:///tmp/ctx.sock --peer-endpoint ipc:///tmp/gen.sock --insecure",
			"", "kvxfer trace export --perfetto ctx.trace ctx.perfetto.json",
		),
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("want a trace and the file to write, got %d argument(s) %q: kvxfer trace export --perfetto TRACE OUT.json", len(args), args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if !perfetto {
				return fmt.Errorf("choose an output format: --perfetto (the only one so far)")
			}
			if err := notADir(args[0], "kvxfer trace export --perfetto %s OUT.json"); err != nil {
				return err
			}
			if err := checkOutDir(args[1]); err != nil {
				return err
			}
			st, err := trace.ExportPerfettoFile(args[0], args[1])
			if err != nil {
				return fmt.Errorf("export %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d events — %d engines, %d sessions, %d state slices, %d message instants, %d op slices, %d tables, %d table calls\n",
				args[1], st.Events, st.Engines, st.Sessions, st.States, st.Instants, st.Ops, st.Tables, st.Calls)
			switch {
			case st.TornLine > 0 && st.TornZeros > 0:
				fmt.Fprintf(cmd.OutOrStdout(), "note: %s ends in %d zero bytes at line %d (its machine stopped, crashed or lost power, before the file's last writes reached the disk); the records before them were exported\n",
					args[0], st.TornZeros, st.TornLine)
			case st.TornLine > 0:
				fmt.Fprintf(cmd.OutOrStdout(), "note: %s ends in a partial record at line %d (its process stopped while writing it: killed or crashed); the records before it were exported\n",
					args[0], st.TornLine)
			case st.Unclosed:
				fmt.Fprintf(cmd.OutOrStdout(), "note: %s was not closed (no end record): its process stopped without closing its engine (killed or crashed), or still writes it; its last second of records may be missing\n",
					args[0])
			}
			if st.Skipped > 0 {
				where := "before this file began"
				if st.Part > 1 {
					where = fmt.Sprintf("in an earlier file (this is part %d of a rotated trace: export its earlier parts too)", st.Part)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "note: %d records of %d sessions or tables were left out: they began %s\n",
					st.Skipped, st.SkippedActors, where)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&perfetto, "perfetto", false, "write Chrome trace-event JSON for Perfetto / chrome://tracing")
	return cmd
}

// checkOutDir refuses an export's OUT in a directory that is not there,
// naming OUT: the export writes a temporary file beside it first, and the
// error named only that file ("open /nonexistent/.x.json.178383342.tmp:
// no such file or directory").
func checkOutDir(out string) error {
	dir := filepath.Dir(out)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("cannot write %s: directory %s does not exist", out, dir)
	case err == nil && !st.IsDir():
		return fmt.Errorf("cannot write %s: %s is not a directory", out, dir)
	}
	// An OUT that is a directory failed at the rename, naming only the
	// temporary file ("rename ./.out.123.tmp out: file exists").
	if st, err := os.Stat(out); err == nil && st.IsDir() {
		return fmt.Errorf("cannot write %s: it is a directory: name the file to write (%s)", out, filepath.Join(out, "trace.perfetto.json"))
	}
	return nil
}

// notADir refuses a TRACE argument that is a directory (kvxfer demo
// --trace DIR writes one file per engine and mode there), naming its
// files and the command for one of them (cmdFmt, with %s for the file);
// the trace reader said "malformed trace: after line 0: read DIR: is a
// directory".
func notADir(path, cmdFmt string) error {
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() {
		return nil // the reader names a missing or unreadable file
	}
	entries, _ := os.ReadDir(path)
	var files []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		return fmt.Errorf("%s is a directory, not a trace file, and holds no file", path)
	}
	named := files
	if len(named) > 6 {
		named = append(named[:6:6], fmt.Sprintf("and %d more", len(files)-6))
	}
	return fmt.Errorf("%s is a directory, not a trace file: name a trace file in it (%s), as in "+cmdFmt, path, strings.Join(named, ", "), files[0])
}
