package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/internal/testlog"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
)

// `kvxfer gen` with no context process says at once where it listens and
// whom it waits for (within 3 heartbeat intervals), then, at its timeout,
// fails naming the silent peer. (Checked to fail: with node.Open's
// logListening call removed the first wait times out.)
func TestRoleSaysWhereItListensAndWaits(t *testing.T) {
	const beat = 500 * time.Millisecond
	dir := t.TempDir()
	bind, peer := "ipc://"+filepath.Join(dir, "gen.sock"), "ipc://"+filepath.Join(dir, "ctx.sock")
	root := newRootCmdWith(newApp())
	var out, errOut testlog.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"gen", "--insecure", "--bind", bind, "--peer-endpoint", peer, "--pool", "64MiB",
		"--max-tokens", "512", "--requests", "1", "--heartbeat", beat.String(), "--timeout", "2s", "--log-level", "info"})
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()
	want := "listening on " + bind + ", waiting for ctx/0 at " + peer
	deadline := time.Now().Add(3 * beat)
	for !strings.Contains(errOut.String(), want) {
		if time.Now().After(deadline) {
			t.Errorf("no %q within 3 heartbeats; standard error:\n%s", want, errOut.String())
			break
		}
		time.Sleep(5 * time.Millisecond) // poll with a deadline
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "said nothing") || !strings.Contains(out.String(), "ctx/0 at "+peer) {
			t.Fatalf("gen without ctx: %v\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("gen without ctx did not end at its 2 s timeout")
	}
	// The socket file it bound is gone with it; the peer's path, which
	// it did not bind, is not its to remove.
	if _, err := os.Lstat(filepath.Join(dir, "gen.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gen's socket file after it ended: %v, want it removed", err)
	}
}

