package node_test

import (
	"testing"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
)

// hasMember reports whether n's etcd members include peer id.
func hasMember(n *node.Node, id messages.PeerID) bool {
	for _, r := range n.Members() {
		if r.Peer() == id {
			return true
		}
	}
	return false
}

// TestEtcdRecordOfTheDefaultSplitSpelledOutIsTaken: the generation node
// lists ctx/0 as rank pp0 of PP2 (the default split of tiny's 2 layers);
// ctx/0's record spells that split out ("1,1"). It is the rank the node
// expects, and must be found, not refused as another parallelism.
// (Checked to fail: peerUp compared the record's Stages as they came and
// refused "TP1/PP2(1,1)" against "TP1/PP2".)
func TestEtcdRecordOfTheDefaultSplitSpelledOutIsTaken(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-split"), t.TempDir()
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx", Parallel: node.Parallel{TP: 1, PP: 2}})
	var evs events
	gc.OnMembership = evs.add
	logs := logged(t, &gc)
	genN := open(t, gc)
	registerFake(t, url, cluster, dir, "ctx", messages.Parallel{TP: 1, PP: 2, Stages: "1,1"}, 0)
	waitFor(t, patience, "ctx/0 Up at gen", func() bool { _, ok := evs.find(discovery.EventUp, "ctx", 0); return ok })
	if !hasMember(genN, messages.PeerID{Instance: "ctx"}) || logs.Has("refused") {
		t.Fatalf("ctx/0 registered as TP1/PP2(1,1), the default split of 2 layers, was not taken: members %v, log:\n%s", genN.Members(), logs)
	}
}
