package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/kvcache"
)

// demoDeadline bounds demo runs that once hung or ran a whole workload: a
// regression fails with a deadline error instead of hanging. It is no
// speed assertion: every run here ends before its first transfer.
const demoDeadline = 2 * time.Minute

// runAppCtx is runApp under ctx.
func runAppCtx(ctx context.Context, a *app, args ...string) (string, string, error) {
	root := newRootCmdWith(a)
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// TestDemoOptionErrorsNameTheValue (issue 18): every demo option error
// names the option, the bad value and what it accepts, and comes before
// anything runs. Checked to fail before the fix: --requests 0 and the
// token and concurrency cases said "demo: bad options: requests 16, tokens
// 512..8192, concurrency 0" (all values, not the bad one); --compute -1s
// ran the whole demo; --chunk-tokens 100 and --tokens-per-block 7 hung
// until the deadline; --pool 16MiB waited on the admission semaphore until
// the deadline.
func TestDemoOptionErrorsNameTheValue(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "NoSuchModel"}, `--model = "NoSuchModel": unknown model (known: Llama-3.1-8B,`},
		{[]string{"--requests", "0"}, "--requests = 0: want 1 to 1048576"},
		{[]string{"--pool", "-1"}, `--pool = "-1": want a byte count`},
		{[]string{"--timeout", "soon"}, `--timeout = "soon": not a duration`},
		{[]string{"--workers", "0"}, `--workers = "0": must be at least 1`},
		{[]string{"--min-tokens", "0"}, "--min-tokens = 0: want at least 1"},
		{[]string{"--max-tokens", "10"}, "--max-tokens = 10: want at least --min-tokens (512)"},
		{[]string{"--chunk-tokens", "100"}, "--chunk-tokens = 100: want a positive multiple of the block size, 32 tokens (--tokens-per-block)"},
		{[]string{"--tokens-per-block", "7"}, "--chunk-tokens = 512: want a positive multiple of the block size, 7 tokens (--tokens-per-block)"},
		{[]string{"--concurrency", "0"}, "--concurrency = 0: want at least 1"},
		{[]string{"--compute", "-1s"}, "--compute = -1s: want 0 or more"},
		{[]string{"--pool", "16MiB", "--requests", "1", "--timeout", "5s"},
			"demo: --pool = 16MiB is too small: request 0 (8192 tokens of Llama-3.1-8B), layer group 0: kvcache: pool too small: " +
				"need 256 blocks of 4MiB (1GiB), the pool holds 4 (16MiB); use --pool ≥ 1GiB"},
		{[]string{"--pool", "2GiB", "--model", "Llama-3.1-70B"},
			"need 256 blocks of 10MiB (2560MiB), the pool holds 204 (2040MiB); use --pool ≥ 2560MiB"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
			defer cancel()
			_, _, err := runAppCtx(ctx, newApp(), append([]string{"demo", "--progress=false"}, c.args...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("demo %v: %v\nwant an error containing %q", c.args, err, c.want)
			}
		})
	}
}

