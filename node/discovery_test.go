package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/etcdlocal"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// One embedded etcd serves every test that needs one, each under its own
// cluster name; TestMain stops it before the leak check.
var testEtcd etcdlocal.Shared

func etcdURL(t testing.TB) string {
	t.Helper()
	srv, err := testEtcd.Get()
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	return srv.URL()
}

func stopEtcd() { testEtcd.Close() }

// events records a node's membership events.
type events struct {
	mu  sync.Mutex
	evs []discovery.Event
}

func (e *events) add(ev discovery.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

// find is the first event of kind about (instance, rank).
func (e *events) find(kind discovery.EventKind, instance string, rank int32) (discovery.Event, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.evs {
		in, r := ev.Instance, ev.Rank
		if kind == discovery.EventUp {
			in, r = ev.Record.Instance, ev.Record.Rank
		}
		if ev.Kind == kind && in == instance && r == rank {
			return ev, true
		}
	}
	return discovery.Event{}, false
}

// TestEtcdDiscoveryMovesARequest: a context instance of TP2 (two nodes)
// and a generation node of TP1 know nothing of each other's endpoints or
// keys: they find both through etcd (CURVE keys included), a request moves
// with every byte verified, and a context rank that closes is Down with
// reason "left" at the generation node. (Checked to fail: with peerUp's
// AddPeer removed WaitPeers names ctx/0 and ctx/1 as silent.)
func TestEtcdDiscoveryMovesARequest(t *testing.T) {
	url := etcdURL(t)
	dir := t.TempDir()
	ep := func(n string) string { return "ipc://" + filepath.Join(dir, n+".sock") }
	tp2 := node.Parallel{TP: 2, PP: 1}
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience),
		Discovery: url, Cluster: clusterName("node-moves"), DiscoveryTTL: node.Duration(2 * time.Second)}
	gc := base
	gc.Instance, gc.Bind, gc.SecretKey = "gen", ep("gen"), newKeys(t).secret
	var genEvents events
	gc.OnMembership = genEvents.add
	var ctxs []*node.Node
	for r := range 2 {
		gc.Peers = append(gc.Peers, node.Peer{Instance: "ctx", Parallel: tp2, Rank: node.Rank{TP: r}})
		cc := base
		cc.Instance, cc.Parallel, cc.Rank, cc.Bind, cc.SecretKey = "ctx", tp2, node.Rank{TP: r}, ep(fmt.Sprint("ctx", r)), newKeys(t).secret
		ctxs = append(ctxs, open(t, cc))
	}
	genN := open(t, gc)
	if genN.Incarnation() == 0 {
		t.Fatal("the generation node registered no incarnation")
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "tp", PromptLen: 40, Context: "ctx",
		ContextParallel: kvcache.Parallel{TP: 2, PP: 1}})
	if err != nil {
		t.Fatal(err)
	}
	sendAllAndVerify(t, ctxs, genN, rx, kvxfer.SendRequest{ID: "tp", PromptLen: 40})
	cctx, ccancel := context.WithTimeout(context.Background(), patience)
	defer ccancel()
	if err := ctxs[1].Close(cctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "ctx/1's Down at the generation node", func() bool {
		_, ok := genEvents.find(discovery.EventDown, "ctx", 1)
		return ok
	})
	if ev, _ := genEvents.find(discovery.EventDown, "ctx", 1); ev.Reason != discovery.ReasonLeft {
		t.Fatalf("ctx/1 closed, Down reason %q, want %q", ev.Reason, discovery.ReasonLeft)
	}
	if u := genN.Engine().Pools().Used(); u != 0 {
		t.Fatalf("%d blocks in use", u)
	}
}

// TestEtcdPeerNeverRegisteredIsNamed: a peer expected through etcd that
// never registers is named by WaitPeers as not registered, within the
// wait's deadline, and a Receive that needs it fails saying so. (The
// Receive checked to fail: its error said ctx/0 "is not among this node's
// peers (ctx/0)".) Both say at which etcd no rank of instance ctx is
// registered, what to check, and which ranks are registered there (none):
// before, they said only "not registered in etcd cluster C" and "it never
// registered", with no word of where or what to look at.
func TestEtcdPeerNeverRegisteredIsNamed(t *testing.T) {
	url := etcdURL(t)
	cluster := clusterName("node-never")
	gc := node.Config{Instance: "gen", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend,
		Bind: "ipc://" + filepath.Join(t.TempDir(), "gen.sock"), SecretKey: newKeys(t).secret,
		HeartbeatInterval: node.Duration(beat), Discovery: url, Cluster: cluster,
		Peers: []node.Peer{{Instance: "ctx"}}}
	genN := open(t, gc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*beat)
	defer cancel()
	err := genN.WaitPeers(ctx)
	if !errors.Is(err, node.ErrPeerSilent) || !strings.Contains(err.Error(), "ctx/0 (not registered in etcd cluster "+cluster+")") {
		t.Fatalf("WaitPeers for a peer that never registers: %v, want ErrPeerSilent naming ctx/0 as not registered", err)
	}
	if strings.Contains(err.Error(), "start rank") {
		t.Fatalf("WaitPeers for an instance none of whose ranks registered: %v, want no hint to start a missing rank", err)
	}
	hint := "): no rank of instance ctx is registered there (etcd at " + url + `): is the ctx process running, started with cluster ` +
		cluster + ` and instance name "ctx"? Ranks of other instances registered in ` + cluster + ": none"
	if !strings.Contains(err.Error(), hint) {
		t.Fatalf("WaitPeers for a peer that never registers: %v\nwant it to say %q", err, hint)
	}
	// ctx/0 is one of this node's peers: the error says etcd has no
	// record of it, not that it is not among the peers (it lists them).
	_, err = genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 16, Context: "ctx"})
	if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), "writer ctx/0 is not in etcd cluster "+cluster+" (it never registered"+hint) ||
		strings.Contains(err.Error(), "not among") {
		t.Fatalf("Receive from a peer not in etcd: %v, want ErrUnknownPeer saying ctx/0 never registered in etcd, and %q", err, hint)
	}
}

