package config

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture builds a Loader from a file body, an environment and command-line
// flags (parsed by a FlagSet that has every key).
func fixture(t *testing.T, file string, env map[string]string, args []string, defaults map[string]string) Loader {
	t.Helper()
	l := Loader{Defaults: defaults}
	if file != "" {
		l.File = filepath.Join(t.TempDir(), "kvxfer.yaml")
		if err := os.WriteFile(l.File, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l.Env = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	l.Environ = func() []string {
		var out []string
		for k, v := range env {
			out = append(out, k+"="+v)
		}
		return out
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	var names []string
	for _, k := range Keys {
		names = append(names, k.Name)
	}
	AddFlags(fs, defaults, names...)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	l.Flags = fs
	return l
}

func TestPrecedence(t *testing.T) {
	const file = "workers: 2\npool: 64MiB\nmodel: qwen3-8b\ntimeout: 10s\nlog-level: warn\n"
	for _, c := range []struct {
		name     string
		file     string
		env      map[string]string
		args     []string
		defaults map[string]string
		check    func(t *testing.T, s Settings)
	}{
		{name: "defaults", check: func(t *testing.T, s Settings) {
			want(t, s.Workers, 4, s.Origin(Workers).Source, SourceDefault)
			want(t, s.Model, "Llama-3.1-8B", s.Origin(Model).Source, SourceDefault)
			want(t, s.LogLevel, zerolog.InfoLevel, s.Origin(LogLevel).Source, SourceDefault)
			if s.Set(Pool) || s.Pool != 0 {
				t.Errorf("pool set with no default: %d %+v", s.Pool, s.Origin(Pool))
			}
		}},
		{name: "command default", defaults: map[string]string{Pool: "2GiB", Workers: "8"}, check: func(t *testing.T, s Settings) {
			want(t, s.Pool, uint64(2<<30), s.Origin(Pool).Source, SourceDefault)
			want(t, s.Workers, 8, s.Origin(Workers).Source, SourceDefault)
		}},
		{name: "file over default", file: file, defaults: map[string]string{Pool: "2GiB"}, check: func(t *testing.T, s Settings) {
			want(t, s.Workers, 2, s.Origin(Workers).Source, SourceFile)
			want(t, s.Pool, uint64(64<<20), s.Origin(Pool).Source, SourceFile)
			want(t, s.Model, "Qwen3-8B", s.Origin(Model).Source, SourceFile) // canonical spelling
			want(t, s.Timeout, 10*time.Second, s.Origin(Timeout).Source, SourceFile)
			want(t, s.LogLevel, zerolog.WarnLevel, s.Origin(LogLevel).Source, SourceFile)
			if w := s.Origin(Workers).Where; !strings.HasSuffix(w, "kvxfer.yaml:1") {
				t.Errorf("workers from %q, want kvxfer.yaml:1", w)
			}
		}},
		{name: "env over file", file: file, env: map[string]string{"KVXFER_WORKERS": "3", "KVXFER_LOG_LEVEL": "DEBUG"}, check: func(t *testing.T, s Settings) {
			want(t, s.Workers, 3, s.Origin(Workers).Source, SourceEnv)
			want(t, s.LogLevel, zerolog.DebugLevel, s.Origin(LogLevel).Source, SourceEnv)
			want(t, s.Pool, uint64(64<<20), s.Origin(Pool).Source, SourceFile)
		}},
		{name: "empty env is unset", file: file, env: map[string]string{"KVXFER_WORKERS": ""}, check: func(t *testing.T, s Settings) {
			want(t, s.Workers, 2, s.Origin(Workers).Source, SourceFile)
		}},
		{name: "flag over env", file: file, env: map[string]string{"KVXFER_WORKERS": "3", "KVXFER_BACKEND": "shm"},
			args: []string{"--workers", "5", "--backend=loopback", "--tokens-per-block", "16"}, check: func(t *testing.T, s Settings) {
				want(t, s.Workers, 5, s.Origin(Workers).Source, SourceFlag)
				want(t, s.Backend, "loopback", s.Origin(Backend).Source, SourceFlag)
				want(t, s.TokensPerBlock, 16, s.Origin(TokensPerBlock).Source, SourceFlag)
				want(t, s.MetricsAddr, "", s.Origin(MetricsAddr).Source, SourceDefault)
				want(t, s.Pool, uint64(64<<20), s.Origin(Pool).Source, SourceFile)
			}},
		{name: "flag equal to its default still wins", env: map[string]string{"KVXFER_WORKERS": "3"},
			args: []string{"--workers", "4"}, check: func(t *testing.T, s Settings) {
				want(t, s.Workers, 4, s.Origin(Workers).Source, SourceFlag)
			}},
		{name: "empty file", file: "# nothing\n", check: func(t *testing.T, s Settings) {
			want(t, s.Workers, 4, s.Origin(Workers).Source, SourceDefault)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := fixture(t, c.file, c.env, c.args, c.defaults).Load()
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, s)
		})
	}
}

func want[T comparable](t *testing.T, got, wantV T, src, wantSrc Source) {
	t.Helper()
	if got != wantV || src != wantSrc {
		t.Errorf("got %v from %v, want %v from %v", got, src, wantV, wantSrc)
	}
}

func TestErrorsNameKeySourceAndValue(t *testing.T) {
	for _, c := range []struct {
		name string
		file string
		env  map[string]string
		args []string
		want string
	}{
		{name: "env workers", env: map[string]string{"KVXFER_WORKERS": "zero"}, want: `KVXFER_WORKERS = "zero": not an integer`},
		{name: "env workers 0", env: map[string]string{"KVXFER_WORKERS": "0"}, want: `KVXFER_WORKERS = "0": must be at least 1`},
		{name: "flag workers", args: []string{"--workers", "-2"}, want: `--workers = "-2": must be at least 1`},
		{name: "flag workers past max", args: []string{"--workers", "2000"}, want: `--workers = "2000": at most 1024`},
		{name: "file workers", file: "model: Llama-3.1-8B\nworkers: zero\n", want: `kvxfer.yaml:2: workers = "zero": not an integer`},
		{name: "env pool", env: map[string]string{"KVXFER_POOL": "2XB"}, want: `KVXFER_POOL = "2XB": unknown unit "XB" (want B, KiB, MiB or GiB)`},
		{name: "flag pool", args: []string{"--pool=0"}, want: `--pool = "0": must be at least 1 byte`},
		{name: "env model", env: map[string]string{"KVXFER_MODEL": "gpt-5"}, want: `KVXFER_MODEL = "gpt-5": unknown model (known: Llama-3.1-8B,`},
		{name: "env backend", env: map[string]string{"KVXFER_BACKEND": "pigeon"}, want: `KVXFER_BACKEND = "pigeon": unknown backend (known: loopback, shm, ucx, cudaipc)`},
		{name: "env timeout", env: map[string]string{"KVXFER_TIMEOUT": "soon"}, want: `KVXFER_TIMEOUT = "soon": not a duration such as 30s or 5m`},
		{name: "file timeout", file: "timeout: -5s", want: `kvxfer.yaml:1: timeout = "-5s": must be positive`},
		{name: "env level", env: map[string]string{"KVXFER_LOG_LEVEL": "loud"}, want: `KVXFER_LOG_LEVEL = "loud": unknown level (want trace, debug, info, warn, error, disabled)`},
		{name: "env metrics", env: map[string]string{"KVXFER_METRICS_ADDR": "9464"}, want: `KVXFER_METRICS_ADDR = "9464": not a host:port such as 127.0.0.1:9464`},
		{name: "flag metrics port", args: []string{"--metrics-addr", "localhost:http"}, want: `--metrics-addr = "localhost:http": port "http" is not a number from 0 to 65535`},
		{name: "flag tpb", args: []string{"--tokens-per-block", "1.5"}, want: `--tokens-per-block = "1.5": not an integer`},
		{name: "unknown file key", file: "workers: 2\nwrokers: 4\n", want: `kvxfer.yaml:2: unknown key "wrokers" (known: model, pool,`},
		{name: "repeated file key", file: "workers: 2\nworkers: 4\n", want: `kvxfer.yaml:2: key "workers" repeated (first on line 1)`},
		{name: "nested value", file: "workers:\n  n: 4\n", want: `kvxfer.yaml:1: workers = "n: 4": want a single value`},
		{name: "empty value", file: "workers:\n", want: `kvxfer.yaml:1: workers = "": want a single value`},
		{name: "not a mapping", file: "- workers\n", want: `kvxfer.yaml:1: want a mapping of settings`},
		{name: "bad yaml", file: "workers: [4\n", want: `kvxfer.yaml: `},
		// A flag that is valid does not hide a bad variable: every source
		// is checked.
		{name: "env checked under a flag", env: map[string]string{"KVXFER_WORKERS": "many"}, args: []string{"--workers", "2"},
			want: `KVXFER_WORKERS = "many": not an integer`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := fixture(t, c.file, c.env, c.args, nil).Load(Workers)
			if err == nil {
				t.Fatalf("accepted; want %s", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q\nwant it to contain %q", err, c.want)
			}
			var ce *Error
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
				t.Errorf("error %T does not unwrap to *Error and ErrInvalid", err)
			}
		})
	}
}

func TestInvalidNamesOrigin(t *testing.T) {
	s, err := fixture(t, "", map[string]string{"KVXFER_BACKEND": "loopback"}, nil, nil).Load(Backend)
	if err != nil {
		t.Fatal(err)
	}
	got := s.Invalid(Backend, "kvxfer ctx needs a cross-process backend (shm)").Error()
	if want := `KVXFER_BACKEND = "loopback": kvxfer ctx needs a cross-process backend (shm)`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	s, _ = fixture(t, "", nil, nil, map[string]string{Backend: "loopback"}).Load(Backend)
	if got, want := s.Invalid(Backend, "no").Error(), `default backend = "loopback": no`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Loader{File: filepath.Join(t.TempDir(), "absent.yaml")}.Load()
	if err == nil || !strings.Contains(err.Error(), "absent.yaml") || !IsInvalid(err) {
		t.Errorf("missing file: %v", err)
	}
}

func TestUnknownEnvWarns(t *testing.T) {
	s, err := fixture(t, "", map[string]string{"KVXFER_WROKERS": "4", "KVXFER_CONFIG": "x"}, nil, nil).Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Warnings) != 1 || !strings.Contains(s.Warnings[0], "KVXFER_WROKERS is not a kvxfer setting") {
		t.Errorf("warnings %q", s.Warnings)
	}
}

