package node_test

import (
	"context"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
)

// TestEtcdRecordIsTheHellosIncarnation: a node registers in etcd the
// incarnation its engine says Hello with, so that a peer ties the Hello
// it holds to the record etcd holds (a Hello of another incarnation is a
// departed one's). (Checked to fail: register took a new incarnation of
// its own, discovery.NewIncarnation, besides the engine's.)
func TestEtcdRecordIsTheHellosIncarnation(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-inc"), t.TempDir()
	genN := open(t, etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"}))
	ctxN := open(t, etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"}))
	if got, want := ctxN.Incarnation(), ctxN.Engine().Hello().Incarnation; got != want || got == 0 {
		t.Fatalf("ctx registered incarnation %d, its engine says Hello as %d", got, want)
	}
	wctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(wctx); err != nil {
		t.Fatal(err)
	}
	h, err := genN.LinkHello(messages.PeerID{Instance: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if m := genN.Members(); len(m) != 1 || m[0].Incarnation != h.Incarnation {
		t.Fatalf("gen holds ctx/0's Hello of incarnation %d and its etcd records %v: want the record of that incarnation", h.Incarnation, m)
	}
}