// A bad demo option of ctx or gen is refused before anything starts,
// naming the flag and its value. (Checked to fail: with proc's validate
// reverted to one message for all four options, "--requests = 0" is
// missing.) The error reads as the flag's, with no "proc:" (the internal
// package's name) before it (checked to fail with the prefix back).
func TestRoleOptionErrorsNameTheValue(t *testing.T) {
	dir := t.TempDir()
	base := []string{"ctx", "--insecure", "--bind", "ipc://" + filepath.Join(dir, "ctx.sock"),
		"--peer-endpoint", "ipc://" + filepath.Join(dir, "gen.sock"), "--pool", "64MiB", "--timeout", "5s"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--requests", "0"}, "--requests = 0: must be ≥ 1"},
		// (Checked to fail without the bound: the pool check that
		// follows named --pool instead; with a pool large enough the
		// role waited for its peer, then failed every request one by
		// one for minutes.)
		{[]string{"--requests", "100000000"}, "--requests = 100000000: at most 1048576"},
		{[]string{"--min-tokens", "0"}, "--min-tokens = 0"},
		{[]string{"--min-tokens", "600", "--max-tokens", "500"}, "--max-tokens = 500: must be ≥ --min-tokens (600)"},
		{[]string{"--concurrency", "-2"}, "--concurrency = -2"},
		{[]string{"--compute", "-1ms"}, "--compute = -1ms"},
		{[]string{"--chunk-tokens", "0"}, "--chunk-tokens = 0: must be ≥ 1"},
		// Before anything opens, not at each request's first chunk as
		// "kvcache: misaligned chunk" after both processes connected
		// (checked to fail without CheckChunkTokens: here the pool
		// check that follows it named --pool instead).
		{[]string{"--chunk-tokens", "100"}, "--chunk-tokens = 100: want a multiple of the block size, 32 tokens (--tokens-per-block)"},
		{[]string{"--tokens-per-block", "48"}, "--chunk-tokens = 512: want a multiple of the block size, 48 tokens (--tokens-per-block)"},
		{[]string{"--peer-endpoint", "ipc://" + filepath.Join(dir, "ctx.sock")}, "--bind and --peer-endpoint are both"},
		{[]string{"--peer-endpoint", "tcp://nohost:abc"}, `--peer-endpoint: control/zmq: bad config: endpoint "tcp://nohost:abc": port "abc" is not a number`},
		{[]string{"--bind", "tcp://127.0.0.1:99999"}, `--bind: control/zmq: bad config: endpoint "tcp://127.0.0.1:99999": port 99999 is out of range (1..65535)`},
		{[]string{"--bind", "tcp://127.0.0.1"}, `endpoint "tcp://127.0.0.1": no port`},
	} {
		_, err := run(append(append([]string{}, base...), c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "proc:") {
			t.Errorf("%v: %v, want no internal package's \"proc:\" in a user's error", c.args, err)
		}
	}
}

// `kvxfer ctx` waits for the generation process's Hello as gen waits for
// ctx's: with no gen, every request fails at --timeout naming the silent
// peer, not with each request's transfer deadline. (Checked to fail:
// without RunCtx's waitPeer each request said "transfer deadline
// passed".)
func TestCtxWaitsForGen(t *testing.T) {
	dir := t.TempDir()
	peer := "ipc://" + filepath.Join(dir, "gen.sock")
	ctx, cancel := context.WithTimeout(context.Background(), demoDeadline)
	defer cancel()
	out, _, err := runAppCtx(ctx, newApp(), "ctx", "--insecure", "--bind", "ipc://"+filepath.Join(dir, "ctx.sock"),
		"--peer-endpoint", peer, "--backend", "shm", "--pool", "1GiB", "--requests", "2", "--concurrency", "1", "--timeout", "2s")
	if err == nil || !strings.Contains(err.Error(), "said nothing") || !strings.Contains(err.Error(), "gen/0 at "+peer) {
		t.Fatalf("ctx without gen: %v\n%s", err, out)
	}
	if strings.Contains(out, "deadline passed") {
		t.Fatalf("ctx without gen waited for each request's deadline:\n%s", out)
	}
}

// A role's --pool larger than the memory available is refused before
// anything is mapped, naming --pool and the memory; the check itself
// refuses nothing where the memory is unknown. (A pool past the largest
// host region, so that a build without the check fails on the region at
// once, mapping nothing.) Before, the error was the region's, naming no
// flag.
func TestRolePoolPastMemory(t *testing.T) {
	dir := t.TempDir()
	for _, role := range []string{"ctx", "gen"} {
		args := []string{role, "--insecure", "--bind", "ipc://" + filepath.Join(dir, role+".sock"),
			"--peer-endpoint", "ipc://" + filepath.Join(dir, "peer.sock"), "--pool", "65537GiB", "--timeout", "5s", "--backend", "shm"}
		_, err := run(args...)
		if _, known := meminfo.Available(); !known {
			if err == nil || !strings.Contains(err.Error(), "--pool = 65537GiB: ") {
				t.Errorf("%s --pool 65537GiB: %v, want the region's error naming --pool", role, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), `--pool = "65537GiB": more than the `) || !strings.Contains(err.Error(), "GiB of memory available (MemAvailable): use a smaller --pool") {
			t.Errorf("%s --pool 65537GiB: %v, want a refusal naming --pool and the memory available", role, err)
		}
	}
}

// A role's pool set by KVXFER_POOL or a config file is named so in its
// errors, not as --pool, which the user never gave: a pool too small for
// the longest prompt, and one past the memory available (or, where that
// is unknown, one the host cannot map). Before, they said "--pool is too
// small for req-3 …: use a larger --pool" and "KVXFER_POOL = …: more
// than the …GiB of memory available (MemAvailable): use a smaller
// --pool".
func TestRoleNamesThePoolAsSet(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pool.yaml")
	if err := os.WriteFile(file, []byte("pool: 64MiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, memKnown := meminfo.Available()
	past := "use a smaller KVXFER_POOL"
	if !memKnown {
		past = "KVXFER_POOL = 65537GiB: "
	}
	for _, c := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"KVXFER_POOL": "64MiB"}, []string{"KVXFER_POOL is too small for req-", "use a larger KVXFER_POOL or a smaller --max-tokens"}},
		{map[string]string{"KVXFER_CONFIG": file}, []string{"pool (pool.yaml:1) is too small for req-", "use a larger pool (pool.yaml:1)"}},
		{map[string]string{"KVXFER_POOL": "65537GiB"}, []string{past}},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		for _, role := range []string{"ctx", "gen"} {
			args := []string{role, "--insecure", "--backend", "shm", "--max-tokens", "4096", "--timeout", "1s",
				"--bind", "ipc://" + filepath.Join(dir, role+".sock"), "--peer-endpoint", "ipc://" + filepath.Join(dir, "peer.sock")}
			_, err := run(args...)
			for _, want := range c.want {
				if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "--pool") {
					t.Errorf("%v %v: %v, want an error containing %q and no --pool", c.env, args, err, want)
				}
			}
		}
		for k := range c.env {
			t.Setenv(k, "")
		}
	}
}

