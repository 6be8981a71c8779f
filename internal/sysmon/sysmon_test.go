package sysmon

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestEnv(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=" + Setting}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + Setting, "A=1"}, true},
		{"other settings kept", []string{"GODEBUG=gctrace=1"}, []string{"GODEBUG=gctrace=1," + Setting}, true},
		{"the user's schedtrace wins", []string{"GODEBUG=gctrace=1,schedtrace=1000"}, []string{"GODEBUG=gctrace=1,schedtrace=1000"}, false},
		{"opted out", []string{OptOut + "=deep"}, []string{OptOut + "=deep"}, false},
		{"another opt-out value is no opt-out", []string{OptOut + "=yes"}, []string{OptOut + "=yes", "GODEBUG=" + Setting}, true},
		{"scheddetail is not schedtrace", []string{"GODEBUG=scheddetail=1"}, []string{"GODEBUG=scheddetail=1," + Setting}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.in)
			got, changed := Env(in)
			if !slices.Equal(got, c.want) || changed != c.changed {
				t.Fatalf("Env(%q) = %q, %v; want %q, %v", c.in, got, changed, c.want, c.changed)
			}
			if !slices.Equal(in, c.in) {
				t.Fatalf("Env changed its argument: %q", in)
			}
		})
	}
}

// TestReexec runs this test binary as a child that calls Reexec and
// prints its GODEBUG: the child comes back (exec'd) with the setting, once.
func TestReexec(t *testing.T) {
	if os.Getenv("SYSMON_TEST_CHILD") != "" {
		if err := Reexec(); err != nil {
			t.Fatal(err)
		}
		// Printed by the exec'd process only: the first one never gets
		// here (Reexec does not return when it execs).
		os.Stdout.WriteString("GODEBUG=" + os.Getenv("GODEBUG") + "\n")
		return
	}
	for _, c := range []struct{ env, want string }{
		{"", "GODEBUG=" + Setting},
		{"GODEBUG=gctrace=0", "GODEBUG=gctrace=0," + Setting},
		{OptOut + "=deep", "GODEBUG="},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReexec$", "-test.v")
		cmd.Env = append(withoutGodebug(os.Environ()), "SYSMON_TEST_CHILD=1")
		if c.env != "" {
			cmd.Env = append(cmd.Env, c.env)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.env, err, out)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "GODEBUG=") {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || lines[0] != c.want {
			t.Fatalf("%s: child printed %q, want once %q\n%s", c.env, lines, c.want, out)
		}
	}
}

func withoutGodebug(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, "GODEBUG=") || strings.HasPrefix(kv, OptOut+"=")
	})
}

func TestAwake(t *testing.T) {
	for _, c := range []struct {
		godebug string
		want    bool
	}{
		{"", false},
		{Setting, true},
		{"gctrace=1," + Setting, true},
		{"schedtrace=0", false},
		{"schedtrace=x", false},
		{"scheddetail=1", false},
		{" schedtrace=1000", false}, // the runtime trims nothing: no setting
		{"schedtrace=1000,schedtrace=0", false},
		{"schedtrace=0," + Setting, true},
	} {
		t.Setenv("GODEBUG", c.godebug)
		if got := Awake(); got != c.want {
			t.Errorf("GODEBUG=%q: Awake() = %v, want %v", c.godebug, got, c.want)
		}
	}
}
