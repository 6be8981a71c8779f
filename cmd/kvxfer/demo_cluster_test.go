package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cliChildEnv makes this test binary run the CLI with its arguments
// (TestMain): demo --cluster starts its roles with os.Executable.
const cliChildEnv = "KVXFER_CLI_CHILD"

// TestDemoCluster: kvxfer demo --cluster, small: an embedded etcd, a TP2
// context (two processes) and a TP1 generation process find each other
// through it; the generation side verifies every byte and nothing leaks.
// --layer-parts reaches the context processes: each hands every chunk
// over in 3 parts.
func TestDemoCluster(t *testing.T) {
	t.Setenv(cliChildEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
	defer cancel()
	out, errOut, err := runAppCtx(ctx, newApp(), "demo", "--cluster", "--requests", "2", "--layer-parts", "3", "--log-level", "warn")
	if err != nil {
		t.Fatalf("demo --cluster: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	if !strings.Contains(out, "OK: cluster of three processes") {
		t.Fatalf("demo --cluster printed no OK line:\n%s", out)
	}
	var gen, ctxs int
	var reports []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "{") {
			reports = append(reports, line)
		}
	}
	for _, r := range jsonObjects(t, strings.Join(reports, "\n")) {
		// Each report carries its engine's counters: nothing refused
		// or held, no bug survived; the context ranks posted ops.
		st, _ := r["engine_stats"].(map[string]any)
		if st == nil || st["frames_rejected"] != float64(0) || st["parent_panics"] != float64(0) ||
			st["dest_block_errors"] != float64(0) || st["quarantined_bytes"] != float64(0) ||
			(r["role"] == "ctx") != (st["ops_posted"] != float64(0)) {
			t.Errorf("%v report's engine_stats: %v", r["role"], r["engine_stats"])
		}
		switch r["role"] {
		case "gen":
			gen++
			if r["ok"] != float64(2) || r["bytes"] == float64(0) || r["bytes_verified"] != r["bytes"] ||
				r["mismatches"] != float64(0) || r["leaked_blocks"] != float64(0) {
				t.Errorf("generation report: %v", r)
			}
		case "ctx":
			ctxs++
			if r["ok"] != float64(2) || r["failed"] != float64(0) || r["leaked_blocks"] != float64(0) ||
				r["chunks"] == nil || r["parts"] != 3*r["chunks"].(float64) {
				t.Errorf("context report: %v", r)
			}
		}
	}
	if gen != 1 || ctxs != 2 {
		t.Fatalf("%d generation and %d context reports, want 1 and 2:\n%s", gen, ctxs, out)
	}
}