// A --bind another process holds (a tcp:// port, an ipc:// path a live
// process accepts on), or an address not of this host, is refused naming
// --bind before the role maps its pool: with a large pool the bind's own
// failure came only after the pool was mapped and touched (about 15 s for
// a 4GiB gen pool on a 2-core machine), naming no flag. node.Open checks
// the endpoint before the pool (zmq.CheckBindFree; "endpoint in use" is
// that check's, not the later bind's) and nameFlags names the flag.
// (Checked to fail without resolve's zmq.CheckBindFree call, before Open
// checked: the errors were "node: gen/0: control/zmq: listen on tcp://…:
// bind: address already in use" and "node: gen/0: control/zmq: endpoint
// in use: …", neither naming --bind; and, once Open checked and resolve
// no longer did, without nameFlags' bindErr: "node: gen/0: bind:
// control/zmq: endpoint in use: …".)
func TestRoleRefusesABindInUseFirst(t *testing.T) {
	dir := t.TempDir()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	sock := filepath.Join(dir, "held.sock")
	unix, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close()
	for _, c := range []struct{ bind, peer, want string }{
		{"tcp://" + tcp.Addr().String(), "tcp://127.0.0.1:1", "--bind: control/zmq: endpoint in use: tcp://" + tcp.Addr().String() + ": port"},
		{"ipc://" + sock, "ipc://" + filepath.Join(dir, "peer.sock"), "--bind: control/zmq: endpoint in use: ipc://" + sock + " is in use by a live process"},
		// 192.0.2.1 (TEST-NET-1) is no host's address.
		{"tcp://192.0.2.1:5600", "tcp://127.0.0.1:1", `--bind: control/zmq: bad config: endpoint "tcp://192.0.2.1:5600": 192.0.2.1 is not an address of this host`},
	} {
		for _, role := range []string{"ctx", "gen"} {
			_, err := run(role, "--insecure", "--backend", "shm", "--pool", "64MiB", "--timeout", "5s",
				"--bind", c.bind, "--peer-endpoint", c.peer)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s --bind %s: %v, want an error containing %q", role, c.bind, err, c.want)
			}
		}
	}
}

// An empty --instance (a shell variable that was not set) is refused,
// naming the flag: the node took it for the library's default instance
// name ("kvxfer"), so the process ran as kvxfer/0 and its peer, waiting
// for ctx/0 or gen/0, refused its Hello at run time. An empty --peer was
// already refused, by the node. (Checked to fail without resolve's
// check: ctx ran as kvxfer/0 and failed at its 1 s timeout with "said
// nothing".)
func TestRoleRefusesAnEmptyInstance(t *testing.T) {
	dir := t.TempDir()
	for _, role := range []string{"ctx", "gen"} {
		_, err := run(role, "--instance", "", "--insecure", "--backend", "shm", "--pool", "64MiB", "--timeout", "1s",
			"--bind", "ipc://"+filepath.Join(dir, role+".sock"), "--peer-endpoint", "ipc://"+filepath.Join(dir, "peer.sock"))
		if want := `--instance = "": `; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s --instance '': %v, want an error containing %q", role, err, want)
		}
	}
}

// A role whose --pool cannot hold the longest prompt of its request list
// is refused as soon as its pool is known, naming --pool and
// --max-tokens, as the demo refuses one: before, it waited for its peer
// and then failed that request alone at run time ("kvcache: pool too
// small", naming neither flag; the peer saw it leave). (Checked to fail
// without proc's fitsPool: each role, with no peer, failed at its 1 s
// timeout with "said nothing".) The error starts with the flag, not with
// "proc:" (checked to fail with that prefix back).
func TestRolePoolTooSmallForTheLongestPrompt(t *testing.T) {
	dir := t.TempDir()
	for _, role := range []string{"ctx", "gen"} {
		_, err := run(role, "--insecure", "--backend", "shm", "--pool", "64MiB", "--max-tokens", "4096", "--timeout", "1s",
			"--bind", "ipc://"+filepath.Join(dir, role+".sock"), "--peer-endpoint", "ipc://"+filepath.Join(dir, "peer.sock"))
		if !errors.Is(err, kvcache.ErrPoolTooSmall) || !strings.HasPrefix(err.Error(), "--pool is too small for req-") ||
			!strings.Contains(err.Error(), "--max-tokens 4096") {
			t.Errorf("%s --pool 64MiB --max-tokens 4096: %v, want kvcache.ErrPoolTooSmall naming --pool and --max-tokens", role, err)
		}
	}
}

