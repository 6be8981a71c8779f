package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// settingsLine runs `kvxfer bench overhead` (cheap) at debug level and
// returns the "settings" log record: where each value came from.
func settingsLine(t *testing.T, args ...string) map[string]any {
	t.Helper()
	_, stderr, err := runApp(newApp(), append([]string{"bench", "overhead", "--chunks", "4", "--requests", "4", "--log-level", "debug"}, args...)...)
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, stderr)
	}
	for _, line := range strings.Split(stderr, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["message"] == "settings" {
			return rec
		}
	}
	t.Fatalf("no settings record in:\n%s", stderr)
	return nil
}

// TestPrecedenceThroughCLI: flags over env over file over defaults, as a
// command sees them.
func TestPrecedenceThroughCLI(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvxfer.yaml")
	if err := os.WriteFile(file, []byte("workers: 2\nmodel: qwen3-8b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"default", nil, nil, "4 (default workers)"},
		{"file", nil, []string{"--config", file}, "2 (kvxfer.yaml:1: workers)"},
		{"KVXFER_CONFIG", map[string]string{"KVXFER_CONFIG": file}, nil, "2 (kvxfer.yaml:1: workers)"},
		{"env over file", map[string]string{"KVXFER_WORKERS": "3"}, []string{"--config", file}, "3 (KVXFER_WORKERS)"},
		{"flag over env", map[string]string{"KVXFER_WORKERS": "3"}, []string{"--config", file, "--workers", "1"}, "1 (--workers)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			rec := settingsLine(t, c.args...)
			if rec["workers"] != c.want {
				t.Errorf("workers %v, want %q", rec["workers"], c.want)
			}
		})
	}
}

