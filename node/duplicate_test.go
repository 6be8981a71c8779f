package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
)

// TestEtcdDuplicateRankTakesNoPlace: a second process started as ctx/0
// (the same config twice: the same instance, rank and key) while ctx/0
// runs waits in Register, its key held by the live one, and fails Open
// with ErrHeld when its context ends. Meanwhile it must not speak to the
// cluster as ctx/0: the generation node keeps the live ctx/0's Hello,
// hears of no Down, and a request still moves between them.
func TestEtcdDuplicateRankTakesNoPlace(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-duplicate"), t.TempDir()
	cc := etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"})
	cc.SendOnly = true // private memory: two nodes of ctx fit in one process
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	var downs atomic.Int32
	gc.OnPeerDown = func(string, int) { downs.Add(1) }
	ctxN, genN := open(t, cc), open(t, gc)
	wctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, n := range []*node.Node{ctxN, genN} {
		if err := n.WaitPeers(wctx); err != nil {
			t.Fatal(err)
		}
	}
	ctxID := messages.PeerID{Instance: "ctx", Rank: 0}
	live := ctxN.Incarnation()

	dup := cc
	dup.Bind = "ipc://" + filepath.Join(dir, "ctx-dup.sock") // another host's same port
	dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer dcancel()
	d, err := node.Open(dctx, dup)
	if err == nil {
		d.Close(context.Background())
		t.Fatal("a second ctx/0 opened while the first is registered")
	}
	if !errors.Is(err, discovery.ErrHeld) {
		t.Fatalf("the second ctx/0's Open: %v, want ErrHeld", err)
	}
	if h, err := genN.LinkHello(ctxID); err != nil || h.Incarnation != live {
		inc := uint64(0)
		if h != nil {
			inc = h.Incarnation
		}
		t.Errorf("the generation node holds the Hello of ctx/0 incarnation %d (%v), want the live one's, %d", inc, err, live)
	}
	if n := downs.Load(); n != 0 {
		t.Errorf("the generation node heard ctx/0 down %d times; it never went", n)
	}
	moveOne(t, ctxN, genN, "after-dup", 40)
}