// --insecure given with --key or --peer-key is refused before the role
// runs (nothing bound, no pool mapped), naming --insecure and the key
// flags: --insecure turns CURVE off, and the keys were ignored without a
// word beyond the general insecure warning. --insecure alone still
// passes. (Checked to fail without resolve's checkInsecureKeys: each
// combination reached the run.)
func TestRoleRefusesInsecureWithKeys(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"ctx", "gen"} {
		if _, err := run("keygen", "--out", filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, role := range []string{"ctx", "gen"} {
		peer := map[string]string{"ctx": "gen", "gen": "ctx"}[role]
		key, peerKey := filepath.Join(dir, role+".key"), filepath.Join(dir, peer+".pub")
		base := []string{"--insecure", "--backend", "shm", "--pool", "64MiB",
			"--bind", "ipc://" + filepath.Join(dir, role+".sock"), "--peer-endpoint", "ipc://" + filepath.Join(dir, peer+".sock")}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--key", key}, "--insecure with --key " + key + ": "},
			{[]string{"--peer-key", peerKey}, "--insecure with --peer-key " + peerKey + ": "},
			{[]string{"--key", key, "--peer-key", peerKey}, "--insecure with --key " + key + " and --peer-key " + peerKey + ": "},
		} {
			o, err := roleOptions(t, role, append(append([]string{}, base...), c.args...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "the keys would be ignored") {
				t.Errorf("%s %v: %v, want an error containing %q", role, c.args, err, c.want)
			}
			if o.Instance != "" {
				t.Errorf("%s %v: the role ran", role, c.args)
			}
		}
		if o, err := roleOptions(t, role, base...); err != nil || !o.Insecure {
			t.Errorf("%s --insecure alone: %v (insecure %v), want it to run", role, err, o.Insecure)
		}
	}
}

// TestRoleRefusesItsOwnKeyAsThePeers: a role given its peer's keypair
// (--key gen.key --peer-key gen.pub on ctx), or its own public key as the
// peer's, is refused before it starts, naming both flags and files:
// before, it ran, and the two processes refused each other's handshakes,
// named only once both were running and as a wrong key, not as this.
// The right keys still pass. (Checked to fail without resolve's check:
// the role ran.)
func TestRoleRefusesItsOwnKeyAsThePeers(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"ctx", "gen"} {
		if _, err := run("keygen", "--out", filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--backend", "shm", "--pool", "64MiB",
		"--bind", "ipc://" + filepath.Join(dir, "ctx.sock"), "--peer-endpoint", "ipc://" + filepath.Join(dir, "gen.sock")}
	for _, prefix := range []string{"gen", "ctx"} {
		key, pub := filepath.Join(dir, prefix+".key"), filepath.Join(dir, prefix+".pub")
		o, err := roleOptions(t, "ctx", append(append([]string{}, base...), "--key", key, "--peer-key", pub)...)
		want := "--peer-key " + pub + " is the public key of this engine's own --key " + key
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ctx --key %s --peer-key %s: %v, want an error containing %q", key, pub, err, want)
		}
		if o.Instance != "" {
			t.Errorf("ctx --key %s --peer-key %s: the role ran", key, pub)
		}
	}
	if _, err := roleOptions(t, "ctx", append(append([]string{}, base...),
		"--key", filepath.Join(dir, "ctx.key"), "--peer-key", filepath.Join(dir, "gen.pub"))...); err != nil {
		t.Errorf("ctx with its own key and gen's public key: %v", err)
	}
}