func TestConfigErrorsThroughCLI(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unknown := write("unknown.yaml", "workers: 2\nwrokers: 3\n")
	badPool := write("pool.yaml", "pool: 2XB\n")
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"env workers", map[string]string{"KVXFER_WORKERS": "zero"}, []string{"demo"}, `KVXFER_WORKERS = "zero": not an integer`},
		{"unknown key", nil, []string{"demo", "--config", unknown}, `unknown.yaml:2: unknown key "wrokers"`},
		{"file pool", nil, []string{"gen", "--config", badPool}, `pool.yaml:1: pool = "2XB": unknown unit "XB"`},
		{"flag timeout", nil, []string{"demo", "--timeout", "soon"}, `--timeout = "soon": not a duration`},
		{"env level", map[string]string{"KVXFER_LOG_LEVEL": "loud"}, []string{"version"}, `KVXFER_LOG_LEVEL = "loud": unknown level`},
		{"ctx backend", map[string]string{"KVXFER_BACKEND": "loopback"}, []string{"ctx", "--insecure", "--bind", "ipc:///x", "--peer-endpoint", "ipc:///y"},
			`KVXFER_BACKEND = "loopback": kvxfer ctx runs across processes: want shm, ucx or cudaipc (GPU to GPU on one host)`},
		{"demo cudaipc", nil, []string{"demo", "--backend", "cudaipc"},
			`--backend = "cudaipc": demo runs over host memory: run kvxfer ctx and kvxfer gen with --backend cudaipc`},
		{"demo two processes cudaipc", nil, []string{"demo", "--processes", "2", "--backend", "cudaipc"},
			`--backend = "cudaipc": demo runs over host memory`},
		{"gen device", nil, []string{"gen", "--insecure", "--bind", "ipc:///x", "--peer-endpoint", "ipc:///y", "--backend", "cudaipc", "--device", "-1"},
			`--device = -1: not a CUDA ordinal`},
		{"ctx device without cudaipc", nil, []string{"ctx", "--insecure", "--bind", "ipc:///x", "--peer-endpoint", "ipc:///y", "--backend", "shm", "--device", "1"},
			`--device = 1 with --backend = "shm": only backend cudaipc runs on a GPU`},
		{"demo two processes", nil, []string{"demo", "--processes", "2", "--backend", "loopback"}, `--backend = "loopback": demo --processes 2 runs across processes: want shm or ucx`},
		{"metrics port", nil, []string{"demo", "--metrics-addr", "localhost:65535"}, `--metrics-addr = "localhost:65535": port "65535" leaves no next port`},
		// A file that cannot be read is named by what named it: the
		// variable's was named --config, which the command line did not
		// have. (Checked to fail before: "invalid configuration: --config:
		// open …/absent.yaml: no such file or directory" for both.)
		{"missing file", nil, []string{"demo", "--config", filepath.Join(dir, "absent.yaml")},
			`--config = "` + filepath.Join(dir, "absent.yaml") + `": open ` + filepath.Join(dir, "absent.yaml") + ": no such file or directory: give --config a readable YAML settings file"},
		{"missing KVXFER_CONFIG", map[string]string{"KVXFER_CONFIG": filepath.Join(dir, "absent.yaml")}, []string{"bench", "small"},
			`KVXFER_CONFIG = "` + filepath.Join(dir, "absent.yaml") + `": open ` + filepath.Join(dir, "absent.yaml") + ": no such file or directory: set KVXFER_CONFIG to a readable YAML settings file, or unset it"},
		{"--config over a missing KVXFER_CONFIG", map[string]string{"KVXFER_CONFIG": filepath.Join(dir, "pool.yaml")}, []string{"demo", "--config", filepath.Join(dir, "absent.yaml")},
			`--config = "` + filepath.Join(dir, "absent.yaml") + `"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			_, err := run(c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v, want an error containing %s", c.args, err, c.want)
			}
		})
	}
	// A command that takes no engine settings ignores a bad KVXFER_WORKERS.
	t.Setenv("KVXFER_WORKERS", "zero")
	if _, err := run("version"); err != nil {
		t.Errorf("version with a bad KVXFER_WORKERS: %v", err)
	}
}

// TestFlagTypoNamesTheFlag: a mistyped flag names the flag the command
// takes that it is closest to, and a long flag written with one dash its
// two-dash form; a flag the command does not take at all, and is close
// to none of its flags, is named with where to look. Before, each was
// only "unknown flag: --tokens-per-blok" or "unknown shorthand flag: 'p'
// in -pool" (the latter naming neither what was meant nor the mistake).
// (Checked to fail without flagError.)
func TestFlagTypoNamesTheFlag(t *testing.T) {
	common := []string{"--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ctx", "--tokens-per-blok", "16"}, "unknown flag: --tokens-per-blok: did you mean --tokens-per-block? (kvxfer ctx --help lists its flags)"},
		{[]string{"gen", "--pol", "1GiB"}, "unknown flag: --pol: did you mean --pool?"},
		{[]string{"gen", "--peer_key", "gen.pub"}, "unknown flag: --peer_key: did you mean --peer-key?"},
		{[]string{"ctx", "-pool", "1GiB"}, "unknown shorthand flag: 'p' in -pool: did you mean --pool? (a long flag takes two dashes)"},
		{[]string{"demo", "--processs", "2"}, "unknown flag: --processs: did you mean --processes?"},
		{[]string{"ctx", "--log-levl", "debug"}, "did you mean --log-level?"}, // a flag of the root command
		// kvxfer ctx's own flags, given to gen, are named as ctx's.
		// (Checked to fail before: "unknown flag: --layer-parts (kvxfer
		// gen --help lists its flags)", though gen's help said both roles
		// accept one command line.)
		{[]string{"gen", "--layer-parts", "2"}, "unknown flag: --layer-parts: --layer-parts is kvxfer ctx's alone (the context role alone hands chunks over): give it to kvxfer ctx, not to gen"},
		{[]string{"gen", "--writer-lease=3s"}, "unknown flag: --writer-lease: --writer-lease is kvxfer ctx's alone"},
	} {
		_, _, err := runApp(newApp(), append(c.args, common...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestFlagValueNamesWhatItTakes: a value a plain flag cannot parse is
// named with the flag and what it takes, not in the parser's words.
// (Checked to fail before: `invalid argument "abc" for "--requests"
// flag: strconv.ParseInt: parsing "abc": invalid syntax`, and for
// --heartbeat 100 `time: missing unit in duration "100"`.)
func TestFlagValueNamesWhatItTakes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ctx", "--requests", "abc"}, `--requests = "abc": want a whole number (default 8)`},
		{[]string{"gen", "--heartbeat", "100"}, `--heartbeat = "100": want a duration with its unit, such as 500ms, 2s or 1m (default 1s)`},
		{[]string{"ctx", "--seed", "-1"}, `--seed = "-1": want a whole number ≥ 0 (default 1)`},
		{[]string{"gen", "--insecure=maybe"}, `--insecure = "maybe": want true or false (--insecure alone is true)`},
		{[]string{"ctx", "--requests", "99999999999999999999"}, `--requests = "99999999999999999999": out of range (default 8)`},
		{[]string{"bench", "raw", "--rounds", "x"}, `--rounds = "x": want a whole number (default 5)`},
		// A list of whole numbers names the entry that is not one.
		// (Checked to fail before: `invalid argument "abc" for "--tokens"
		// flag: strconv.Atoi: parsing "abc": invalid syntax`.)
		{[]string{"bench", "small", "--tokens", "abc"}, `--tokens = "abc": want whole numbers, comma-separated (default 128,512)`},
		{[]string{"bench", "small", "--tokens", "128,x1"}, `--tokens = "128,x1": "x1" is not a whole number: want whole numbers, comma-separated (default 128,512)`},
		{[]string{"bench", "small", "--tokens", "99999999999999999999"}, `--tokens = "99999999999999999999": 99999999999999999999 is out of range: want whole numbers`},
		{[]string{"bench", "pipelining", "--chunk-sizes", "64,"}, `--chunk-sizes = "64,": an empty entry: want whole numbers, comma-separated (default 64,128,256,512,1024)`},
	} {
		_, _, err := runApp(newApp(), c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "strconv") {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestLogsJSONUnlessTerminal: JSON records when standard error is not a
// terminal, human-readable ones when it is.
func TestLogsJSONUnlessTerminal(t *testing.T) {
	_, stderr, err := runApp(newApp(), "bench", "overhead", "--chunks", "4", "--requests", "4")
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	first := strings.SplitN(stderr, "\n", 2)[0]
	if err := json.Unmarshal([]byte(first), &rec); err != nil || rec["level"] != "info" {
		t.Errorf("first log line %q is not a JSON info record: %v", first, err)
	}
	a := newApp()
	a.terminal = func(io.Writer) bool { return true }
	_, stderr, err = runApp(a, "bench", "overhead", "--chunks", "4", "--requests", "4", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(stderr, "{") || !strings.Contains(stderr, "INF") || !strings.Contains(stderr, "bench starting") {
		t.Errorf("terminal log is not console-formatted:\n%s", stderr)
	}
	// --log-level warn silences the info lines.
	_, stderr, err = runApp(newApp(), "bench", "overhead", "--chunks", "4", "--requests", "4", "--log-level", "warn")
	if err != nil || stderr != "" {
		t.Errorf("--log-level warn: %v, stderr %q", err, stderr)
	}
}

// TestProgress: a bar on a terminal, log lines otherwise, neither under
// --json on a terminal.
func TestProgress(t *testing.T) {
	demoArgs := []string{"demo", "--requests", "2", "--min-tokens", "32", "--max-tokens", "64", "--chunk-tokens", "32",
		"--compute", "0s", "--pool", "64MiB", "--workers", "2"}
	out, stderr, err := runApp(newApp(), demoArgs...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(out, "OK: every transferred byte verified") {
		t.Errorf("demo output:\n%s", out)
	}
	if n := strings.Count(stderr, `"task":"demo"`); n != 4 {
		t.Errorf("%d progress log lines, want 4 (2 requests × 2 modes):\n%s", n, stderr)
	}
	a := newApp()
	a.terminal = func(io.Writer) bool { return true }
	_, stderr, err = runApp(a, append(demoArgs, "--log-level", "warn")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "demo") || !strings.Contains(stderr, "(3/4)") {
		t.Errorf("no progress bar on a terminal:\n%q", stderr)
	}
	out, stderr, err = runApp(a, append(demoArgs, "--log-level", "warn", "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	if stderr != "" {
		t.Errorf("progress drawn under --json: %q", stderr)
	}
	var rep struct {
		Options map[string]any   `json:"options"`
		Rows    []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Errorf("demo --json: %v\n%s", err, out)
	}
	// Units in the names, the block size the run used (the model's).
	if rep.Options["tokens_per_block"] != float64(32) || rep.Options["timeout_ns"] == nil || len(rep.Rows) != 2 || rep.Rows[0]["wall_ns"] == nil {
		t.Errorf("demo --json: options %v, rows %v: want tokens_per_block 32, timeout_ns and wall_ns", rep.Options, rep.Rows)
	}
}

func TestDemoShm(t *testing.T) {
	out, err := run("demo", "--requests", "2", "--min-tokens", "32", "--max-tokens", "64", "--chunk-tokens", "32",
		"--compute", "0s", "--pool", "64MiB", "--backend", "shm", "--log-level", "warn", "--metrics-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "OK: every transferred byte verified") {
		t.Errorf("demo --backend shm:\n%s", out)
	}
}

// TestDemoUCX: the one-process demo over two UCX agents verifies every
// byte.
func TestDemoUCX(t *testing.T) {
	if !ucx.Available {
		t.Skip("built without the ucx backend")
	}
	out, err := run("demo", "--requests", "2", "--min-tokens", "32", "--max-tokens", "64", "--chunk-tokens", "32",
		"--compute", "0s", "--pool", "64MiB", "--backend", "ucx", "--log-level", "warn")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "OK: every transferred byte verified") {
		t.Errorf("demo --backend ucx:\n%s", out)
	}
}

// TestCrossProcessBackend: ctx, gen and demo --processes 2 default to ucx
// where this binary has it, else shm, and take either.
func TestCrossProcessBackend(t *testing.T) {
	want := "shm"
	if ucx.Available {
		want = "ucx"
	}
	if got := crossProcessBackend(); got != want {
		t.Errorf("default cross-process backend %q, want %q", got, want)
	}
	for _, cmd := range []string{"ctx", "gen"} {
		out, err := run(cmd, "--help")
		if err != nil || !strings.Contains(out, `(default `+want+`)`) {
			t.Errorf("%s --help: %v; want the backend flag to default to %s:\n%s", cmd, err, want, out)
		}
	}
}

func TestVersion(t *testing.T) {
	out, err := run("version", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Module == "" || !strings.HasPrefix(v.GoVersion, "go") {
		t.Errorf("version --json %q: %v", out, err)
	}
	out, err = run("version")
	if err != nil || !strings.HasPrefix(out, "kvxfer ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: %q, %v", out, err)
	}
	got := buildVersion(func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/kvxfer/kvxfer", Version: "v0.3.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}}, true
	})
	want := versionInfo{Module: "github.com/kvxfer/kvxfer", Version: "v0.3.0", GoVersion: "go1.26.0", Platform: got.Platform,
		Revision: "abc123", Time: "2026-01-02T03:04:05Z", Modified: true}
	if got != want {
		t.Errorf("buildVersion = %+v, want %+v", got, want)
	}
	if v := buildVersion(func() (*debug.BuildInfo, bool) { return nil, false }); v.Version != "unknown" || v.GoVersion == "" {
		t.Errorf("no build info: %+v", v)
	}
}

// TestEveryCommandHasExamples: --help of every command shows examples.
func TestEveryCommandHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "help" || c.Name() == "completion" || c.Hidden {
			return
		}
		if strings.TrimSpace(c.Example) == "" || !strings.Contains(c.Example, "kvxfer") {
			t.Errorf("%s has no example", c.CommandPath())
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	root := newRootCmd()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	walk(root)
	out, err := run("bench", "small", "--help")
	if err != nil || !strings.Contains(out, "Examples:") || !strings.Contains(out, "KVXFER_WORKERS") {
		t.Errorf("bench small --help:\n%s", out)
	}
}

// TestTraceFlagNamedWhenUnwritable: a --trace file that cannot be written
// (its directory missing, a directory in its place) is refused before
// anything starts, naming --trace and the path, not kvxfer.Config's
// TracePath. The check leaves a trace file that is there as it is and
// creates none. (Checked to fail without checkTracePath: the error said
// "kvxfer: bad config: TracePath: open …".)
func TestTraceFlagNamedWhenUnwritable(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{filepath.Join(dir, "missing", "x.trace"), dir} {
		for _, role := range []string{"ctx", "gen"} {
			_, _, err := runApp(newApp(), role, "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--trace", path)
			if err == nil || !strings.HasPrefix(err.Error(), "--trace = "+path+": cannot write it") || strings.Contains(err.Error(), "TracePath") {
				t.Errorf("%s --trace %s: %v, want an error naming --trace and the path", role, path, err)
			}
		}
	}
	old := filepath.Join(dir, "old.trace")
	if err := os.WriteFile(old, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "new.trace")
	for _, path := range []string{old, fresh} {
		if err := checkTracePath(path); err != nil {
			t.Fatalf("checkTracePath(%s): %v", path, err)
		}
	}
	if b, err := os.ReadFile(old); err != nil || string(b) != "kept" {
		t.Errorf("the trace file there before: %q, %v; want it as it was", b, err)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("checkTracePath left %s behind: %v", fresh, err)
	}
}
