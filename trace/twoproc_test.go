package trace_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/proc"
)

// TestTwoProcessReplay records a real two-process run — this test binary
// re-executed as a generation and a context process, ZeroMQ with CURVE
// between them, the shared-memory backend — each process tracing to its
// own file, and replays both files identically.
func TestTwoProcessReplay(t *testing.T) {
	dir := t.TempDir()
	const requests = 6
	base := proc.Options{Model: "Llama-3.1-8B", TokensPerBlock: 16, PoolBytes: 128 << 20, Workers: 2,
		Requests: requests, MinTokens: 64, MaxTokens: 384, ChunkTokens: 64, Concurrency: 2, Seed: 7,
		Heartbeat: time.Second, HeartbeatMisses: 5, Timeout: 30 * time.Second}
	gpub, gsec, err := zmq.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	cpub, csec, err := zmq.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	gen, ctx := base, base
	gen.Instance, gen.Peer, gen.SecretKey, gen.PeerPublicKey = "gen", "ctx", gsec, cpub
	ctx.Instance, ctx.Peer, ctx.SecretKey, ctx.PeerPublicKey = "ctx", "gen", csec, gpub
	gen.Bind, ctx.Bind = "ipc://"+filepath.Join(dir, "gen.sock"), "ipc://"+filepath.Join(dir, "ctx.sock")
	gen.PeerEndpoint, ctx.PeerEndpoint = ctx.Bind, gen.Bind
	gen.TracePath, ctx.TracePath = filepath.Join(dir, "gen.jsonl"), filepath.Join(dir, "ctx.jsonl")

	spawn := func(role string, o proc.Options) *exec.Cmd {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"="+role, optsEnv+"="+string(b))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	wait := func(role string, cmd *exec.Cmd) {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s process: %v", role, err)
			}
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("%s process did not end within 2 minutes", role)
		}
	}
	g := spawn("gen", gen)
	c := spawn("ctx", ctx)
	wait("ctx", c)
	wait("gen", g)

	for _, tc := range []struct {
		path, side, state string
		// calls: the least calls on each kind of table.
		calls map[string]int
	}{
		// Each request: Send's Open, its RequestData and Resolved, its
		// Stopped; each op Admitted and Settled (≥ 1 op a request); each
		// RequestData routed by the listener.
		{ctx.TracePath, "tx", "DONE", map[string]int{actors.TableTx: 4 * requests, actors.TableWorker: 2 * requests, actors.TableRoute: requests}},
		// Each request: Started, DownWriters, Start, Stopped on the rx
		// table and at least one Result routed; pushed and drained.
		{gen.TracePath, "rx", "READY", map[string]int{actors.TableRx: 5 * requests, actors.TableAlloc: 2 * requests, actors.TableRoute: requests}},
	} {
		res := replayFile(t, tc.path)
		requireIdentical(t, tc.path, res)
		requireTables(t, tc.path, res, tc.calls)
		if len(res.Sessions) != requests {
			t.Fatalf("%s: %d sessions, want %d", tc.path, len(res.Sessions), requests)
		}
		for _, s := range res.Sessions {
			if s.Side != tc.side || s.State != tc.state || !s.Stopped {
				t.Errorf("%s: session %+v, want %s %s and stopped", tc.path, s, tc.side, tc.state)
			}
		}
		t.Logf("%s: %d records, %d sessions, %d births + %d steps, %d tables + %d calls replayed identically",
			filepath.Base(tc.path), res.Records, len(res.Sessions), res.Births, res.Steps, len(res.Tables), res.Calls)
	}
}
