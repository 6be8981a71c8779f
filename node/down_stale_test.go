package node_test

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestDownOfAnotherIncarnationLeavesTheFoundOneUp: the node found
// incarnation 20 of ctx/0; a Down of incarnation 10 of ctx/0 (a stale
// one: the registry sends a rank's Down before its successor's Up, so it
// does not come today) must not fail incarnation 20's requests: no
// OnPeerDown, ctx/0 still a member at incarnation 20. A Down of
// incarnation 20 does both. (Checked to fail: apply called
// PeerDownBecause and OnPeerDown for any Down of a found rank.)
func TestDownOfAnotherIncarnationLeavesTheFoundOneUp(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-stale-down"), t.TempDir()
	gc := etcdNode(t, url, cluster, dir, "gen")
	var mu sync.Mutex
	var downs []string
	gc.OnPeerDown = func(instance string, rank int) {
		mu.Lock()
		defer mu.Unlock()
		downs = append(downs, (messages.PeerID{Instance: instance, Rank: int32(rank)}).String())
	}
	downCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(downs)
	}
	genN := open(t, gc)
	ctx0 := messages.PeerID{Instance: "ctx"}
	genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: discovery.Record{Instance: "ctx", Incarnation: 20,
		ControlEndpoint: "ipc://" + filepath.Join(dir, "ctx.sock"), CurvePublicKey: newKeys(t).public,
		Backend: shm.Backend, AgentAddr: []byte("nobody")}})
	member := func() uint64 {
		for _, r := range genN.Members() {
			if r.Peer() == ctx0 {
				return r.Incarnation
			}
		}
		return 0
	}
	if inc := member(); inc != 20 {
		t.Fatalf("after Up of incarnation 20 of ctx/0: member at incarnation %d, want 20", inc)
	}
	genN.Apply(discovery.Event{Kind: discovery.EventDown, Instance: "ctx", Incarnation: 10, Reason: discovery.ReasonLeaseExpired})
	if n, inc := downCount(), member(); n != 0 || inc != 20 {
		t.Fatalf("after a Down of incarnation 10 of ctx/0, whose incarnation 20 is up: OnPeerDown %d times, member at incarnation %d; want 0 and 20", n, inc)
	}
	genN.Apply(discovery.Event{Kind: discovery.EventDown, Instance: "ctx", Incarnation: 20, Reason: discovery.ReasonLeaseExpired})
	if n, inc := downCount(), member(); n != 1 || inc != 0 {
		t.Fatalf("after a Down of incarnation 20 of ctx/0: OnPeerDown %d times, member at incarnation %d; want 1 and none", n, inc)
	}
}
