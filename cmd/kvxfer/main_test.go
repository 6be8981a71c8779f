package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	"github.com/kvxfer/kvxfer/internal/sysmon"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

// mainEnv makes this test binary run main() with its arguments (TestMain).
const mainEnv = "KVXFER_TEST_MAIN"

// TestCommandKeepsSysmonAwake: the kvxfer command replaces itself with a
// copy under sysmon.Setting before anything else, and `info` reports it;
// KVXFER_SYSMON=deep and a GODEBUG with its own schedtrace are left alone.
func TestCommandKeepsSysmonAwake(t *testing.T) {
	const ignored = `kvxfer: warning: KVXFER_SYSMON="yes" ignored: the only value it takes is deep`
	for _, c := range []struct {
		name        string
		env         []string
		wantAwake   bool
		wantGoDebug string
		wantStderr  string // "": nothing
	}{
		{"default", nil, true, sysmon.Setting, ""},
		{"other GODEBUG settings kept", []string{"GODEBUG=gctrace=0"}, true, "gctrace=0," + sysmon.Setting, ""},
		{"opted out", []string{sysmon.OptOut + "=deep"}, false, "", ""},
		{"the user's own schedtrace", []string{"GODEBUG=schedtrace=0"}, false, "schedtrace=0", ""},
		// Said once, though the process re-executed itself.
		{"a value other than deep", []string{sysmon.OptOut + "=yes"}, true, sysmon.Setting, ignored + "\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			si, stderr, err := commandInfo(t, []string{"GODEBUG", sysmon.OptOut}, c.env)
			if err != nil {
				t.Fatalf("kvxfer info --json: %v\n%s", err, stderr)
			}
			if si.Runtime.SysmonAwake != c.wantAwake || si.Runtime.GoDebug != c.wantGoDebug {
				t.Fatalf("runtime %+v, want sysmon_awake %v, GODEBUG %q\nstderr:\n%s", si.Runtime, c.wantAwake, c.wantGoDebug, stderr)
			}
			if (c.wantStderr == "" && stderr != "") || (c.wantStderr != "" && (!strings.HasPrefix(stderr, ignored) || strings.Count(stderr, ignored) != 1)) {
				t.Fatalf("stderr %q, want %q", stderr, c.wantStderr)
			}
		})
	}
}

// TestOtherEnvNotWarnedThroughCLI: the variables kvxfer reads outside its
// settings (each package's constant) draw no "not a kvxfer setting"
// warning from a command that loads settings. Before, every one did.
func TestOtherEnvNotWarnedThroughCLI(t *testing.T) {
	for _, name := range []string{sysmon.OptOut, gcfloor.Env, cuda.LibraryEnv, rdmabench.PeerEnv, "KVXFER_LIB", "KVXFER_HOPTRACE"} {
		if !slices.Contains(config.OtherEnv, name) {
			t.Errorf("%s is read by kvxfer but not in config.OtherEnv", name)
		}
	}
	// Values these variables' readers here take harmlessly (this process
	// read its own at its start).
	t.Setenv(sysmon.OptOut, "deep")
	t.Setenv(gcfloor.Env, "off")
	t.Setenv(cuda.LibraryEnv, "libcuda.so.1")
	t.Setenv("KVXFER_LIB", "libkvxfer.so")
	t.Setenv("KVXFER_HOPTRACE", "hops")
	_, stderr, err := runApp(newApp(), "bench", "overhead", "--chunks", "4", "--requests", "4")
	if err != nil {
		t.Fatalf("bench overhead: %v\n%s", err, stderr)
	}
	if strings.Contains(stderr, "not a kvxfer setting") {
		t.Fatalf("a variable kvxfer reads was warned of:\n%s", stderr)
	}
}

// TestCommandSetsGCFloor: the kvxfer command sets the collector's heap
// floor (internal/gcfloor) unless GOGC or KVXFER_GC_FLOOR=off says
// otherwise, takes KVXFER_GC_FLOOR's size, and refuses a value it cannot
// read, naming it, before it does anything.
func TestCommandSetsGCFloor(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     []string
		want    uint64
		wantErr string
	}{
		{"default", nil, gcfloor.Default, ""},
		{"a size", []string{gcfloor.Env + "=128MiB"}, 128 << 20, ""},
		{"off", []string{gcfloor.Env + "=off"}, 0, ""},
		{"the owner's GOGC", []string{"GOGC=200"}, 0, ""},
		{"not a size", []string{gcfloor.Env + "=lots"}, 0, `KVXFER_GC_FLOOR="lots": want a size such as 64MiB, or off`},
	} {
		t.Run(c.name, func(t *testing.T) {
			si, stderr, err := commandInfo(t, []string{"GOGC", gcfloor.Env}, c.env)
			if c.wantErr != "" {
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr, c.wantErr) {
					t.Fatalf("err %v, stderr %q: want exit 2 naming %q", err, stderr, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("kvxfer info --json: %v\n%s", err, stderr)
			}
			if si.Runtime.GCFloorBytes != c.want {
				t.Fatalf("gc_floor_bytes %d, want %d", si.Runtime.GCFloorBytes, c.want)
			}
		})
	}
}

// commandInfo runs this test binary as the kvxfer command (main(), so
// what main does first happens), `info --json`, with the variables drop
// names taken out of this process's environment and env added; err is the
// command's (an *exec.ExitError when it failed).
func commandInfo(t *testing.T, drop, env []string) (systemInfo, string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "info", "--json")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return slices.ContainsFunc(drop, func(name string) bool { return strings.HasPrefix(kv, name+"=") })
	})
	cmd.Env = append(append(cmd.Env, mainEnv+"=1"), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var si systemInfo
	if err == nil {
		if jerr := json.Unmarshal(out, &si); jerr != nil {
			t.Fatalf("info --json: %v\n%s", jerr, out)
		}
	}
	return si, stderr.String(), err
}
