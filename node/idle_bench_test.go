package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/cpustat"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// BenchmarkIdlePair: what two connected nodes (one process, default 1 s
// heartbeats, no requests) cost while idle: the process's CPU time (every
// thread, libzmq's too) as a share of one CPU over b.N seconds of idling.
// A serving process spends this all day:
//
//	go test ./node -run '^$' -bench IdlePair -benchtime 10x
func BenchmarkIdlePair(b *testing.B) {
	cc, gc := pair(b, shm.Backend)
	cc.HeartbeatInterval, gc.HeartbeatInterval = node.Duration(time.Second), node.Duration(time.Second)
	genN := open(b, gc)
	open(b, cc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		b.Fatal(err)
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
