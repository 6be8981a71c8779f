package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
)

// registerFake registers, in etcd, a record of rank (tp, 0) of instance
// under parallelism par that no process serves (a rank killed whose lease
// has not run out yet), and closes its registry when the test ends.
func registerFake(t *testing.T, url, cluster, dir, instance string, par messages.Parallel, tp int32) {
	t.Helper()
	registerRecord(t, url, cluster, dir, discovery.Record{Instance: instance, Rank: tp, Parallel: par, TP: tp})
}

// deleteRecord deletes the etcd record of rank of instance, as an operator
// (or an expired lease) would: etcd's word that the rank is out.
func deleteRecord(t *testing.T, url, cluster, instance string, rank int32) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{strings.TrimPrefix(url, "etcd://")}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Delete(context.Background(), discovery.Key(cluster, instance, rank)); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdDerivedParallelIsRankZeros: etcd holds two records of context
// instance ctx that disagree — ctx/0 of TP2, which is what ctx runs as
// now, and ctx/3 of TP4, a rank of the instance's previous deployment
// whose lease has not run out — and neither has said Hello. A Receive
// that names no ContextParallel must plan for rank 0's TP2, every time,
// not for whichever record a map walk meets first. (Checked to fail:
// instanceParallel took the first record of the instance in n.found's
// random order, and about half the calls planned for TP4.)
func TestEtcdDerivedParallelIsRankZeros(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-derive"), t.TempDir()
	gc := etcdNode(t, url, cluster, dir, "gen")
	var ups events
	gc.OnMembership = ups.add
	genN := open(t, gc)
	registerFake(t, url, cluster, dir, "ctx", messages.Parallel{TP: 4, PP: 1}, 3)
	registerFake(t, url, cluster, dir, "ctx", messages.Parallel{TP: 2, PP: 1}, 0)
	waitFor(t, patience, "ctx/0 and ctx/3 Up at gen", func() bool {
		_, a := ups.find(discovery.EventUp, "ctx", 0)
		_, b := ups.find(discovery.EventUp, "ctx", 3)
		return a && b
	})
	for i := range 40 {
		_, err := genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "derive", PromptLen: 16, Context: "ctx"})
		// TP2: gen (TP1) needs ctx/0 and ctx/1, and etcd has no ctx/1.
		if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), "writer ctx/1 ") || strings.Contains(err.Error(), "TP4") {
			t.Fatalf("Receive %d without a ContextParallel: %v; want it planned for rank 0's TP2 (ErrUnknownPeer naming ctx/1)", i, err)
		}
	}
}

// TestEtcdDerivedParallelIsNotADepartedRanksHello: ctx/0 said Hello as
// TP1, then its record left etcd (deleted: etcd's word that it is out)
// while its process lives on, and a new incarnation of ctx/0 registered
// as TP2. A Receive naming no ContextParallel must plan for the rank etcd
// holds now, not for the Hello of the incarnation etcd put out (which the
// old process repeats every few heartbeats, and which the link then holds
// again). (Checked to fail: the link's Hello of ctx/0, the old
// incarnation's, won over etcd's record.)
func TestEtcdDerivedParallelIsNotADepartedRanksHello(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-derive-old"), t.TempDir()
	gc := etcdNode(t, url, cluster, dir, "gen")
	var evs events
	gc.OnMembership = evs.add
	genN := open(t, gc)
	cc := etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"})
	cc.HeartbeatMisses = 2 // its Hello again every 2 beats
	ctxN := open(t, cc)
	wctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := ctxN.WaitPeers(wctx); err != nil {
		t.Fatal(err)
	}
	ctx0 := messages.PeerID{Instance: "ctx"}
	deleteRecord(t, url, cluster, "ctx", 0)
	waitFor(t, patience, "ctx/0 Down at gen", func() bool { _, ok := evs.find(discovery.EventDown, "ctx", 0); return ok })
	registerFake(t, url, cluster, dir, "ctx", messages.Parallel{TP: 2, PP: 1}, 0)
	// The old process goes on saying Hello; gen's link refuses it (a
	// removed incarnation's) and holds none of ctx/0.
	waitFor(t, patience, "the new ctx/0 Up at gen, and the old one's Hello refused by gen's link", func() bool {
		_, err := genN.LinkHello(ctx0)
		return len(genN.Members()) == 1 && genN.Members()[0].Parallel.TP == 2 && err != nil && genN.DepartedHellos() > 0
	})
	_, err := genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "derive", PromptLen: 16, Context: "ctx"})
	if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), "writer ctx/1 ") {
		t.Fatalf("Receive without a ContextParallel: %v; want it planned for the TP2 etcd holds (ErrUnknownPeer naming ctx/1)", err)
	}
}
