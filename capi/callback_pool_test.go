package capi

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// A callback under way when Close starts may read its READY blocks: Close
// waits for it (SetNotify), so the engine's own pool must stay mapped
// until it returned.
func TestCloseKeepsPoolMappedDuringCallback(t *testing.T) {
	p, d := open(t, "cbpool-p"), open(t, "cbpool-d")
	// The engine's own Close returned, and Close waits for the callback.
	closedBut := func() bool { return d.Inner().WritesOver() && goroutinesIn("kvxfer/kvxfer.(*Engine).Close") == 0 }
	if callbackSawPoolGo(t, p, d, "cbpool-p", closedBut) {
		t.Fatal("engine's pool unmapped while a callback of a READY event was still running")
	}
	if err := p.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// callbackSawPoolGo runs a request from p into d whose READY callback
// blocks, closes d, waits until closedBut (d's close went as far as it
// may while the callback runs) or d's pool region is marked gone, then
// lets the callback return and d's close end: true when the pool went
// while the callback was running.
func callbackSawPoolGo(t *testing.T, p, d *Engine, context string, closedBut func() bool) bool {
	t.Helper()
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan Event, 1), make(chan struct{})
	d.SetNotify(func(ev Event) {
		entered <- ev
		<-release
	})
	_, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: context}})
	if err != nil {
		t.Fatal(err)
	}
	tx, th, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "r", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Chunk(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, p, th)
	var ev Event
	select {
	case ev = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no callback in 10 s")
	}
	if ev.Request != rh || ev.Outcome != OutcomeReady {
		t.Fatalf("callback for %+v, want READY of request %d", ev, rh)
	}
	region := d.Inner().Region()
	closed := make(chan error, 1)
	go func() { closed <- d.Close(10 * time.Second) }()
	deadline := time.Now().Add(10 * time.Second)
	for region.Bytes() != nil && !closedBut() {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the engine's close did not get as far as the callback in 10 s")
		}
		runtime.Gosched()
	}
	gone := region.Bytes() == nil
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	return gone
}

// As TestCloseKeepsPoolMappedDuringCallback for an engine a node opened
// (kvxfer_node_open): the node's Close let its pool go (marked closed,
// then unmapped) inside the close, before the ABI's callbacks under way
// had returned; now the node waits for them first (BeforeMemoryGoes).
func TestNodeCloseKeepsPoolMappedDuringCallback(t *testing.T) {
	dir := t.TempDir()
	nodeJSON := func(self, peer string) string {
		return fmt.Sprintf(`{"instance":%q,%s,"workers":2,"backend":"shm","insecure":true,"bind":"ipc://%s",`+
			`"peers":[{"instance":%q,"endpoint":"ipc://%s"}],"heartbeat_interval":"200ms","pool_bytes":65536}`,
			self, tinyLayout, filepath.Join(dir, self+".sock"), peer, filepath.Join(dir, peer+".sock"))
	}
	d, _, err := OpenNode(nodeJSON("cbnode-d", "cbnode-p"))
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := OpenNode(nodeJSON("cbnode-p", "cbnode-d"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(10 * time.Second)
	if err := d.WaitPeers(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The node's engine closed, and the node waits for the callback.
	closedBut := func() bool { return d.Inner().WritesOver() && goroutinesIn("capi.(*Engine).endCallbacks") > 0 }
	if callbackSawPoolGo(t, p, d, "cbnode-p", closedBut) {
		t.Fatal("node's pool let go while a callback of a READY event was still running")
	}
}
