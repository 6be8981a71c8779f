package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestDepartedPeerPoolUnmapped: a context node writes one request into
// each of several generation nodes, which then close for good (an
// instance scaled away; each has its own name). Once the context node has
// seen each of them down, it must no longer map their pools: a departed
// peer's whole pool (its tmpfs pages, unlinked or not) would otherwise
// stay pinned by this process for its life, with a copier goroutine per
// endpoint (found by a leak review: one mapping per worker per departed
// peer; fails without the workers retiring a down peer's endpoint).
func TestDepartedPeerPoolUnmapped(t *testing.T) {
	const peers = 6
	dir := t.TempDir()
	ck := newKeys(t)
	ep := func(n string) string { return "ipc://" + filepath.Join(dir, n+".sock") }
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(100 * time.Millisecond), TransferTimeout: node.Duration(patience)}
	cc := base
	cc.Instance, cc.Bind, cc.SecretKey, cc.SendOnly = "ctx", ep("ctx"), ck.secret, true
	var down atomic.Int32
	cc.OnPeerDown = func(string, int) { down.Add(1) }
	gks := make([]keys, peers)
	for i := range gks {
		gks[i] = newKeys(t)
		cc.Peers = append(cc.Peers, node.Peer{Instance: fmt.Sprintf("dep%d", i), Endpoint: ep(fmt.Sprintf("dep%d", i)), PublicKey: gks[i].public})
	}
	ctxN := open(t, cc)
	for i := range peers {
		gc := base
		gc.Instance, gc.Bind, gc.SecretKey = fmt.Sprintf("dep%d", i), ep(fmt.Sprintf("dep%d", i)), gks[i].secret
		gc.Peers = []node.Peer{{Instance: "ctx", Endpoint: ep("ctx"), PublicKey: ck.public}}
		genN, err := node.Open(context.Background(), gc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		if err := genN.WaitPeers(ctx); err != nil {
			t.Fatal(err)
		}
		for r := range 4 { // requests spread over the context node's workers
			id := fmt.Sprintf("dep%d-%d", i, r)
			rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
			if err := send(ctxN.Engine(), kvxfer.SendRequest{ID: id, PromptLen: 32}, pattern); err != nil {
				t.Fatal(err)
			}
			if o := <-rx.Done(); !o.OK {
				t.Fatalf("%s: %s %v", id, o.Status, o.Err)
			}
		}
		d0 := down.Load()
		if err := genN.Close(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		waitFor(t, patience, "the context node's word that the peer is down", func() bool { return down.Load() > d0 })
	}
	mapped := func() []string {
		b, _ := os.ReadFile("/proc/self/maps")
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "kvxfer-dep") {
				out = append(out, l)
			}
		}
		return out
	}
	// Every generation node is closed: what still maps their pools is the
	// context node. Give it a few beats.
	deadline := time.Now().Add(20 * beat)
	for len(mapped()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // poll with a deadline
	}
	if m := mapped(); len(m) > 0 {
		t.Fatalf("%d departed peers, down for %v: the context node still maps %d of their pools:\n%s",
			peers, 20*beat, len(m), strings.Join(m, "\n"))
	}
}
