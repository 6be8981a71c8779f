package twoproc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/etcdlocal"
	"github.com/kvxfer/kvxfer/internal/proc"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// etcdTTL is the lease TTL of the kill-to-down test.
var etcdTTL = flag.Duration("etcd-ttl", time.Second, "etcd lease TTL of TestEtcdKillIsLeaseDown")

// One embedded etcd serves the tests of this file, each under its own
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

// viaEtcd makes both roles find each other through the test's etcd under
// cluster: no endpoint and no public key of the peer is given.
func viaEtcd(t testing.TB, cluster string, g, c proc.Options) (proc.Options, proc.Options) {
	url := etcdURL(t)
	for _, o := range []*proc.Options{&g, &c} {
		o.Discovery, o.Cluster, o.DiscoveryTTL = url, cluster, 2*time.Second
		o.PeerEndpoint, o.PeerPublicKey = "", ""
	}
	return g, c
}

// TestEtcdTwoProcessTransfer: a context and a generation process know
// only the etcd URL and the cluster name; they find each other's endpoint
// and CURVE public key there, every request moves, every byte is verified
// on the generation side and nothing leaks.
func TestEtcdTwoProcessTransfer(t *testing.T) {
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			g, c := options(t, 4, 0)
			g, c = on(b, g, c)
			g, c = viaEtcd(t, "twoproc-transfer-"+b, g, c)
			gen := spawn(t, "gen", g)
			ctx := spawn(t, "ctx", c)
			cr, cerr := ctx.wait(t, 2*time.Minute)
			gr, gerr := gen.wait(t, 2*time.Minute)
			if cerr != nil || gerr != nil {
				t.Fatalf("ctx: %v %+v; gen: %v %+v", cerr, cr, gerr, gr)
			}
			if gr.OK != 4 || gr.Bytes == 0 || gr.BytesVerified != gr.Bytes || gr.Mismatches != 0 || gr.LeakedBlocks != 0 {
				t.Fatalf("gen report %+v", gr)
			}
			if cr.OK != 4 || cr.LeakedBlocks != 0 {
				t.Fatalf("ctx report %+v", cr)
			}
		})
	}
}

// TestEtcdKillIsLeaseDown: a context process (kvxfer ctx's workload,
// waiting for requests) is killed with SIGKILL; the generation node in
// this process learns it through etcd: a Down event whose reason is the
// expired lease. Heartbeats are set to notice only after 10 minutes, so
// they cannot be what noticed. The figure, time from kill to Down with
// the TTL used, is logged per round and as a median (-etcd-ttl, at least 3
// rounds or -rounds). (Checked to fail: with the node's Down handling
// removed, OnPeerDown is never called.)
func TestEtcdKillIsLeaseDown(t *testing.T) {
	n := max(3, *rounds)
	var figures []time.Duration
	for r := range n {
		figures = append(figures, killRound(t, r))
	}
	slices.Sort(figures)
	t.Logf("kill to peer down through the etcd lease (TTL %v, heartbeats 1s × 600): median %v of %d rounds, min %v, max %v",
		*etcdTTL, figures[len(figures)/2].Round(time.Millisecond), n, figures[0].Round(time.Millisecond), figures[n-1].Round(time.Millisecond))
}

// killRound runs one round and returns the time from SIGKILL to Down.
func killRound(t *testing.T, round int) time.Duration {
	const slowBeat, misses = time.Second, 600
	cluster := fmt.Sprintf("twoproc-kill-%d-%d", time.Now().UnixNano(), round)
	g, c := options(t, 1, 0)
	g, c = viaEtcd(t, cluster, g, c)
	c.DiscoveryTTL = *etcdTTL
	c.Heartbeat, c.HeartbeatMisses, c.Timeout = slowBeat, misses, 5*time.Minute
	ctx := spawn(t, "ctx", c)
	defer func() { _ = ctx.cmd.Process.Kill(); <-ctx.done }()

	var (
		mu    sync.Mutex
		down  *discovery.Event
		downT time.Time
		calls atomic.Int32
	)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	cfg := node.Config{Instance: "gen", Model: g.Model, TokensPerBlock: g.TokensPerBlock, PoolBytes: g.PoolBytes,
		Backend: shm.Backend, Bind: "ipc://" + filepath.Join(t.TempDir(), "gen.sock"), SecretKey: g.SecretKey,
		HeartbeatInterval: node.Duration(slowBeat), HeartbeatMisses: misses,
		Discovery: g.Discovery, Cluster: cluster, DiscoveryTTL: node.Duration(*etcdTTL),
		Peers:  []node.Peer{{Instance: "ctx"}},
		Logger: &log,
		OnMembership: func(ev discovery.Event) {
			if ev.Kind == discovery.EventDown && ev.Instance == "ctx" {
				mu.Lock()
				if down == nil {
					down, downT = &ev, time.Now()
				}
				mu.Unlock()
			}
		},
		OnPeerDown: func(instance string, _ int) {
			if instance == "ctx" {
				calls.Add(1)
			}
		},
	}
	gn, err := node.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := gn.Close(cctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := gn.WaitPeers(wctx); err != nil {
		t.Fatalf("round %d: %v", round, err)
	}
	// Both sides are up: the context process's Hello arrived here.
	if err := ctx.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitFor(t, time.Minute, "the killed context's Down", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return down != nil
	})
	mu.Lock()
	ev, took := *down, downT.Sub(killed)
	mu.Unlock()
	if ev.Reason != discovery.ReasonLeaseExpired {
		t.Fatalf("round %d: the killed context process went down with reason %q, want %q", round, ev.Reason, discovery.ReasonLeaseExpired)
	}
	waitFor(t, time.Minute, "OnPeerDown for the killed context", func() bool { return calls.Load() > 0 })
	// The node no longer counts the killed rank as a peer.
	if _, err := gn.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "after-kill", PromptLen: 16, Context: "ctx"}); !errors.Is(err, node.ErrUnknownPeer) {
		t.Fatalf("round %d: Receive from the killed context: %v, want ErrUnknownPeer", round, err)
	}
	t.Logf("round %d: kill to Down %v (reason %q, TTL %v)", round, took.Round(time.Millisecond), ev.Reason, *etcdTTL)
	return took
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(2 * time.Millisecond) // poll with a deadline
	}
}
