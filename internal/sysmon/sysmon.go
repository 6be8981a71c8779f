package sysmon

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Setting is the GODEBUG setting that keeps sysmon out of its deep sleep:
// schedtrace's longest period (int32 milliseconds, 24.8 days).
const Setting = "schedtrace=2147483647"

// OptOut is the environment variable that leaves the runtime's default
// when set to "deep".
const OptOut = "KVXFER_SYSMON"

// Env returns environ (os.Environ's form) with Setting added to GODEBUG,
// and whether it added it: not when GODEBUG already sets schedtrace (the
// user's choice wins) or OptOut is "deep". environ itself is not changed.
func Env(environ []string) ([]string, bool) {
	godebug, at := "", -1
	for i, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case OptOut:
			if v == "deep" {
				return environ, false
			}
		case "GODEBUG":
			godebug, at = v, i
		}
	}
	if _, set := schedtrace(godebug); set {
		return environ, false
	}
	out := append([]string(nil), environ...)
	if at < 0 {
		return append(out, "GODEBUG="+Setting), true
	}
	if godebug == "" {
		out[at] = "GODEBUG=" + Setting
	} else {
		out[at] = "GODEBUG=" + godebug + "," + Setting
	}
	return out, true
}

// ErrUnsupported: Reexec runs on Linux only (it execs /proc/self/exe).
var ErrUnsupported = errors.New("sysmon: re-exec needs Linux")

// Reexec replaces this process with itself, same arguments, under Env's
// environment, when Env would change it; it returns nil without doing
// anything when not. It returns only when it did not exec: an error says
// why (the process goes on with the runtime's default).
func Reexec() error {
	env, changed := Env(os.Environ())
	if !changed {
		return nil
	}
	if runtime.GOOS != "linux" {
		return ErrUnsupported
	}
	// /proc/self/exe is this very binary even when os.Args[0] is a bare
	// name resolved through PATH or the file was replaced since.
	if err := syscall.Exec("/proc/self/exe", os.Args, env); err != nil {
		return fmt.Errorf("sysmon: exec /proc/self/exe: %w", err)
	}
	return nil // not reached
}

// Awake reports whether this process runs with sysmon kept out of its
// deep sleep: its GODEBUG sets schedtrace to a positive period (Setting
// or the user's own). It reads the environment, which the runtime read at
// its start: a GODEBUG changed since is not what the runtime runs with.
func Awake() bool {
	v, set := schedtrace(os.Getenv("GODEBUG"))
	n, err := strconv.Atoi(v)
	return set && err == nil && n > 0
}

// schedtrace is the value godebug gives schedtrace, as the runtime parses
// it: no spaces trimmed, the last of repeated settings wins.
func schedtrace(godebug string) (v string, set bool) {
	for _, s := range strings.Split(godebug, ",") {
		if x, ok := strings.CutPrefix(s, "schedtrace="); ok {
			v, set = x, true
		}
	}
	return v, set
}