// A decimal --pool is taken, rounded down to a whole byte count, as users
// write sizes ("1.5GiB"); before, it was refused with `unknown unit
// ".5GiB"`. (Small pools here: the role refuses one past the memory
// available.) A negative one is still refused, naming --pool. (Checked to
// fail without parseSize's decimals: the unknown unit.)
func TestRolePoolTakesADecimalSize(t *testing.T) {
	dir := t.TempDir()
	for _, role := range []string{"ctx", "gen"} {
		base := []string{"--insecure", "--backend", "shm", "--bind", "ipc://" + filepath.Join(dir, role+".sock"),
			"--peer-endpoint", "ipc://" + filepath.Join(dir, "peer.sock")}
		for pool, want := range map[string]uint64{"1.5MiB": 3 << 19, "0.0625GiB": 64 << 20, "64MiB": 64 << 20, "1000.9": 1000} {
			o, err := roleOptions(t, role, append([]string{"--pool", pool}, base...)...)
			if err != nil || o.PoolBytes != want {
				t.Errorf("%s --pool %s: %d bytes, %v; want %d", role, pool, o.PoolBytes, err, want)
			}
		}
		_, err := roleOptions(t, role, append([]string{"--pool", "-1.5GiB"}, base...)...)
		if want := `--pool = "-1.5GiB": want a byte count such as 4096, 64KiB, 16MiB or 1.5GiB, not a negative size`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s --pool -1.5GiB: %v, want an error containing %q", role, err, want)
		}
	}
}

// A value the node (or its engine) refuses is named by the flag the user
// gave, or the setting's variable, not by the node's config field:
// before, `--pool 1` said "node: bad config: pool_bytes = 1", a
// --tokens-per-block past the layout's bound "parallel = {TP:1 PP:1}:
// kvcache: bad layout: TokensPerBlock = …", and a --metrics-addr in use
// "kvxfer: MetricsAddr: …". The error still wraps the node's
// (node.ErrConfig). (Checked to fail without nameFlags and
// checkTokensPerBlock: each case named the node's field.)
func TestRoleNamesTheFlagNotTheNodeField(t *testing.T) {
	dir := t.TempDir()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	static := []string{"--bind", "ipc://" + filepath.Join(dir, "self.sock"), "--peer-endpoint", "ipc://" + filepath.Join(dir, "peer.sock")}
	// Refused before etcd is dialled: nothing listens at etcd's address.
	etcd := []string{"--bind", "tcp://127.0.0.1:1", "--discovery", "etcd://127.0.0.1:1", "--cluster", "c"}
	for _, c := range []struct {
		env        string // KVXFER_POOL, when set
		args       []string
		want, not  string
		configFail bool // the node's node.ErrConfig, wrapped
	}{
		{"", append([]string{"--pool", "1"}, static...), `--pool = "1": holds no block: one block of every layer group of Llama-3.1-8B is`, "pool_bytes", true},
		{"", append([]string{"--pool", "1KiB"}, static...), `--pool = "1KiB": holds no block`, "pool_bytes", true},
		{"1", static, `KVXFER_POOL = "1": holds no block`, "pool_bytes", true},
		{"", append([]string{"--tokens-per-block", "100000000"}, static...), `--tokens-per-block = "100000000": kvcache: bad layout: TokensPerBlock = 100000000, must be ≤ 65536`, "parallel", false},
		{"", append([]string{"--metrics-addr", held.Addr().String()}, static...), `--metrics-addr = "` + held.Addr().String() + `": listen tcp`, "MetricsAddr", false},
		{"", append([]string{"--instance", "a b"}, static...), `--instance = "a b": contains ' '`, "bad config", true},
		{"", append([]string{"--peer", "a b"}, static...), `--peer = "a b": contains ' '`, "peers[0]", true},
		{"", append([]string{"--discovery-ttl", "2h"}, etcd...), `--discovery-ttl = 2h0m0s: want 1s..`, "discovery_ttl", true},
		{"", append([]string{"--discovery-ttl", "0s"}, etcd...), `--discovery-ttl = 0s: want 1s..1h`, "discovery_ttl", false},
		{"", append([]string{"--discovery-ttl", "-1s"}, etcd...), `--discovery-ttl = -1s: want 1s..1h`, "discovery_ttl", false},
		{"", append([]string{"--tp", "3"}, etcd...), `--tp = 3, --pp = 1: kvcache: bad parallelism: KVHeads 8 of "Llama-3.1-8B" not divisible by TP 3`, "parallel =", true},
		{"", append([]string{"--peer-tp", "3"}, etcd...), `--peer-tp = 3, --peer-pp = 1: kvcache: bad parallelism`, "peers[0]", true},
	} {
		if c.env != "" {
			t.Setenv("KVXFER_POOL", c.env)
		}
		for _, role := range []string{"ctx", "gen"} {
			args := append([]string{role, "--insecure", "--backend", "shm", "--max-tokens", "512", "--timeout", "1s"}, c.args...)
			if c.env == "" && !slices.Contains(c.args, "--pool") {
				args = append(args, "--pool", "64MiB")
			}
			_, err := run(args...)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), c.not) {
				t.Errorf("%v: %v, want an error containing %q, not %q", args, err, c.want, c.not)
			}
			if c.configFail && !errors.Is(err, node.ErrConfig) {
				t.Errorf("%v: %v does not wrap node.ErrConfig", args, err)
			}
		}
		if c.env != "" {
			t.Setenv("KVXFER_POOL", "")
		}
	}
}

