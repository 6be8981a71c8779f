package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kvxfer keygen writes a pair once; a second run names the file it will
// not overwrite, and --force replaces the pair. (Checked to fail: with
// config.WriteKeyPair called with force=true always, the second run
// succeeds and the test reports a nil error.)
func TestKeygenRefusesToOverwrite(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "ctx")
	out, err := run("keygen", "--out", prefix)
	if err != nil || !strings.Contains(out, prefix+".key (secret key)") {
		t.Fatalf("keygen: %q, %v", out, err)
	}
	first, _ := os.ReadFile(prefix + ".pub")
	_, err = run("keygen", "--out", prefix)
	if err == nil || !strings.Contains(err.Error(), prefix+".key exists") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("keygen over an existing pair: %v, want a refusal naming %s.key and --force", err, prefix)
	}
	if again, _ := os.ReadFile(prefix + ".pub"); string(again) != string(first) {
		t.Fatalf("a refused keygen changed %s.pub", prefix)
	}
	if _, err := run("keygen", "--out", prefix, "--force"); err != nil {
		t.Fatalf("keygen --force: %v", err)
	}
	if again, _ := os.ReadFile(prefix + ".pub"); string(again) == string(first) {
		t.Fatalf("keygen --force left %s.pub as it was", prefix)
	}
}

// kvxfer keygen PREFIX is kvxfer keygen --out PREFIX; two different
// prefixes are refused by name. (Checked to fail with cobra.NoArgs: "unknown
// command".)
func TestKeygenPrefixArgument(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "gen")
	if out, err := run("keygen", prefix); err != nil || !strings.Contains(out, prefix+".key (secret key)") {
		t.Fatalf("keygen %s: %q, %v", prefix, out, err)
	}
	if _, err := os.Stat(prefix + ".pub"); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if _, err := run("keygen", other, "--out", prefix); err == nil || !strings.Contains(err.Error(), "two prefixes") {
		t.Fatalf("keygen with two prefixes: %v, want a refusal", err)
	}
}

// Role commands name the mistakes they can see before they start: a
// public key file given as --key, a secret key file as --peer-key, and an
// endpoint without a transport. (Checked to fail: with resolve reading the
// keys as bare files again (no kind check), --key ctx.pub is taken as a secret
// and the error, later, names neither file; with resolve's CheckEndpoint
// calls removed, zmq.New refuses the endpoint without naming the flag.)
func TestRoleFlagsNameStartupMistakes(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"ctx", "gen"} {
		if _, err := run("keygen", "--out", filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	key := func(n string) string { return filepath.Join(dir, n) }
	eps := []string{"--bind", "ipc://" + key("ctx.sock"), "--peer-endpoint", "ipc://" + key("gen.sock")}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"public key as --key", append([]string{"ctx", "--key", key("ctx.pub"), "--peer-key", key("gen.pub")}, eps...),
			"--key: invalid configuration: key file " + key("ctx.pub") + " holds a CURVE public key, not a secret key"},
		{"secret key as --peer-key", append([]string{"ctx", "--key", key("ctx.key"), "--peer-key", key("gen.key")}, eps...),
			"--peer-key: invalid configuration: key file " + key("gen.key") + " holds a CURVE secret key"},
		// A key file that is not there: which file the flag wants and
		// what writes it. (Checked to fail before: the open's error
		// alone.)
		{"missing --key", append([]string{"ctx", "--key", key("nope.key"), "--peer-key", key("gen.pub")}, eps...),
			"--key: invalid configuration: key file: open " + key("nope.key") + ": no such file or directory: give this engine's secret key file (kvxfer keygen --out ctx writes ctx.key, and ctx.pub for the gen process's --peer-key)"},
		{"missing --peer-key", append([]string{"gen", "--key", key("gen.key"), "--peer-key", key("nope.pub")}, eps...),
			"no such file or directory: give the ctx process's public key file (the ctx.pub kvxfer keygen --out ctx wrote beside its ctx.key)"},
		// The one endpoint flag missing is named alone. (Checked to fail
		// before: "--bind and --peer-endpoint are required", --bind given.)
		{"no --peer-endpoint", []string{"ctx", "--insecure", "--bind", "ipc://" + key("ctx.sock")},
			"--peer-endpoint is required with --discovery static: the peer's control endpoint, its --bind"},
		{"no --bind", []string{"gen", "--insecure", "--peer-endpoint", "ipc://" + key("ctx.sock")},
			"--bind is required: this engine's control endpoint"},
		{"bind without scheme", []string{"ctx", "--insecure", "--bind", "127.0.0.1:5000", "--peer-endpoint", "tcp://127.0.0.1:5001"},
			`--bind: control/zmq: bad config: endpoint "127.0.0.1:5000" has no transport: did you mean tcp://127.0.0.1:5000?`},
		// (Checked to fail before: "has no transport: did you mean
		// ipc:///ctx.sock?", a socket in the filesystem root.)
		{"ipc endpoint with one slash", []string{"ctx", "--insecure", "--bind", "ipc:/ctx.sock", "--peer-endpoint", "ipc:///run/gen.sock"},
			`--bind: control/zmq: bad config: endpoint "ipc:/ctx.sock": the transport is followed by "://" (ipc://PATH): did you mean ipc://ctx.sock (ctx.sock in the working directory) or ipc:///ctx.sock (/ctx.sock in the filesystem root)?`},
		{"peer endpoint without scheme", []string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:5001", "--peer-endpoint", "127.0.0.1:5000"},
			"--peer-endpoint: control/zmq: bad config: endpoint \"127.0.0.1:5000\" has no transport: did you mean tcp://127.0.0.1:5000?"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := run(c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v, want an error containing %s", c.args, err, c.want)
			}
		})
	}
}