// TestEtcdNeverRegisteredHintWhileThePeerIsWaitedFor: WaitPeers' warning
// for a peer not registered yet names etcd and what to check (the hint of
// TestEtcdPeerNeverRegisteredIsNamed) while the wait goes on, and a peer
// that registers after that is still waited for: the wait succeeds. A
// peer may be started after this one; the hint is no verdict. (Checked to
// fail without notRegisteredHint: no warning with the hint comes.)
func TestEtcdNeverRegisteredHintWhileThePeerIsWaitedFor(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-never-then"), t.TempDir()
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	glog := logged(t, &gc)
	genN := open(t, gc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- genN.WaitPeers(ctx) }()
	hint := "ctx/0 (not registered in etcd cluster " + cluster + "): no rank of instance ctx is registered there (etcd at " + url + ")"
	waitFor(t, patience, "WaitPeers' warning naming etcd for ctx/0", func() bool {
		return glog.Has("still waiting for a Hello") && glog.Has(hint)
	})
	select {
	case err := <-waited:
		t.Fatalf("WaitPeers ended before ctx/0 registered: %v, want it to go on waiting", err)
	default:
	}
	open(t, etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"}))
	if err := <-waited; err != nil {
		t.Fatalf("WaitPeers with ctx/0 registered after the warning: %v, want nil", err)
	}
}

// TestEtcdReceiveFromAnUnlistedRankNamesEtcd: with etcd discovery and no
// peer in the config, a Receive from a context instance etcd holds no rank
// of failed saying only "writer cxt/0 is not among this node's peers
// (ctx/0)", with no word of etcd; one from a rank that registered and left
// said the same ("()"), not that it left. Now the first says it never
// registered, where etcd is, what to check and the ranks of other
// instances registered (ctx/0: the misspelt name shows), the second when
// it left and why. (Checked to fail without Receive's etcd case.)
func TestEtcdReceiveFromAnUnlistedRankNamesEtcd(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-unlisted"), t.TempDir()
	ctxN := open(t, etcdNode(t, url, cluster, dir, "ctx")) // closed below too: Close is idempotent
	genN := open(t, etcdNode(t, url, cluster, dir, "gen"))
	waitFor(t, patience, "ctx/0 found in etcd by the generation node", func() bool { return len(genN.Members()) == 1 })
	_, err := genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "typo", PromptLen: 16, Context: "cxt"})
	want := "writer cxt/0 is not in etcd cluster " + cluster + " (it never registered): no rank of instance cxt is registered there (etcd at " + url +
		`): is the cxt process running, started with cluster ` + cluster + ` and instance name "cxt"? Ranks of other instances registered in ` + cluster + ": ctx/0"
	if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Receive from instance cxt, which never registered: %v\nwant ErrUnknownPeer saying %q", err, want)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), patience)
	defer ccancel()
	if err := ctxN.Close(cctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "ctx/0's Down at the generation node", func() bool { return len(genN.Members()) == 0 })
	_, err = genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "left", PromptLen: 16, Context: "ctx"})
	want = "writer ctx/0 is not in etcd cluster " + cluster + " (it left "
	if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), discovery.ReasonLeft+")") {
		t.Fatalf("Receive from ctx/0, which registered and left: %v\nwant ErrUnknownPeer saying %q…%s)", err, want, discovery.ReasonLeft)
	}
}

