//go:build kvxfer_invariants

package trace_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestReplayWorkerRestart crashes both sender workers of the context side
// between two transfers (their endpoints open, so each restart closes
// them) and replays the trace: the workers' restarts, endpoint closes and
// reconnects replay through the real WorkerTable with every output as
// recorded.
func TestReplayWorkerRestart(t *testing.T) {
	dir := t.TempDir()
	one := kvcache.Parallel{TP: 1, PP: 1}
	c := startCluster(t, one, one, dir, nil)
	c.transfer(t, "before", 96, 32, true)
	e := c.ctx[0]
	for w := range 2 {
		e.CrashWorker(w)
	}
	checkFor(t, 10*time.Second, func() bool { return e.Stats().WorkerRestarts >= 2 })
	c.transfer(t, "after", 96, 32, false)
	c.close(t)

	path := filepath.Join(dir, "ctx-0.jsonl")
	res := replayFile(t, path)
	requireIdentical(t, path, res)
	requireTables(t, path, res, map[string]int{actors.TableWorker: 1})
	calls := map[string]int{}
	restarted := map[any]bool{}
	closedAfter, connectedAfter := 0, 0
	for _, l := range readLines(t, path) {
		if l["kind"] != "call" {
			continue
		}
		m := l["type"].(string)
		calls[m]++
		switch {
		case m == "Restart":
			restarted[l["actor"]] = true
		case m == "Close" && restarted[l["actor"]] && connectedAfter == 0:
			closedAfter++ // an endpoint the restart closed
		case m == "Connecting" && len(restarted) == 2:
			connectedAfter++
		}
	}
	// Each restart is a call; the endpoint open on the restarted worker
	// is closed, and the request after the restarts connects afresh.
	if calls["Restart"] != 2 || closedAfter == 0 || connectedAfter == 0 {
		t.Fatalf("worker calls %v (%d closes after the first restart, %d connects after both): want 2 Restart, then a Close, then a Connecting",
			calls, closedAfter, connectedAfter)
	}
	t.Logf("%d tables, %d calls replayed identically (%v)", len(res.Tables), res.Calls, calls)
}
