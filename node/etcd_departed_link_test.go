package node_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/testlog"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestEtcdDepartedPeersLeaveTheLink: peers under new names (an
// autoscaler's) register in etcd and leave, never having listened. The
// context node's link forgets each at its Down: the fds its heartbeat
// sockets and monitors held come back, and a new peer is still dialled.
func TestEtcdDepartedPeersLeaveTheLink(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("departed-link"), t.TempDir()
	var mu sync.Mutex
	ups, downs := 0, 0
	count := func() (int, int) { mu.Lock(); defer mu.Unlock(); return ups, downs }
	cc := node.Config{Instance: "ctx", Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend, SendOnly: true,
		Bind: "ipc://" + filepath.Join(dir, "ctx.sock"), SecretKey: newKeys(t).secret, HeartbeatInterval: node.Duration(20 * time.Millisecond),
		HeartbeatMisses: 100, TransferTimeout: node.Duration(patience), Discovery: url, Cluster: cluster,
		OnMembership: func(ev discovery.Event) {
			mu.Lock()
			defer mu.Unlock()
			switch ev.Kind {
			case discovery.EventUp:
				ups++
			case discovery.EventDown:
				downs++
			}
		}}
	ctxN := open(t, cc)
	start := testlog.OpenFDs(t)
	const peers = 60
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	// One at a time, so that the registries' own fds are gone by the end.
	for i := range peers {
		reg, err := discovery.Open(ctx, url, cluster, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := messages.PeerID{Instance: fmt.Sprintf("gone%d", i)}
		rec := discovery.Record{Instance: id.Instance, Incarnation: discovery.NewIncarnation(),
			ControlEndpoint: "ipc://" + filepath.Join(dir, id.Instance+".sock"), CurvePublicKey: newKeys(t).public,
			Backend: shm.Backend, AgentAddr: []byte("nobody"), Parallel: messages.Parallel{TP: 1, PP: 1}}
		if err := reg.Register(ctx, rec); err != nil {
			t.Fatal(err)
		}
		waitFor(t, patience, id.String()+"'s Up", func() bool { u, _ := count(); return u > i })
		waitFor(t, patience, "the link dialling "+id.String(), func() bool {
			st, err := ctxN.PeerState(id)
			return err == nil && (st.Conn != zmq.ConnConnecting || st.Reason != "" || !st.Since.IsZero())
		})
		if err := reg.Close(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, patience, id.String()+"'s Down", func() bool { _, d := count(); return d > i })
	}
	waitFor(t, patience, fmt.Sprintf("the fds of %d departed peers released (%d at the start)", peers, start), func() bool {
		return testlog.OpenFDs(t) <= start+peers/6
	})
	if _, err := ctxN.PeerState(messages.PeerID{Instance: "gone0"}); err == nil {
		t.Fatal("the link still knows a departed peer")
	}

	gc := node.Config{Instance: "gen", Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend,
		Bind: "ipc://" + filepath.Join(dir, "gen.sock"), SecretKey: newKeys(t).secret, HeartbeatInterval: node.Duration(beat),
		TransferTimeout: node.Duration(patience), Discovery: url, Cluster: cluster, Peers: []node.Peer{{Instance: "ctx"}}}
	genN := open(t, gc)
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the context node's connection to a new peer up", func() bool {
		st, err := ctxN.PeerState(messages.PeerID{Instance: "gen"})
		return err == nil && st.Conn == zmq.ConnUp
	})
}

// TestEtcdRestartWithANewKeyIsHeard: a generation rank leaves and comes
// back under its name with a new CURVE key. The context node takes the new
// key's Hello at once (not after the old one's heartbeats run out): the
// new rank's first request moves within a few beats.
func TestEtcdRestartWithANewKeyIsHeard(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("newkey"), t.TempDir()
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(beat), HeartbeatMisses: 30, TransferTimeout: node.Duration(patience),
		Discovery: url, Cluster: cluster}
	cc, gc := base, base
	cc.Instance, cc.Bind, cc.SecretKey, cc.SendOnly = "ctx", "ipc://"+filepath.Join(dir, "ctx.sock"), newKeys(t).secret, true
	gc.Instance, gc.Bind, gc.Peers = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), []node.Peer{{Instance: "ctx"}}
	ctxN := open(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	move := func(genN *node.Node, id string, within time.Duration) {
		t.Helper()
		rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		if err := send(ctxN.Engine(), kvxfer.SendRequest{ID: id, PromptLen: 32}, pattern); err != nil {
			t.Fatal(err)
		}
		select {
		case o := <-rx.Done():
			if !o.OK {
				t.Fatalf("%s: %s %v", id, o.Status, o.Err)
			}
		case <-time.After(within): // a deadline, not a wait for a condition
			t.Fatalf("%s did not move within %v", id, within)
		}
	}
	for i := range 2 {
		g := gc
		g.SecretKey = newKeys(t).secret
		genN, err := node.Open(context.Background(), g)
		if err != nil {
			t.Fatal(err)
		}
		if err := genN.WaitPeers(ctx); err != nil {
			t.Fatal(err)
		}
		move(genN, fmt.Sprintf("newkey-%d", i), 10*beat)
		if err := genN.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
