package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/trace"
)

// traceFlags are the flags that bound and rotate a --trace file, beside
// --trace wherever it is taken (kvxfer ctx, gen and demo).
type traceFlags struct {
	maxBytes string
	keep     int
}

// traceRotationHelp is the flags' story, for a command's long help.
const traceRotationHelp = `A trace file is bounded
(--trace-max-bytes, 1GiB by default). Past the bound a trace stops
recording (later records are dropped, a warning says so) unless
--trace-keep N rotates it: the full file is renamed FILE.1 (the older ones
FILE.2 … FILE.N, the oldest beyond N deleted) and a new FILE starts, so
that a long run keeps its latest records, not its first, in up to
(N+1)×--trace-max-bytes of disk. --trace-keep is 0 by default, as in the
library: rotating deletes records, so a run asks for it. Each file
replays (kvxfer replay) and exports on its own: sessions and tables that
began in an earlier file are named there and their records skipped, not
reported as a divergence. A run at a FILE an earlier run wrote moves that
trace aside (FILE.prev-<UTC time>, its rotated files with it) and says
so: it is never truncated. The four newest runs' traces moved aside are
kept; older ones are removed.`

func addTraceFlags(fl *pflag.FlagSet, f *traceFlags) {
	fl.StringVar(&f.maxBytes, "trace-max-bytes", config.FormatSize(trace.DefaultMaxBytes), "bound of a --trace file (B, KiB, MiB or GiB); past it the trace stops, or rotates with --trace-keep")
	fl.IntVar(&f.keep, "trace-keep", 0, "rotate a --trace file FILE at its --trace-max-bytes bound, keeping this many old files FILE.1 (newest) … FILE.N (0: no rotation, the trace stops at its bound)")
}

// resolve checks the flags, naming each; path is --trace's file ("":
// none; a directory for demo, whose files are made in it). It returns the
// bound and the old files to keep (kvxfer.Config's TraceMaxBytes and
// TraceKeep).
func (f *traceFlags) resolve(fl *pflag.FlagSet, path string, dir bool) (maxBytes int64, keep int, err error) {
	if path == "" {
		for _, name := range []string{"trace-max-bytes", "trace-keep"} {
			if fl.Changed(name) {
				return 0, 0, fmt.Errorf("--%s without --trace: it bounds or rotates the --trace file; give --trace too", name)
			}
		}
		return 0, 0, nil
	}
	if f.keep < 0 {
		return 0, 0, fmt.Errorf("--trace-keep = %d: want 0 (no rotation) or the number of rotated files to keep", f.keep)
	}
	n, err := config.ParseSize(f.maxBytes)
	if err != nil {
		return 0, 0, fmt.Errorf("--trace-max-bytes = %q: %w", f.maxBytes, err)
	}
	if n > 1<<62 {
		return 0, 0, fmt.Errorf("--trace-max-bytes = %q: too large", f.maxBytes)
	}
	if f.keep > 0 && !dir {
		// Only a regular file is renamed: the engine would refuse it
		// naming its config field, not the flag.
		if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
			return 0, 0, fmt.Errorf("--trace-keep = %d with --trace = %s: not a regular file (%v), which cannot rotate: drop --trace-keep or trace to a file", f.keep, path, st.Mode().Type())
		}
	}
	return int64(n), f.keep, nil
}