// TestEtcdMissingRankOfARunningInstanceIsNamed: a TP2 context instance
// of which only rank 0 was started: WaitPeers names ctx/1 as not
// registered, says which ranks of instance ctx are, and says which rank to
// start (with the CLI's flags for it). (Checked to fail without
// missingRankHint: the error said only "ctx/1 (not registered in etcd
// cluster C)".)
func TestEtcdMissingRankOfARunningInstanceIsNamed(t *testing.T) {
	url := etcdURL(t)
	dir := t.TempDir()
	cluster := clusterName("node-missing-rank")
	tp2 := node.Parallel{TP: 2, PP: 1}
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(beat), Discovery: url, Cluster: cluster}
	gc := base
	gc.Instance, gc.Bind, gc.SecretKey = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), newKeys(t).secret
	for r := range 2 {
		gc.Peers = append(gc.Peers, node.Peer{Instance: "ctx", Parallel: tp2, Rank: node.Rank{TP: r}})
	}
	cc := base
	cc.Instance, cc.Parallel, cc.Bind, cc.SecretKey = "ctx", tp2, "ipc://"+filepath.Join(dir, "ctx0.sock"), newKeys(t).secret
	open(t, cc) // rank tp0 only
	genN := open(t, gc)
	waitFor(t, patience, "ctx/0 found in etcd by the generation node", func() bool {
		for _, r := range genN.Members() {
			if r.Instance == "ctx" && r.Rank == 0 {
				return true
			}
		}
		return false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*beat)
	defer cancel()
	err := genN.WaitPeers(ctx)
	if !errors.Is(err, node.ErrPeerSilent) {
		t.Fatalf("WaitPeers with ctx/1 never started: %v, want ErrPeerSilent", err)
	}
	for _, want := range []string{
		"ctx/1 (not registered in etcd cluster " + cluster + ")",
		"of instance ctx ({TP:2 PP:1}), ctx/0 is registered, this rank is not",
		"start rank tp1/pp0 of instance ctx (the CLI: --tp 2 --tp-rank 1)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("WaitPeers with ctx/1 never started: %v\nwant it to say %q", err, want)
		}
	}
	// Receive says the same (it said only "writer ctx/1 is not in etcd
	// cluster C (it never registered)").
	_, err = genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 16, Context: "ctx", ContextParallel: kvcache.Parallel{TP: 2, PP: 1}})
	want := "writer ctx/1 is not in etcd cluster " + cluster + " (it never registered): of instance ctx ({TP:2 PP:1}), ctx/0 is registered, this rank is not: " +
		"start rank tp1/pp0 of instance ctx (the CLI: --tp 2 --tp-rank 1)"
	if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), want) {
		t.Errorf("Receive with ctx/1 never started: %v\nwant ErrUnknownPeer saying %q", err, want)
	}
}

// TestEtcdConfigErrors: each bad discovery setting is refused by name,
// with its value, before anything opens.
func TestEtcdConfigErrors(t *testing.T) {
	good := func() node.Config {
		return node.Config{Instance: "gen", Layout: tiny(), Backend: shm.Backend, Bind: "tcp://127.0.0.1:0", Insecure: true,
			Discovery: "etcd://127.0.0.1:2379", Cluster: "c1"}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*node.Config)
		want string
	}{
		{"scheme", func(c *node.Config) { c.Discovery = "consul://x:1" }, `discovery = "consul://x:1"`},
		{"no port", func(c *node.Config) { c.Discovery = "etcd://host" }, `discovery = "etcd://host"`},
		{"no cluster", func(c *node.Config) { c.Cluster = "" }, `cluster = ""`},
		{"bad cluster", func(c *node.Config) { c.Cluster = "a/b" }, `cluster = "a/b"`},
		{"cluster without etcd", func(c *node.Config) { c.Discovery = "" }, `cluster = "c1": set without etcd discovery`},
		{"ttl without etcd", func(c *node.Config) {
			c.Discovery, c.Cluster, c.DiscoveryTTL = "static", "", node.Duration(time.Second)
		}, `discovery_ttl = 1s`},
		{"negative ttl", func(c *node.Config) { c.DiscoveryTTL = node.Duration(-time.Second) }, `discovery_ttl = -1s`},
		{"huge ttl", func(c *node.Config) { c.DiscoveryTTL = node.Duration(48 * time.Hour) }, `discovery_ttl = 48h0m0s`},
		{"in-process link", func(c *node.Config) { c.Backend, c.Bind = "loopback", "" }, `discovery = "etcd://127.0.0.1:2379": needs a bind endpoint`},
		{"wildcard bind", func(c *node.Config) { c.Bind = "tcp://*:5600" }, `bind = "tcp://*:5600": a wildcard address`},
		{"CA with plaintext etcd", func(c *node.Config) { c.DiscoveryCA = "ca.pem" }, `discovery_ca = "ca.pem": a TLS setting with the plaintext discovery = "etcd://127.0.0.1:2379": use etcds://`},
		{"certificate without key", func(c *node.Config) {
			c.Discovery, c.DiscoveryCert = "etcds://127.0.0.1:2379", "c.pem"
		}, `discovery_cert = "c.pem": and discovery_key = "": a client certificate needs both`},
		{"user without password", func(c *node.Config) { c.DiscoveryUser = "u" }, `discovery_user = "u": and discovery_password_file = "": etcd auth needs both`},
		{"TLS without etcd", func(c *node.Config) {
			c.Discovery, c.Cluster, c.DiscoveryKey = "static", "", "k.pem"
		}, `discovery_key = "k.pem": set without etcd discovery`},
	} {
		c := good()
		tc.edit(&c)
		err := c.Validate()
		if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig naming %s", tc.name, err, tc.want)
		}
	}
	// From JSON, the same names.
	c, err := node.ParseConfig([]byte(`{"model":"Llama-3.1-8B","bind":"tcp://127.0.0.1:0","insecure":true,
		"discovery":"etcd://127.0.0.1:2379","cluster":"c1","discovery_ttl":"3s","peers":[{"instance":"ctx"}]}`))
	if err != nil || c.Discovery != "etcd://127.0.0.1:2379" || c.Cluster != "c1" || time.Duration(c.DiscoveryTTL) != 3*time.Second {
		t.Fatalf("ParseConfig with discovery: %+v, %v", c, err)
	}
	if _, err := node.ParseConfig([]byte(`{"model":"Llama-3.1-8B","bind":"tcp://127.0.0.1:0","insecure":true,
		"discovery":"etcd://127.0.0.1:2379","cluster":"c1","discovery_ttl":"3 s"}`)); err == nil || !strings.Contains(err.Error(), "discovery_ttl") {
		t.Fatalf("discovery_ttl \"3 s\": %v, want an error naming discovery_ttl", err)
	}
	// A peer without endpoint is only for etcd.
	c = good()
	c.Discovery, c.Cluster, c.Peers = "", "", []node.Peer{{Instance: "ctx"}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "peers[0].endpoint") {
		t.Fatalf("static peer without endpoint: %v, want an error naming peers[0].endpoint", err)
	}
}

