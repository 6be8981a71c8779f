package kvxfer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// countingEndpoints counts the endpoints its agent has open.
type countingEndpoints struct {
	rdma.Agent
	open atomic.Int64
}

func (a *countingEndpoints) CompletionsDeliver() bool { return rdma.CompletionsDeliver(a.Agent) }

func (a *countingEndpoints) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	a.open.Add(1)
	return &countedEndpoint{Endpoint: ep, a: a}, nil
}

type countedEndpoint struct {
	rdma.Endpoint
	a      *countingEndpoints
	closed atomic.Bool
}

func (e *countedEndpoint) Close() error {
	if e.closed.CompareAndSwap(false, true) {
		e.a.open.Add(-1)
	}
	return e.Endpoint.Close()
}

// TestEndpointsToARestartedPeerAreClosed: a generation rank restarted
// (a new incarnation, a new agent address) four times; the context rank's
// worker closes its endpoint to each old address once its ops there are
// over, when the peer's ops go to the new one, instead of keeping every
// old incarnation's endpoint (a copier goroutine, and over shm a mapping
// of the gone peer's pool) until the engine closes. (Checked to fail
// without the stale-address close: 1, 2, 3, 4 endpoints open.)
func TestEndpointsToARestartedPeerAreClosed(t *testing.T) {
	l := smallLayout()
	one := kvcache.Parallel{TP: 1, PP: 1}
	net := loopback.NewNetwork()
	link := control.NewMemLink()
	ctxAgent := &countingEndpoints{Agent: loopback.New(loopback.WithNetwork(net))}
	start := func(inst string, agent rdma.Agent) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Parallel: one, Rank: one.RankAt(0),
			Layout: &l, PoolBytes: 4 << 20, Workers: 1, Link: link, Agent: agent, TransferTimeout: 20 * time.Second})
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		return e
	}
	ctxE := start("ctx", ctxAgent)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ctxE.Close(ctx); err != nil {
			t.Errorf("close ctx: %v", err)
		}
		_ = ctxAgent.Close()
	})
	for i := range 4 {
		ga := loopback.New(loopback.WithNetwork(net))
		genE := start("gen", ga)
		c := &cluster{link: link, ctx: []*kvxfer.Engine{ctxE}, gen: []*kvxfer.Engine{genE}, ctxPar: one, genPar: one}
		for j := range 2 {
			transfer(t, c, l, fmt.Sprintf("inc%d-r%d", i, j), 2*i+j+1, 64, 32, j == 0)
		}
		waitUntil(t, fmt.Sprintf("one endpoint open after incarnation %d's requests", i), func() bool { return ctxAgent.open.Load() == 1 })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := genE.Close(ctx); err != nil {
			t.Fatalf("close gen: %v", err)
		}
		cancel()
		_ = ga.Close()
	}
}