// TestClusterFlagErrors: discovery and parallelism flags are checked
// before anything starts, naming the flag and its value.
func TestClusterFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--cluster", "--processes", "2"}, "--processes = 2: --cluster runs three processes"},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--tp", "0"}, "--tp = 0, --peer-tp = 1: must be ≥ 1"},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--heartbeat", "0s"}, "--heartbeat = 0s: must be > 0"},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--heartbeat", "-1s"}, "--heartbeat = -1s: must be > 0"},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--heartbeat-misses", "0"}, "--heartbeat-misses = 0: must be ≥ 2"},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--heartbeat-misses", "1"}, "--heartbeat-misses = 1: must be ≥ 2"},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--heartbeat", "1us"}, "--heartbeat = 1µs: below the minimum 10ms"},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--heartbeat", "1000000h", "--heartbeat-misses", "3000"}, "--heartbeat-misses = 3000: times --heartbeat (1000000h0m0s) overflows"},
		{[]string{"demo", "--processes", "2", "--prefill-devices", "2"}, "--prefill-devices is not used by demo --processes 2"},
		{[]string{"demo", "--cluster", "--json"}, "--json is not used by demo --cluster"},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--layer-parts", "-1"}, "--layer-parts = -1: must be ≥ 0"},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--layer-parts", "2"}, "unknown flag: --layer-parts"},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://nohost"}, `--discovery: discovery: invalid URL "etcd://nohost"`},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "zk://h:1", "--cluster", "c"}, `"zk://h:1"`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://127.0.0.1:2379"}, `--cluster is required with --discovery etcd://127.0.0.1:2379: give every ctx and gen process`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcds://127.0.0.1:1", "--cluster", "c", "--discovery-cert", "c.pem"}, `--discovery-cert = "c.pem" without --discovery-key: give both`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcds://127.0.0.1:1", "--cluster", "c", "--discovery-key", "k.pem"}, `--discovery-key = "k.pem" without --discovery-cert: give both`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://127.0.0.1:1", "--cluster", "c", "--discovery-user", "u"}, `--discovery-user = "u" without --discovery-password-file: give both`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://127.0.0.1:1", "--cluster", "c", "--discovery-password-file", "pw"}, `--discovery-password-file = "pw" without --discovery-user: give both`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--cluster", "c"}, `--cluster = "c": only with --discovery etcd://`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--peer-tp", "2"}, "--peer-tp = 2: more than one rank per instance needs --discovery"},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--discovery-ca", "ca.pem"}, `--discovery-ca = ca.pem: only with --discovery etcd://`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1", "--discovery-user", "u"}, `--discovery-user = u: only with --discovery etcd://`},
		{[]string{"gen", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://127.0.0.1:1", "--cluster", "c", "--discovery-cert", "c.pem"}, `--discovery-cert = "c.pem": a TLS setting with the plaintext discovery`},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://127.0.0.1:2379", "--cluster", "c", "--tp", "2", "--tp-rank", "2"}, "--tp-rank = 2: want 0..1"},
		{[]string{"ctx", "--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://127.0.0.1:2379", "--cluster", "c", "--peer-endpoint", "tcp://127.0.0.1:1"}, `--peer-endpoint = "tcp://127.0.0.1:1": with --discovery etcd://`},
	} {
		_, _, err := runApp(newApp(), c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "proc:") {
			t.Errorf("%v: %v, want no internal package's \"proc:\" in a user's error", c.args, err)
		}
	}
}

// TestDiscoveryFileErrors: a TLS or password file for etcd that cannot be
// used is named by its flag before anything starts; the node named it by
// its config keys ("node: discovery_ca = …, discovery_cert = \"\",
// discovery_key = \"\": …") once the pool was mapped.
func TestDiscoveryFileErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	empty := filepath.Join(dir, "pw")
	for _, f := range []struct{ path, text string }{{notPEM, "not a certificate\n"}, {empty, "\nsecret\n"}} {
		if err := os.WriteFile(f.path, []byte(f.text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	missing := filepath.Join(dir, "missing")
	base := []string{"gen", "--insecure", "--bind", "ipc://" + filepath.Join(dir, "gen.sock"), "--cluster", "c"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--discovery", "etcds://127.0.0.1:1", "--discovery-ca", notPEM}, `--discovery-ca = "` + notPEM + `": discovery: etcd TLS: CA file ` + notPEM + ` holds no PEM certificate: give the PEM file`},
		{[]string{"--discovery", "etcds://127.0.0.1:1", "--discovery-ca", missing}, `--discovery-ca = "` + missing + `": discovery: etcd TLS: CA file: open ` + missing},
		{[]string{"--discovery", "etcds://127.0.0.1:1", "--discovery-cert", missing, "--discovery-key", notPEM}, `--discovery-cert = "` + missing + `", --discovery-key = "` + notPEM + `": `},
		{[]string{"--discovery", "etcd://127.0.0.1:1", "--discovery-user", "u", "--discovery-password-file", missing}, `--discovery-password-file = "` + missing + `": open `},
		{[]string{"--discovery", "etcd://127.0.0.1:1", "--discovery-user", "u", "--discovery-password-file", empty}, `--discovery-password-file = "` + empty + `": its first line is empty: write --discovery-user u's password there`},
	} {
		_, _, err := runApp(newApp(), append(base, c.args...)...)
		if err == nil || !strings.HasPrefix(strings.TrimPrefix(err.Error(), "Error: "), c.want[:20]) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error starting %q", c.args, err, c.want)
		}
	}
}