// TestEtcdUnreachableFailsOpen: an etcd nobody serves fails Open, naming
// its endpoint and what the dial met (the client's own error said only
// "context deadline exceeded"), and leaves nothing open (the leak check).
func TestEtcdUnreachableFailsOpen(t *testing.T) {
	gc := node.Config{Instance: "gen", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend,
		Bind: "ipc://" + filepath.Join(t.TempDir(), "gen.sock"), Insecure: true,
		Discovery: "etcd://127.0.0.1:1", Cluster: "node-unreachable"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	n, err := node.Open(ctx, gc)
	if err == nil {
		_ = n.Close(context.Background())
		t.Fatal("Open with an unreachable etcd: nil error")
	}
	if !strings.Contains(err.Error(), "nothing answers at 127.0.0.1:1: ") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Open with an unreachable etcd: %v, want the endpoint named with what its dial met", err)
	}
}

// TestEtcdRedialsAPeerThatRefusedFirst: the context node learns of the
// generation node (from etcd's prefix) and dials it before the generation
// node learned the context node's key, so its heartbeat is refused at the
// handshake — which libzmq never retries. The node redials once the key is
// admitted, and the Hello gets through. The race is made certain: the
// generation node takes the context node's record in only once it has
// refused the context node's handshake. (Checked to fail: with tend's
// Redial removed WaitPeers names ctx/0 as silent.)
func TestEtcdRedialsAPeerThatRefusedFirst(t *testing.T) {
	url := etcdURL(t)
	cluster := clusterName("node-redial")
	dir := t.TempDir()
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(100 * time.Millisecond), TransferTimeout: node.Duration(patience),
		Discovery: url, Cluster: cluster}
	gc := base
	gc.Instance, gc.Bind, gc.SecretKey = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), newKeys(t).secret
	gc.Peers = []node.Peer{{Instance: "ctx"}}
	logs := logged(t, &gc)
	refused := func() bool { return logs.Has("refused CURVE handshake") }
	node.SetPeerUpHook(func(self string, rec discovery.Record) {
		if self != "gen" || rec.Instance != "ctx" {
			return
		}
		deadline := time.Now().Add(patience)
		for !refused() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // poll with a deadline
		}
	})
	t.Cleanup(func() { node.SetPeerUpHook(nil) })
	genN := open(t, gc)

	cc := base
	cc.Instance, cc.Bind, cc.SecretKey = "ctx", "ipc://"+filepath.Join(dir, "ctx.sock"), newKeys(t).secret
	open(t, cc)
	waitFor(t, patience, "the generation node to refuse the context node's key", refused)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStaticPeerRefusedBeforeItsRecordSaysHello: a context node with the
// generation node as a static peer (endpoint and key) dials it before the
// generation node learned the context node's key (its etcd record comes a
// moment later), so its heartbeat is refused at the handshake, which
// libzmq never retries, and the context node does not tend static peers.
// Once the record comes the generation node dials it and says Hello; the
// context node's link dials again on that Hello, and the generation
// node's WaitPeers hears its Hello. The order is driven: the record is
// applied only once the context node saw its key refused. (Checked to
// fail, as TestDownOfAReplacedIncarnationSparesItsSuccessor did on a
// loaded machine: without control/zmq's readmitted, WaitPeers said ctx/0
// "has not connected back to this engine" at its deadline.)
func TestStaticPeerRefusedBeforeItsRecordSaysHello(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-static-refused"), t.TempDir()
	gk, ck := newKeys(t), newKeys(t)
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	gc.SecretKey = gk.secret
	genN := open(t, gc)
	ep := "ipc://" + filepath.Join(dir, "ctx.sock")
	ctxN := open(t, node.Config{Instance: "ctx", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend, SendOnly: true,
		Bind: ep, SecretKey: ck.secret, HeartbeatInterval: node.Duration(beat),
		Peers: []node.Peer{{Instance: "gen", Endpoint: gc.Bind, PublicKey: gk.public}}})
	gen0 := messages.PeerID{Instance: "gen"}
	waitFor(t, patience, "the generation node to refuse the context node's key", func() bool {
		st, err := ctxN.PeerState(gen0)
		return err == nil && st.Conn == zmq.ConnHandshakeFailed && st.Cause == zmq.CauseKeyRefused
	})
	rec := newRecord(ep, ck)
	rec.Incarnation = ctxN.Engine().Hello().Incarnation
	genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: rec})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ctxN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdLostFailsTheNode: this node's own record deleted from etcd (an