// kvxfer keygen refuses an empty prefix or a directory, naming --out or
// PREFIX, and writes nothing. Before, --out "" wrote .key and .pub, and
// --out dir/ dir/.key and dir/.pub.
func TestKeygenRefusesDirectoryPrefix(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir) // where a hidden .key would go
	for _, args := range [][]string{{"--out", ""}, {"--out", dir + "/"}, {dir + "/"}} {
		_, err := run(append([]string{"keygen"}, args...)...)
		flag := "--out"
		if len(args) == 1 {
			flag = "PREFIX"
		}
		if err == nil || !strings.Contains(err.Error(), "keygen "+flag) || !strings.Contains(err.Error(), "prefix") {
			t.Errorf("keygen %q: %v, want a refusal naming %s", args, err, flag)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused keygen wrote %s", ents[0].Name())
	}
}

// kvxfer keygen ctx gen (two prefixes at once) says to run it once per
// prefix, with the two commands, and writes nothing. (Checked to fail
// with cobra.MaximumNArgs(1) back: "accepts at most 1 arg(s), received
// 2".)
func TestKeygenTwoPrefixes(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "ctx"), filepath.Join(dir, "gen")
	_, err := run("keygen", a, b)
	want := "one prefix per run (kvxfer keygen PREFIX writes PREFIX.key and PREFIX.pub): kvxfer keygen " + a + " && kvxfer keygen " + b
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("keygen %s %s: %v, want %q", a, b, err, want)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a refused keygen wrote %d files", len(entries))
	}
}

// kvxfer keygen into a directory that does not exist names --out (or
// PREFIX) and the directory, and says to create it, before writing
// anything. (Checked to fail: before, it said only "invalid
// configuration: key file: open DIR/ctx.key: no such file or directory",
// naming neither the flag nor what to do.)
func TestKeygenNamesMissingDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "keys")
	prefix := filepath.Join(missing, "ctx")
	for _, args := range [][]string{{"--out", prefix}, {prefix}} {
		_, err := run(append([]string{"keygen"}, args...)...)
		flag := "--out"
		if len(args) == 1 {
			flag = "PREFIX"
		}
		want := "keygen " + flag + " " + prefix + ": directory " + missing + " does not exist: create it first (mkdir -p " + missing + ")"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("keygen %q: %v, want an error containing %q", args, err, want)
		}
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("a refused keygen made %s", missing)
	}
}