// TestDemoHelpExampleModelSizesPool: `kvxfer demo --model Llama-3.1-70B`,
// and the help's --config example with a file that leaves the pool alone,
// size the pool to the model (2560MiB, from the 2GiB default that holds 204
// of the 256 blocks an 8k-token prompt needs) and start: the run gets past
// every check to the engines, which this test's already-cancelled context
// stops (the whole 70B workload is too slow for a -race test; the report
// quotes one by hand). A file that sets a pool too small fails at once.
// Checked to fail before the fix: no pool was sized (no "pool sized" line,
// the run started with 2GiB and would wait for ever on the first 8k-token
// request).
func TestDemoHelpExampleModelSizesPool(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := write("kvxfer.yaml", "backend: loopback\n")
	small := write("small.yaml", "pool: 2GiB\n")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{
		{"demo", "--model", "Llama-3.1-70B"},
		{"demo", "--config", plain, "--model", "Llama-3.1-70B", "--workers", "8"},
	} {
		_, stderr, err := runAppCtx(cancelled, newApp(), append(args, "--log-level", "debug", "--progress=false")...)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%v: %v, want the run to start (and stop at the cancelled context)", args, err)
		}
		var sized, started bool
		for _, line := range strings.Split(stderr, "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue // cobra's "Error: …" line
			}
			switch rec["message"] {
			case "pool sized to hold the longest prompt (set --pool to choose)":
				sized = rec["pool"] == "2560MiB" && rec["default"] == "2GiB" && rec["model"] == "Llama-3.1-70B"
			case "demo starting":
				started = rec["pool"] == "2560MiB"
			}
		}
		if !sized || !started {
			t.Errorf("%v: pool not sized to 2560MiB (sized %v, started %v):\n%s", args, sized, started, stderr)
		}
	}
	ctx, stop := context.WithTimeout(context.Background(), demoDeadline)
	defer stop()
	_, _, err := runAppCtx(ctx, newApp(), "demo", "--config", small, "--model", "Llama-3.1-70B", "--progress=false")
	if !errors.Is(err, kvcache.ErrPoolTooSmall) || !strings.Contains(err.Error(), "use pool (small.yaml:1) ≥ 2560MiB") {
		t.Errorf("demo with pool: 2GiB from a file: %v, want kvcache.ErrPoolTooSmall naming pool (small.yaml:1) ≥ 2560MiB", err)
	}
}

// TestDemoPoolPastMemory: a --pool the machine cannot hold twice is
// refused before anything is mapped, naming --pool and the memory
// available. (A pool past the largest host region, so that a build
// without the check fails on the region at once, mapping nothing.)
// Before, the error was the region's mmap failure, naming no flag.
func TestDemoPoolPastMemory(t *testing.T) {
	if _, ok := meminfo.Available(); !ok {
		t.Skip("the memory available is not known here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
	defer cancel()
	out, _, err := runAppCtx(ctx, newApp(), "demo", "--pool", "65537GiB", "--requests", "1", "--log-level", "warn")
	if err == nil || !strings.Contains(err.Error(), "--pool = 65537GiB: 2 pools of it (context and generation, every page touched) are more than the ") ||
		!strings.Contains(err.Error(), "of memory available (MemAvailable): use a --pool of at most ") {
		t.Fatalf("demo --pool 65537GiB: %v, want a refusal naming --pool and the memory available\n%s", err, out)
	}
}

// TestDemoNamesThePoolAsSet: a pool set by KVXFER_POOL or a config file
// that is too small for the longest prompt, or past the memory available,
// is named so, not as --pool, which the user never gave. Before, "demo:
// --pool = 16MiB is too small: …; use --pool ≥ 1GiB" and "demo: bad
// option: --pool = 65537GiB: … use a --pool of at most …".
func TestDemoNamesThePoolAsSet(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(file, []byte("pool: 16MiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"KVXFER_POOL": "16MiB"}, []string{"demo: KVXFER_POOL = 16MiB is too small: request ", "use KVXFER_POOL ≥ 1GiB"}},
		{map[string]string{"KVXFER_CONFIG": file}, []string{"demo: pool (pool.yaml:1) = 16MiB is too small: request ", "use pool (pool.yaml:1) ≥ 1GiB"}},
	}
	if _, ok := meminfo.Available(); ok {
		cases = append(cases, struct {
			env  map[string]string
			want []string
		}{map[string]string{"KVXFER_POOL": "65537GiB"}, []string{"KVXFER_POOL = 65537GiB: 2 pools of it", "use a KVXFER_POOL of at most "}})
	}
	for _, c := range cases {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
		_, _, err := runAppCtx(ctx, newApp(), "demo", "--requests", "1", "--progress=false", "--log-level", "warn")
		cancel()
		for _, want := range c.want {
			if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "--pool") {
				t.Errorf("demo with %v: %v, want an error containing %q and no --pool", c.env, err, want)
			}
		}
		for k := range c.env {
			t.Setenv(k, "")
		}
	}
}