// operator's delete; a lapsed lease looks the same) is Lost: the node
// fails — Err and WaitPeers say ErrMembershipLost — instead of
// registering again.
func TestEtcdLostFailsTheNode(t *testing.T) {
	url := etcdURL(t)
	cluster := clusterName("node-lost")
	gc := node.Config{Instance: "gen", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend,
		Bind: "ipc://" + filepath.Join(t.TempDir(), "gen.sock"), SecretKey: newKeys(t).secret,
		HeartbeatInterval: node.Duration(beat), Discovery: url, Cluster: cluster,
		Peers: []node.Peer{{Instance: "ctx"}}}
	genN := open(t, gc)
	if err := genN.Err(); err != nil {
		t.Fatalf("Err of a registered node: %v", err)
	}
	deleteRecord(t, url, cluster, "gen", 0)
	waitFor(t, patience, "the node to fail", func() bool { return genN.Err() != nil })
	if err := genN.Err(); !errors.Is(err, node.ErrMembershipLost) || !strings.Contains(err.Error(), "gen/0 in etcd cluster "+cluster) {
		t.Fatalf("Err after the record was deleted: %v, want ErrMembershipLost naming gen/0 and the cluster", err)
	}
	if err := genN.WaitPeers(context.Background()); !errors.Is(err, node.ErrMembershipLost) {
		t.Fatalf("WaitPeers after Lost: %v, want ErrMembershipLost", err)
	}
	if _, err := genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "late", PromptLen: 16, Context: "ctx"}); !errors.Is(err, node.ErrMembershipLost) {
		t.Fatalf("Receive after Lost: %v, want ErrMembershipLost", err)
	}
}

// TestEtcdPinnedKeyMismatchIsNamed: the generation node pins ctx/0's
// public key; ctx/0 registers with another key. Its record is refused, and
// WaitPeers says so at once (not "not registered") instead of waiting out
// its deadline.
func TestEtcdPinnedKeyMismatchIsNamed(t *testing.T) {
	url := etcdURL(t)
	cluster := clusterName("node-pinned")
	dir := t.TempDir()
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(beat), Discovery: url, Cluster: cluster}
	gc := base
	gc.Instance, gc.Bind, gc.SecretKey = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), newKeys(t).secret
	gc.Peers = []node.Peer{{Instance: "ctx", PublicKey: newKeys(t).public}}
	genN := open(t, gc)
	cc := base
	cc.Instance, cc.Bind, cc.SecretKey = "ctx", "ipc://"+filepath.Join(dir, "ctx.sock"), newKeys(t).secret
	open(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	err := genN.WaitPeers(ctx)
	if !errors.Is(err, node.ErrHandshake) || !strings.Contains(err.Error(), "ctx/0: its record in etcd cluster "+cluster+" was refused") ||
		!strings.Contains(err.Error(), "not the key this node's config pins") {
		t.Fatalf("WaitPeers with a pinned key etcd contradicts: %v, want ErrHandshake naming ctx/0 and the pinned key", err)
	}
	if ctx.Err() != nil {
		t.Fatal("WaitPeers waited out its deadline")
	}
}

// etcdNode is the config of a node named instance on etcd cluster
// cluster, its ipc endpoint in dir, waiting for peers (found in etcd).
func etcdNode(t testing.TB, url, cluster, dir, instance string, peers ...node.Peer) node.Config {
	return node.Config{Instance: instance, Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend,
		Bind: "ipc://" + filepath.Join(dir, instance+".sock"), SecretKey: newKeys(t).secret,
		HeartbeatInterval: node.Duration(beat), Discovery: url, Cluster: cluster, Peers: peers}
}