// TestOtherEnvNotWarned: the KVXFER_ variables kvxfer reads outside the
// Loader (KVXFER_SYSMON, KVXFER_GC_FLOOR, ...) are no unknown setting, and
// the warning for one that is lists them as known. Before, each drew "is
// not a kvxfer setting".
func TestOtherEnvNotWarned(t *testing.T) {
	env := map[string]string{"KVXFER_WROKERS": "4"}
	for _, name := range []string{"KVXFER_SYSMON", "KVXFER_GC_FLOOR", "KVXFER_LIBCUDA", "KVXFER_LIB", "KVXFER_HOPTRACE"} {
		env[name] = "x"
	}
	for _, name := range OtherEnv {
		env[name] = "x"
	}
	s, err := fixture(t, "", env, nil, nil).Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Warnings) != 1 || !strings.Contains(s.Warnings[0], "KVXFER_WROKERS is not a kvxfer setting") {
		t.Fatalf("warnings %q, want one, for KVXFER_WROKERS", s.Warnings)
	}
	for _, name := range OtherEnv {
		if !strings.Contains(s.Warnings[0], name) {
			t.Errorf("the warning does not list %s as known: %s", name, s.Warnings[0])
		}
	}
}

// TestPythonEnvIsOtherEnv: every KVXFER_ variable the Python package reads
// (a quoted "KVXFER_..." name in python/kvxfer, other than the C ABI's
// KVXFER_ERR_ and KVXFER_ABI_ constants) is a key's or in OtherEnv, so a
// user who exports it for the Python stack is not warned of it by every
// engine command. Before, KVXFER_SGLANG_CONFIG and KVXFER_TRTLLM_CONFIG
// were ("is not a kvxfer setting").
func TestPythonEnvIsOtherEnv(t *testing.T) {
	files, err := filepath.Glob("../../python/kvxfer/*.py")
	if err != nil || len(files) == 0 {
		t.Fatalf("python/kvxfer/*.py: %v (%d files)", err, len(files))
	}
	name := regexp.MustCompile(`"(KVXFER_[A-Z0-9_]+)"`)
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllStringSubmatch(string(b), -1) {
			v := m[1]
			if strings.HasPrefix(v, "KVXFER_ERR_") || strings.HasPrefix(v, "KVXFER_ABI_") {
				continue
			}
			seen++
			known := slices.Contains(OtherEnv, v)
			for _, k := range Keys {
				known = known || k.Env == v
			}
			if !known {
				t.Errorf("%s reads %s, which is neither a key's variable nor in OtherEnv", filepath.Base(f), v)
			}
		}
	}
	if seen == 0 {
		t.Fatal("found no KVXFER_ variable in python/kvxfer: the pattern is stale")
	}
}

