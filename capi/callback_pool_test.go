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
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan Event, 1), make(chan struct{})
	d.SetNotify(func(ev Event) {
		entered <- ev
		<-release
	})
	_, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "cbpool-p"}})
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
	// The callback is under way: the pool it reads must stay mapped, also
	// once the engine's own Close returned (Close then waits for the
	// callback).
	deadline := time.Now().Add(10 * time.Second)
	for !d.Inner().WritesOver() || goroutinesIn("kvxfer/kvxfer.(*Engine).Close") > 0 {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the engine's Close did not return in 10 s")
		}
		runtime.Gosched()
	}
	unmapped := region.Bytes() == nil
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if unmapped {
		t.Fatal("engine's pool unmapped while a callback of a READY event was still running")
	}
	if err := p.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
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
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan Event, 1), make(chan struct{})
	d.SetNotify(func(ev Event) {
		entered <- ev
		<-release
	})
	_, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "cbnode-p"}})
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
	// The callback is under way: the node's close goes as far as it may
	// (its engine closed, then it waits for the callback) — or, as before,
	// it lets the pool go.
	deadline := time.Now().Add(10 * time.Second)
	for region.Bytes() != nil && (!d.Inner().WritesOver() || goroutinesIn("capi.(*Engine).endCallbacks") == 0) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the node's engine did not close in 10 s")
		}
		runtime.Gosched()
	}
	unmapped := region.Bytes() == nil
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if unmapped {
		t.Fatal("node's pool let go while a callback of a READY event was still running")
	}
}