// TestEtcdPeerThatLeftIsNamed: ctx/0 waits for gen/0, found through etcd;
// gen/0 registers, refuses ctx/0's record (it pins another key for it),
// fails its own WaitPeers and closes, as the kvxfer command does. ctx/0's
// WaitPeers then says within a few heartbeats that gen/0 registered and
// left, not "not registered" at its deadline (a review found that).
// (Checked to fail without the departure record: ErrPeerSilent at the
// deadline.)
func TestEtcdPeerThatLeftIsNamed(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-left"), t.TempDir()
	ctxN := open(t, etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"}))
	waited := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	go func() { waited <- ctxN.WaitPeers(ctx) }()

	genN, err := node.Open(context.Background(), etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx", PublicKey: newKeys(t).public}))
	if err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithTimeout(context.Background(), patience)
	err = genN.WaitPeers(gctx)
	gcancel()
	if !errors.Is(err, node.ErrHandshake) {
		t.Errorf("gen's WaitPeers: %v, want ErrHandshake (it pins another key for ctx/0)", err)
	}
	closeCtx, closeCancel := context.WithTimeout(context.Background(), patience)
	if err := genN.Close(closeCtx); err != nil {
		t.Errorf("Close(gen): %v", err)
	}
	closeCancel()
	err = <-waited
	if !errors.Is(err, node.ErrPeerUnreachable) || !strings.Contains(err.Error(), "gen/0 registered in etcd cluster "+cluster+", then left it") {
		t.Fatalf("ctx's WaitPeers after gen/0 registered and left: %v, want ErrPeerUnreachable saying it registered, then left", err)
	}
	if ctx.Err() != nil {
		t.Fatal("ctx's WaitPeers waited out its deadline")
	}
}

// TestEtcdKeepaliveStoppedNamesEtcd: a node whose lease keepalive stopped
// fails saying that it could not renew its lease at etcd's address and
// why that happens, not only "keepalive stopped" (a review: an operator
// whose etcd paused saw no word of etcd).
func TestEtcdKeepaliveStoppedNamesEtcd(t *testing.T) {
	url := etcdURL(t)
	genN := open(t, etcdNode(t, url, clusterName("node-keepalive"), t.TempDir(), "gen", node.Peer{Instance: "ctx"}))
	genN.Apply(discovery.Event{Kind: discovery.EventLost, Reason: discovery.ReasonKeepaliveStopped})
	err := genN.Err()
	if !errors.Is(err, node.ErrMembershipLost) || !strings.Contains(err.Error(), "could not renew its lease at "+url) ||
		!strings.Contains(err.Error(), "etcd stopped or unreachable") {
		t.Fatalf("Err after the keepalive stopped: %v, want ErrMembershipLost naming etcd at %s and the cause", err, url)
	}
}

// TestEtcdPeerRestartDuringWaitIsWaitedOut: a peer that said Hello, then
// restarted (its record left etcd and came back) while WaitPeers still
// waited for another peer, is waited out, not reported as gone (a review
// found the departure record failing it at once).
func TestEtcdPeerRestartDuringWaitIsWaitedOut(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-restart-wait"), t.TempDir()
	cc := etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"}, node.Peer{Instance: "dec"})
	var ctxEvents events
	cc.OnMembership = ctxEvents.add
	ctxN := open(t, cc)
	waited := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	go func() { waited <- ctxN.WaitPeers(ctx) }()

	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	genN, err := node.Open(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	if err := genN.Close(ctx); err != nil { // gen restarts
		t.Fatal(err)
	}
	waitFor(t, patience, "gen/0 Down at ctx", func() bool {
		_, ok := ctxEvents.find(discovery.EventDown, "gen", 0)
		return ok
	})
	open(t, gc) // its new incarnation
	open(t, etcdNode(t, url, cluster, dir, "dec", node.Peer{Instance: "ctx"}))
	if err := <-waited; err != nil {
		t.Fatalf("ctx's WaitPeers with gen/0 restarted during the wait: %v", err)
	}
}

var clusterSeq atomic.Int64

// clusterName is base made unique within this test process, so that runs
// of a test under -count do not meet an earlier run's records (a higher
// incarnation of the same rank, say) in the shared etcd.
func clusterName(base string) string { return fmt.Sprintf("%s-%d", base, clusterSeq.Add(1)) }

// TestEtcdOverTLSWithAuth: a context node and a generation node find each
// other through an etcd that speaks only TLS, wants a client certificate
// and has user auth on (discovery = "etcds://…", discovery_ca,
// discovery_cert, discovery_key, discovery_user and
// discovery_password_file), and a request moves. A wrong password, or a
// password file that is not there, fails Open naming it.
func TestEtcdOverTLSWithAuth(t *testing.T) {
	dir := t.TempDir()
	pki, err := etcdlocal.NewPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := etcdlocal.StartWith(etcdlocal.Options{TLS: &pki, User: "kvxfer", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close) // after the nodes' Close (cleanups run last first)
	pw := filepath.Join(dir, "password")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 1, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience),
		Discovery: srv.URL(), Cluster: clusterName("node-tls"), DiscoveryCA: pki.CA,
		DiscoveryCert: pki.ClientCert, DiscoveryKey: pki.ClientKey, DiscoveryUser: "kvxfer", DiscoveryPasswordFile: pw}
	cc, gc := base, base
	cc.Instance, cc.Bind, cc.SecretKey = "ctx", "ipc://"+filepath.Join(dir, "ctx.sock"), newKeys(t).secret
	gc.Instance, gc.Bind, gc.SecretKey = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), newKeys(t).secret
	gc.Peers = []node.Peer{{Instance: "ctx"}}
	ctxN, genN := open(t, cc), open(t, gc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "tls", PromptLen: 40, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if err := send(ctxN.Engine(), kvxfer.SendRequest{ID: "tls", PromptLen: 40}, blockPattern); err != nil {
		t.Fatal(err)
	}
	o := <-rx.Done()
	if !o.OK {
		t.Fatalf("%s: %v", o.Status, o.Err)
	}
	if n, err := verify(genN.Engine(), "tls", o.Blocks, blockPattern); err != nil || n != o.Bytes || n == 0 {
		t.Fatalf("verified %d of %d bytes: %v", n, o.Bytes, err)
	}
	if err := genN.Engine().FreeBlocks(o.Blocks); err != nil {
		t.Fatal(err)
	}

	wrong := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrong, []byte("guess"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file string
		want []string
	}{
		{wrong, []string{`as user "kvxfer"`, "authentication failed"}},
		{filepath.Join(dir, "none"), []string{"discovery_password_file", "none"}},
	} {
		bad := cc
		bad.Rank, bad.Bind, bad.DiscoveryPasswordFile = node.Rank{}, "ipc://"+filepath.Join(dir, "bad.sock"), tc.file
		bad.Instance = "ctx2"
		n, err := node.Open(context.Background(), bad)
		if err == nil {
			_ = n.Close(context.Background())
			t.Fatalf("Open with password file %s succeeded", tc.file)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("Open with password file %s: %q does not say %q", tc.file, err, w)
			}
		}
	}
}

// TestEtcdQuickRestartAtTheSameEndpoint: a context rank restarted at once
// at the same endpoint and with the same key refuses the generation
// rank's reconnection while its etcd watch has not yet admitted the
// generation rank's key (widened here to 1 s); libzmq does not retry a
// refused handshake. The generation rank must dial the new incarnation
// again, however recently its connection to the previous one said it was
// up: the restarted rank hears its Hello. (Checked to fail without
// peerUp's Redial: the generation rank took its connection for up from
// the previous incarnation's state, stopped tending, and the restarted
// rank waited for its Hello until its deadline.)
func TestEtcdQuickRestartAtTheSameEndpoint(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-restart"), t.TempDir()
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(time.Second), TransferTimeout: node.Duration(patience), Discovery: url, Cluster: cluster}
	gc, cc := base, base
	gc.Instance, gc.Bind, gc.SecretKey = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), newKeys(t).secret
	gc.Peers = []node.Peer{{Instance: "ctx"}}
	cc.Instance, cc.Bind, cc.SecretKey = "ctx", "ipc://"+filepath.Join(dir, "ctx.sock"), newKeys(t).secret
	cc.Peers = []node.Peer{{Instance: "gen"}}
	genN := open(t, gc)
	ctx1, err := node.Open(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, n := range []*node.Node{genN, ctx1} {
		if err := n.WaitPeers(wctx); err != nil {
			t.Fatal(err)
		}
	}
	ctxID := messages.PeerID{Instance: "ctx", Rank: 0}
	waitFor(t, patience, "the generation rank's connection to ctx/0 up", func() bool {
		st, err := genN.PeerState(ctxID)
		return err == nil && st.Conn == zmq.ConnUp
	})
	node.SetPeerUpHook(func(self string, _ discovery.Record) {
		if self == "ctx" {
			time.Sleep(time.Second) // the restarted rank admits the generation rank's key late
		}
	})
	t.Cleanup(func() { node.SetPeerUpHook(nil) })
	if err := ctx1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx2 := open(t, cc)
	w2, cancel2 := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel2()
	if err := ctx2.WaitPeers(w2); err != nil {
		t.Fatalf("the restarted context rank never heard the generation rank: %v", err)
	}
}