// TestDocumented keeps docs/configuration.md in step with Keys: one table
// row per key naming its flag, variable and YAML key.
func TestDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, k := range Keys {
		row := "| `" + k.Name + "` | `--" + k.Name + "` | `" + k.Env + "` | `" + k.Name + "` |"
		if !strings.Contains(doc, row) {
			t.Errorf("docs/configuration.md has no row starting %s", row)
		}
	}
	if !strings.Contains(doc, ConfigEnv) {
		t.Errorf("docs/configuration.md does not mention %s", ConfigEnv)
	}
}

func TestLoadOnlyChecksItsKeys(t *testing.T) {
	l := fixture(t, "workers: zero\n", map[string]string{"KVXFER_POOL": "lots", "KVXFER_LOG_LEVEL": "debug"}, nil, nil)
	s, err := l.LoadOnly(LogLevel)
	if err != nil || s.LogLevel != zerolog.DebugLevel {
		t.Fatalf("LoadOnly(log-level) = %v, %v", s.LogLevel, err)
	}
	if _, err := l.Load(LogLevel); err == nil {
		t.Error("Load accepted a bad workers value in the file")
	}
	l = fixture(t, "wrokers: 4\n", nil, nil, nil)
	if _, err := l.LoadOnly(LogLevel); err == nil || !strings.Contains(err.Error(), `unknown key "wrokers"`) {
		t.Errorf("LoadOnly with an unknown file key: %v", err)
	}
}
