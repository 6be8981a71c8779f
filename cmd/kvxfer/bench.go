package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

// newBenchCmd is `kvxfer bench`, the parent of the benchmarks.
func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure kvxfer's data plane",
	}
	cmd.AddCommand(newBenchRawCmd())
	return cmd
}

// benchRaw holds `kvxfer bench raw`'s flags.
type benchRaw struct {
	backend  string
	sizes    []string
	json     bool
	rounds   int
	bytes    string
	segments int
}

func newBenchRawCmd() *cobra.Command {
	var o benchRaw
	cmd := &cobra.Command{
		Use:   "raw",
		Short: "Post bandwidth of a backend beside Go's copy of the same bytes",
		Long: `raw posts batches of segments through a backend (sender and receiver in
this process; for shm the destination is a shared-memory file) and copies
the same bytes with Go's copy, alternating the two --rounds times per size,
and reports the medians and their ratio.`,
		Example: "  kvxfer bench raw --backend shm --sizes 64KiB,1MiB,16MiB --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.backend, "backend", "shm", "backend to measure: "+strings.Join(rdmabench.Backends(), " or "))
	f.StringSliceVar(&o.sizes, "sizes", []string{"64KiB", "1MiB", "16MiB"}, "segment sizes, comma-separated: bytes, or with a KiB, MiB or GiB suffix")
	f.BoolVar(&o.json, "json", false, "print one JSON object per size instead of a table")
	f.IntVar(&o.rounds, "rounds", 5, "how many times backend and copy alternate per size (medians are reported)")
	f.StringVar(&o.bytes, "bytes", "256MiB", "bytes moved per sample")
	f.IntVar(&o.segments, "segments", 1, "segments per batch")
	return cmd
}

func (o *benchRaw) run(w io.Writer) error {
	if !slices.Contains(rdmabench.Backends(), o.backend) {
		return fmt.Errorf("unknown backend %q (want %s)", o.backend, strings.Join(rdmabench.Backends(), " or "))
	}
	if o.rounds < 1 {
		return fmt.Errorf("--rounds %d: want at least 1", o.rounds)
	}
	if o.segments < 1 {
		return fmt.Errorf("--segments %d: want at least 1", o.segments)
	}
	minBytes, err := ParseSize(o.bytes)
	if err != nil {
		return fmt.Errorf("--bytes: %w", err)
	}
	if len(o.sizes) == 0 {
		return fmt.Errorf("--sizes: no size given")
	}
	sizes := make([]uint64, len(o.sizes))
	for i, s := range o.sizes {
		if sizes[i], err = ParseSize(s); err != nil {
			return fmt.Errorf("--sizes: %w", err)
		}
	}

	cfg := rdmabench.Config{Rounds: o.rounds, MinBytes: minBytes}
	enc := json.NewEncoder(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if !o.json {
		fmt.Fprintf(tw, "SIZE\tSEGMENTS\t%s GB/s\tCOPY GB/s\tRATIO\t\n", strings.ToUpper(o.backend))
	}
	for _, size := range sizes {
		res, err := rdmabench.Measure(o.backend, rdmabench.Shape{SegmentBytes: size, Segments: o.segments}, cfg)
		if err != nil {
			return fmt.Errorf("size %s: %w", FormatSize(size), err)
		}
		if o.json {
			if err := enc.Encode(res); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t\n", FormatSize(size), res.Segments,
			res.BytesPerSec/1e9, res.CopyBytesPerSec/1e9, res.Ratio)
	}
	if o.json {
		return nil
	}
	return tw.Flush()
}