// TestEtcdRankOfAnotherParallelismIsNamed: the generation node expects a
// context instance of TP2 (ranks 0 and 1); ctx/0 registers as rank 0 of
// TP2, ctx/1 as rank 1 of TP4 (an operator's --tp 4 on one rank). Both
// records carry their parallelism, so WaitPeers names the mismatch — the
// rank and both parallelisms — instead of letting a request move and
// fail at its Result with a byte count.
func TestEtcdRankOfAnotherParallelismIsNamed(t *testing.T) {
	url := etcdURL(t)
	dir := t.TempDir()
	ep := func(n string) string { return "ipc://" + filepath.Join(dir, n+".sock") }
	layout := &kvcache.Layout{Name: "tiny4", Layers: 2, KVHeads: 4, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(2)}
	tp2, tp4 := node.Parallel{TP: 2, PP: 1}, node.Parallel{TP: 4, PP: 1}
	base := node.Config{Layout: layout, PoolBytes: 1 << 20, Workers: 1, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience),
		Discovery: url, Cluster: clusterName("node-par"), DiscoveryTTL: node.Duration(2e9)}
	gc := base
	gc.Instance, gc.Bind, gc.SecretKey = "gen", ep("gen"), newKeys(t).secret
	for r, par := range []node.Parallel{tp2, tp4} {
		gc.Peers = append(gc.Peers, node.Peer{Instance: "ctx", Parallel: tp2, Rank: node.Rank{TP: r}})
		cc := base
		cc.Instance, cc.Parallel, cc.Rank, cc.Bind, cc.SecretKey = "ctx", par, node.Rank{TP: r}, ep(fmt.Sprint("ctx", r)), newKeys(t).secret
		open(t, cc)
	}
	genN := open(t, gc)
	ctx, cancel := context.WithTimeout(context.Background(), 6*beat)
	defer cancel()
	err := genN.WaitPeers(ctx)
	if err == nil || !strings.Contains(err.Error(), "ctx/1") || !strings.Contains(err.Error(), "of TP4/PP1, this node expects rank tp1/pp0 of TP2/PP1") {
		t.Fatalf("WaitPeers with ctx/1 registered as rank 1 of TP4, expected TP2: %v; want an error naming ctx/1 and its TP4", err)
	}
}

