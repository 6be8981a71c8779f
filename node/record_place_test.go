package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
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

// registerRecord registers rec in etcd as a rank no process serves, its
// incarnation, endpoint, key, backend and agent address filled in, and
// closes its registry when the test ends.
func registerRecord(t *testing.T, url, cluster, dir string, rec discovery.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	reg, err := discovery.Open(ctx, url, cluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	rec.Incarnation = discovery.NewIncarnation()
	rec.ControlEndpoint = "ipc://" + filepath.Join(dir, fmt.Sprintf("fake-%s-%d.sock", rec.Instance, rec.Rank))
	rec.CurvePublicKey, rec.Backend, rec.AgentAddr = newKeys(t).public, shm.Backend, []byte("nobody")
	if err := reg.Register(ctx, rec); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdUnlistedRankOfAnotherParallelismIsRefused: the generation node
// lists ctx/0 as rank 0 of TP2 (and no other rank of ctx). ctx/0
// registers as such; ctx/1 registers as rank tp1 of TP4 (an operator's
// --tp 4 on one rank), and ctx/3 as rank tp1/pp0 of TP2 (a rank whose
// coordinates are not its rank's). Neither unlisted record may be taken
// (dialed, planned for): each is refused as a listed rank's would be,
// the log naming the record, its parallelism and the configured one, and
// a Receive that needs ctx/1 says so. (Checked to fail: peerUp checked
// only listed ranks, ctx/1 and ctx/3 were members, and the Receive went
// on waiting for ctx/1.)
func TestEtcdUnlistedRankOfAnotherParallelismIsRefused(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-unlisted"), t.TempDir()
	tp2 := node.Parallel{TP: 2, PP: 1}
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx", Parallel: tp2})
	var evs events
	gc.OnMembership = evs.add
	logs := logged(t, &gc)
	genN := open(t, gc)
	registerFake(t, url, cluster, dir, "ctx", messages.Parallel{TP: 2, PP: 1}, 0)
	registerFake(t, url, cluster, dir, "ctx", messages.Parallel{TP: 4, PP: 1}, 1)
	registerRecord(t, url, cluster, dir, discovery.Record{Instance: "ctx", Rank: 3, Parallel: messages.Parallel{TP: 2, PP: 1}, TP: 1})
	waitFor(t, patience, "ctx/0, ctx/1 and ctx/3 Up at gen", func() bool {
		_, a := evs.find(discovery.EventUp, "ctx", 0)
		_, b := evs.find(discovery.EventUp, "ctx", 1)
		_, c := evs.find(discovery.EventUp, "ctx", 3)
		return a && b && c
	})
	if !hasMember(genN, messages.PeerID{Instance: "ctx"}) {
		t.Fatalf("ctx/0, registered as configured, is not a member: %v", genN.Members())
	}
	for _, r := range []int32{1, 3} {
		if hasMember(genN, messages.PeerID{Instance: "ctx", Rank: r}) {
			t.Errorf("ctx/%d, registered otherwise than ctx's configured TP2/PP1, was taken: members %v", r, genN.Members())
		}
	}
	for _, want := range []string{
		"etcd record of ctx/1 refused: it registered as rank tp1/pp0 of TP4/PP1, but this node's config gives instance ctx TP2/PP1",
		"etcd record of ctx/3 refused: it registered as rank tp1/pp0 of TP2/PP1, which is rank 1 of ctx, not 3",
	} {
		if !logs.Has(want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	_, err := genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "unlisted", PromptLen: 16, Context: "ctx"})
	if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), "ctx/1 (its record in etcd cluster "+cluster+" was refused: it registered as rank tp1/pp0 of TP4/PP1") {
		t.Fatalf("Receive needing ctx/1: %v, want ErrUnknownPeer saying ctx/1's TP4 record was refused", err)
	}
}

// TestEtcdRefusalNamesTheFlagsThatDiffer: a record refused for its
// parallelism names the flags that differ: a ctx/0 of PP2 where the node
// expects PP1 is a --pp / --peer-pp mismatch, one of TP2 a --tp /
// --peer-tp one, and a rank of this node's own instance at another PP
// asks for the same --tp and --pp. (Checked to fail: every refusal said
// "compare the peer's --tp with this node's --peer-tp", the sibling line
// "give every rank of gen the same --tp", whatever differed.)
func TestEtcdRefusalNamesTheFlagsThatDiffer(t *testing.T) {
	url, dir := etcdURL(t), t.TempDir()
	for _, c := range []struct {
		name string
		par  messages.Parallel
		want string
	}{
		{"pp", messages.Parallel{TP: 1, PP: 2}, "it registered as rank tp0/pp0 of TP1/PP2, this node expects rank tp0/pp0 of TP1/PP1 (compare the peer's --pp with this node's --peer-pp)"},
		{"tp", messages.Parallel{TP: 2, PP: 1}, "it registered as rank tp0/pp0 of TP2/PP1, this node expects rank tp0/pp0 of TP1/PP1 (compare the peer's --tp with this node's --peer-tp)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cluster := clusterName("node-hint-" + c.name)
			if err := os.MkdirAll(filepath.Join(dir, c.name), 0o755); err != nil {
				t.Fatal(err)
			}
			gc := etcdNode(t, url, cluster, filepath.Join(dir, c.name), "gen", node.Peer{Instance: "ctx"})
			logs := logged(t, &gc)
			open(t, gc)
			registerFake(t, url, cluster, dir, "ctx", c.par, 0)
			waitFor(t, patience, "ctx/0's record refused", func() bool { return logs.Has("etcd record of ctx/0 refused") })
			if !logs.Has(c.want) {
				t.Errorf("log lacks %q:\n%s", c.want, logs)
			}
			if c.name != "pp" {
				return
			}
			registerRecord(t, url, cluster, dir, discovery.Record{Instance: "gen", Rank: 1, Parallel: messages.Parallel{TP: 1, PP: 2}, PP: 1})
			want := "rank gen/1 of this instance registered as TP1/PP2, this rank runs TP1/PP1: give every rank of gen the same --tp and --pp"
			waitFor(t, patience, "gen/1 named", func() bool { return logs.Has("rank gen/1 of this instance") })
			if !logs.Has(want) {
				t.Errorf("log lacks %q:\n%s", want, logs)
			}
		})
	}
}
