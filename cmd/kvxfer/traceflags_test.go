package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTraceRotationFlagsNamedWhenBad: --trace-max-bytes and --trace-keep
// are refused before anything starts, naming the flag and its value: a
// negative keep, a size that is not one, either flag without --trace, and
// rotation of a --trace that is not a regular file (the engine would name
// its config field). demo --processes 2 refuses them as it refuses
// --trace. (Checked to fail without the flags: "unknown flag".)
func TestTraceRotationFlagsNamedWhenBad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.trace")
	role := []string{"--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--trace", path, "--trace-keep", "-1"}, "--trace-keep = -1: want 0 (no rotation) or the number of rotated files to keep"},
		{[]string{"--trace", path, "--trace-max-bytes", "0"}, `--trace-max-bytes = "0": bad size "0": must be at least 1 byte`},
		{[]string{"--trace", path, "--trace-max-bytes", "lots"}, `--trace-max-bytes = "lots"`},
		{[]string{"--trace-keep", "3"}, "--trace-keep without --trace"},
		{[]string{"--trace-max-bytes", "1MiB"}, "--trace-max-bytes without --trace"},
		{[]string{"--trace", os.DevNull, "--trace-keep", "2"}, "--trace-keep = 2 with --trace = " + os.DevNull + ": not a regular file"},
	} {
		for _, r := range []string{"ctx", "gen"} {
			args := append(append([]string{r}, role...), c.args...)
			_, err := run(args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v, want an error containing %q", args, err, c.want)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--trace-keep", "3"}, "--trace-keep without --trace"},
		{[]string{"demo", "--trace", dir, "--trace-keep", "-3"}, "--trace-keep = -3"},
		{[]string{"demo", "--processes", "2", "--trace-keep", "3"}, "--trace-keep is not used by demo --processes 2"},
		{[]string{"demo", "--processes", "2", "--trace-max-bytes", "3MiB"}, "--trace-max-bytes is not used by demo --processes 2"},
	} {
		_, err := run(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused run left %s: %v", path, err)
	}
}

// TestDemoTraceRotates: demo --trace DIR --trace-max-bytes --trace-keep
// rotates each engine's trace at the bound, keeping at most --trace-keep
// old files, and kvxfer replay replays every file of the set on its own,
// saying which sessions and tables began in an earlier file. (Checked to
// fail without the flags: "unknown flag"; without rotation the run kept
// one file per engine, truncated.)
func TestDemoTraceRotates(t *testing.T) {
	dir := t.TempDir()
	out, err := run("demo", "--requests", "4", "--min-tokens", "64", "--max-tokens", "128", "--chunk-tokens", "32",
		"--compute", "0s", "--pool", "64MiB", "--log-level", "warn", "--progress=false",
		"--trace", dir, "--trace-max-bytes", "12KiB", "--trace-keep", "2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ctxTrace := filepath.Join(dir, "ctx-pipelined.jsonl")
	set := []string{ctxTrace + ".2", ctxTrace + ".1", ctxTrace}
	for _, f := range set {
		if _, err := os.Stat(f); err != nil {
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Fatalf("%v; the directory holds %v", err, names)
		}
	}
	if _, err := os.Stat(ctxTrace + ".3"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a fourth file of --trace-keep 2: %v", err)
	}
	out, err = run(append([]string{"replay"}, set...)...)
	if err != nil {
		t.Fatalf("replay of the rotated set: %v\n%s", err, out)
	}
	if !strings.Contains(out, "of a rotated trace") || !strings.Contains(out, "began in an earlier file") ||
		strings.Count(out, "identical:") != len(set) || strings.Contains(out, "truncated") {
		t.Errorf("replay of the rotated set:\n%s", out)
	}
	// Exporting a later part says what it left out (the records of
	// sessions and tables born in an earlier file), as replay does.
	noted := 0
	for _, f := range set {
		out, err := run("trace", "export", "--perfetto", f, filepath.Join(dir, filepath.Base(f)+".json"))
		if err != nil {
			t.Fatalf("export %s: %v\n%s", f, err, out)
		}
		if strings.Contains(out, "were left out: they began in an earlier file (this is part") {
			noted++
		}
	}
	if noted == 0 {
		t.Error("no export of a later part named the records it left out")
	}
}