// TestEtcdDownReasonReachesTheRequest: a context rank whose etcd record
// goes (an operator's delete; a lapsed lease looks the same) is Down at
// the generation node with reason "lease expired", and the request it
// was to write fails at once. The request's error must say why — etcd
// took the rank out — not that the rank missed its heartbeats, which it
// did not (its control link is up and beating).
func TestEtcdDownReasonReachesTheRequest(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-reason"), t.TempDir()
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 1, Backend: shm.Backend,
		HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience), Discovery: url, Cluster: cluster}
	gc, cc := base, base
	gc.Instance, gc.Bind, gc.SecretKey = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), newKeys(t).secret
	gc.Peers = []node.Peer{{Instance: "ctx"}}
	cc.Instance, cc.Bind, cc.SecretKey = "ctx", "ipc://"+filepath.Join(dir, "ctx.sock"), newKeys(t).secret
	cc.Peers = []node.Peer{{Instance: "gen"}}
	genN, ctxN := open(t, gc), open(t, cc)
	wctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, n := range []*node.Node{genN, ctxN} {
		if err := n.WaitPeers(wctx); err != nil {
			t.Fatal(err)
		}
	}
	rx, err := genN.Receive(wctx, kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	deleteRecord(t, url, cluster, "ctx", 0)
	select {
	case o := <-rx.Done():
		if o.OK {
			t.Fatal("the request succeeded")
		}
		msg := o.Err.Error()
		if strings.Contains(msg, "missed its heartbeats") || !strings.Contains(msg, "ctx/0 is out of etcd cluster "+cluster+" (lease expired)") {
			t.Fatalf("request failed with %q; want the etcd reason (lease expired), not missed heartbeats", msg)
		}
	case <-time.After(patience):
		t.Fatal("the request did not end")
	}
	// Its blocks are released once ctx/0 answers: ctx/0 is alive (only its
	// record went) and answers the request's Cancel, re-sent until
	// answered. Not waited for, ctx/0 could close (the test's end) without
	// having answered: a RequestData re-sent just before the Down (the
	// first is refused while the worker's connection comes up) was taken
	// by gen's link but never read by ctx/0, and no Cancel reached it
	// before it closed; with no proof, gen's Close rightly reported the
	// request's blocks quarantined.
	select {
	case <-rx.Released():
	case <-time.After(patience):
		t.Fatal("the failed request's blocks were not released though its writer is alive")
	}
	// The next request needs ctx/0, which etcd no longer holds: refused
	// at once, saying it left and why.
	_, err = genN.Receive(wctx, kvxfer.ReceiveRequest{ID: "r2", PromptLen: 32, Context: "ctx"})
	if !errors.Is(err, node.ErrUnknownPeer) || !strings.Contains(err.Error(), "writer ctx/0 is not in etcd cluster "+cluster+" (it left ") ||
		!strings.Contains(err.Error(), "ago: lease expired)") {
		t.Fatalf("Receive from ctx/0 after its Down: %v; want ErrUnknownPeer saying it left etcd (lease expired)", err)
	}
}

// TestEtcdRestartedPeerUnreachableIsNamed: ctx waits for gen and dec;
// gen comes and ctx reaches it, then gen restarts, and ctx cannot reach
// the new incarnation at the endpoint it registered (its socket file is
// gone before ctx dials it: an address this side cannot reach), while
// that incarnation's Hello reaches ctx. The new incarnation is judged
// afresh, as a first one is: WaitPeers names it unreachable a few beats
// after its Hello, not at the deadline as "our connection to it dropped"
// (which it counted from the first incarnation, reached). (Checked to
// fail: ErrPeerSilent at the deadline.)
func TestEtcdRestartedPeerUnreachableIsNamed(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-restart-unreach"), t.TempDir()
	cc := etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"}, node.Peer{Instance: "dec"})
	var ctxEvents events
	cc.OnMembership = ctxEvents.add
	ctxN := open(t, cc)
	gen0 := messages.PeerID{Instance: "gen"}
	reachedGen := make(chan struct{})
	var reachedOnce sync.Once
	node.SetWaitReachedHook(func(id messages.PeerID) {
		if id == gen0 {
			reachedOnce.Do(func() { close(reachedGen) })
		}
	})
	t.Cleanup(func() { node.SetWaitReachedHook(nil) })
	waited := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*beat)
	defer cancel()
	go func() { waited <- ctxN.WaitPeers(ctx) }()

	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	genN, err := node.Open(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	// WaitPeers must have found gen reached before gen restarts, so that
	// the code before the fix takes the path under test (with the fix it
	// passes either way).
	select {
	case <-reachedGen:
	case <-time.After(patience):
		t.Fatalf("WaitPeers did not find gen/0 reached within %v", patience)
	}
	var ups atomic.Int32
	node.SetPeerUpHook(func(self string, rec discovery.Record) {
		if self == "ctx" && rec.Instance == "gen" && ups.Add(1) == 1 {
			_ = os.Remove(strings.TrimPrefix(rec.ControlEndpoint, "ipc://")) // before ctx dials it
		}
	})
	t.Cleanup(func() { node.SetPeerUpHook(nil) })
	if err := genN.Close(context.Background()); err != nil { // gen restarts
		t.Fatal(err)
	}
	waitFor(t, patience, "gen/0 Down at ctx", func() bool {
		_, ok := ctxEvents.find(discovery.EventDown, "gen", 0)
		return ok
	})
	open(t, gc) // its new incarnation, which ctx cannot reach
	start := time.Now()
	err = <-waited
	if !errors.Is(err, node.ErrPeerUnreachable) || !strings.Contains(err.Error(), "gen/0") {
		t.Fatalf("ctx's WaitPeers after %v: %v; want ErrPeerUnreachable naming gen/0", time.Since(start), err)
	}
}
