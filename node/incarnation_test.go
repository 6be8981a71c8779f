package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/discovery"
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

// TestEtcdHelloOfADepartedIncarnationIsNotTheRecords: ctx/0 said Hello,
// then its record left etcd (deleted: etcd's word that it is out) while
// its process lives on and repeats its Hello; a new incarnation of ctx/0
// registered (no process serves it: it has not spoken). The departed
// incarnation's Hello is not taken for the new one's: tend logs no second
// "peer said Hello", WaitPeers does not count ctx/0 as having spoken
// (ErrPeerSilent at its deadline). (Checked to fail, before the link refused a
// removed incarnation's Hello and the node told it by its incarnation:
// tend logged "peer said Hello" again, and WaitPeers judged the new
// incarnation's endpoint by the old Hello, ErrPeerUnreachable.)
func TestEtcdHelloOfADepartedIncarnationIsNotTheRecords(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-old-hello"), t.TempDir()
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	var evs events
	gc.OnMembership = evs.add
	logs := logged(t, &gc)
	genN := open(t, gc)
	cc := etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"})
	cc.HeartbeatMisses = 2 // its Hello again every 2 beats
	ctxN := open(t, cc)
	wctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(wctx); err != nil {
		t.Fatal(err)
	}
	old := ctxN.Incarnation()
	waitFor(t, patience, "gen's tend took ctx/0's Hello", func() bool { return logs.Has(`"peer said Hello"`) })
	ctx0 := messages.PeerID{Instance: "ctx"}
	deleteRecord(t, url, cluster, "ctx", 0)
	waitFor(t, patience, "ctx/0 Down at gen", func() bool { _, ok := evs.find(discovery.EventDown, "ctx", 0); return ok })
	registerFake(t, url, cluster, dir, "ctx", messages.Parallel{TP: 1, PP: 1}, 0)
	var now uint64
	// The old process goes on saying Hello: gen's link refuses it (a
	// removed incarnation's, control/zmq), and, should one get through,
	// gen's node tells it from the record's by its incarnation (the
	// internal TestOtherIncarnationOnlyOfADepartedRecord).
	waitFor(t, patience, "the new ctx/0 Up at gen, and the old one's Hello refused by gen's link", func() bool {
		_, err := genN.LinkHello(ctx0)
		m := genN.Members()
		if len(m) == 1 {
			now = m[0].Incarnation
		}
		return len(m) == 1 && now != old && err != nil && genN.DepartedHellos() > 0
	})
	wctx, cancel = context.WithTimeout(context.Background(), 4*beat)
	defer cancel()
	err := genN.WaitPeers(wctx)
	if !errors.Is(err, node.ErrPeerSilent) || !strings.Contains(err.Error(), "ctx/0") {
		t.Fatalf("WaitPeers with only the departed incarnation's Hello: %v, want ErrPeerSilent naming ctx/0", err)
	}
	if c := logs.Count(`"peer said Hello"`); c != 1 {
		t.Fatalf("gen logged \"peer said Hello\" %d times, want once (the departed incarnation's, before it departed)", c)
	}
}
