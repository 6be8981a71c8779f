package node_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/cpustat"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// BenchmarkIdlePair: what two connected nodes (one process, default 1 s
// heartbeats, no requests) cost while idle: the process's CPU time (every
// thread, libzmq's too) as a share of one CPU over b.N seconds of idling.
// A serving process spends this all day. static: peers given by endpoint;
// etcd: found through the tests' embedded etcd, whose own CPU (it runs in
// this process) is counted too.
//
//	go test ./node -run '^$' -bench IdlePair -benchtime 10x
func BenchmarkIdlePair(b *testing.B) {
	b.Run("static", func(b *testing.B) {
		cc, gc := pair(b, shm.Backend)
		idlePair(b, cc, gc)
	})
	b.Run("etcd", func(b *testing.B) {
		url, cluster, dir := etcdURL(b), clusterName("idle"), b.TempDir()
		base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: shm.Backend,
			TransferTimeout: node.Duration(patience), Discovery: url, Cluster: cluster}
		gc, cc := base, base
		gc.Instance, gc.Bind, gc.SecretKey = "gen", "ipc://"+filepath.Join(dir, "gen.sock"), newKeys(b).secret
		gc.Peers = []node.Peer{{Instance: "ctx"}}
		cc.Instance, cc.Bind, cc.SecretKey = "ctx", "ipc://"+filepath.Join(dir, "ctx.sock"), newKeys(b).secret
		cc.Peers = []node.Peer{{Instance: "gen"}}
		idlePair(b, cc, gc)
	})
}

func idlePair(b *testing.B, cc, gc node.Config) {
	cc.HeartbeatInterval, gc.HeartbeatInterval = node.Duration(time.Second), node.Duration(time.Second)
	genN := open(b, gc)
	ctxN := open(b, cc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, n := range []*node.Node{genN, ctxN} {
		if err := n.WaitPeers(ctx); err != nil {
			b.Fatal(err)
		}
	}
	c0, err := cpustat.ProcessCPU()
	if err != nil {
		b.Skip(err)
	}
	t0 := time.Now()
	b.ResetTimer()
	for range b.N {
		time.Sleep(time.Second) // idling is what is measured
	}
	b.StopTimer()
	c1, err := cpustat.ProcessCPU()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(100*float64(c1-c0)/float64(time.Since(t0)), "cpu-%")
}