// A --bind that libzmq can only refuse once it binds, after the pool is
// mapped, is refused before, naming the flag and the mistake: an ipc://
// socket in a directory that is not there, or under a file, and a tcp://
// host that is neither an address nor an interface of this host. (Checked
// to fail without resolve's checkBindPlace: the errors were "node: ctx/0:
// control/zmq: listen on ipc://…/x.sock: bind: no such file or directory"
// and "…: bind: no such device", naming neither --bind nor the directory
// or host; a socket under a file was refused early, as "--bind:
// control/zmq: bad config: …: lstat …: not a directory".)
func TestRoleRefusesABindLibzmqCannotMake(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct{ bind, want string }{
		{"ipc://" + filepath.Join(missing, "x.sock"), `--bind = "ipc://` + filepath.Join(missing, "x.sock") + `": directory ` + missing + " does not exist"},
		{"ipc://" + filepath.Join(file, "x.sock"), `--bind = "ipc://` + filepath.Join(file, "x.sock") + `": ` + file + " is not a directory"},
		// .invalid never resolves (RFC 2606), and names no interface.
		{"tcp://nohost.invalid:5600", `--bind = "tcp://nohost.invalid:5600": "nohost.invalid" is neither an IP address nor an interface of this host`},
	} {
		for _, role := range []string{"ctx", "gen"} {
			_, err := run(role, "--insecure", "--backend", "shm", "--pool", "64MiB", "--timeout", "5s",
				"--bind", c.bind, "--peer-endpoint", "tcp://127.0.0.1:1")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s --bind %s: %v, want an error containing %q", role, c.bind, err, c.want)
			}
		}
	}
	// What libzmq binds passes: an interface name, every interface, an
	// IPv6 address in brackets, a relative ipc:// path (the working
	// directory's).
	binds := []string{"tcp://*:0", "tcp://[::1]:0", "tcp://[fe80::1%lo]:0", "ipc://x.sock"}
	if ifs, err := net.Interfaces(); err == nil && len(ifs) > 0 {
		binds = append(binds, "tcp://"+ifs[0].Name+":0")
	}
	for _, bind := range binds {
		if err := checkBindPlace(bind); err != nil {
			t.Errorf("checkBindPlace(%s): %v", bind, err)
		}
	}
}

// kvxfer gen takes --chunk-tokens only so that both roles accept one
// command line; a value kvxfer ctx refuses at once is refused by gen at
// once too, not after its --timeout for a ctx that never came, and gen
// without the flag still runs. (Checked to fail without gen's check:
// gen started and failed with "peer said nothing" at --timeout.)
func TestGenRefusesTheChunkTokensCtxRefuses(t *testing.T) {
	dir := t.TempDir()
	base := []string{"gen", "--insecure", "--bind", "ipc://" + filepath.Join(dir, "gen.sock"),
		"--peer-endpoint", "ipc://" + filepath.Join(dir, "ctx.sock"), "--backend", "shm", "--pool", "1GiB",
		"--requests", "1", "--timeout", "2s"}
	for _, c := range []struct{ value, want string }{
		{"0", "--chunk-tokens = 0: must be ≥ 1 (kvxfer ctx refuses it"},
		{"100", "--chunk-tokens = 100: want a multiple of the block size, 32 tokens (--tokens-per-block) (kvxfer ctx refuses it"},
	} {
		_, err := run(append(append([]string{}, base...), "--chunk-tokens", c.value)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("gen --chunk-tokens %s: %v, want %q", c.value, err, c.want)
		}
	}
}
