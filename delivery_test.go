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

// flushCounter wraps an agent: it counts its endpoints' Flush calls and
// says that its completions prove delivery only when deliver is set (and
// the wrapped agent says so too).
type flushCounter struct {
	rdma.Agent
	deliver bool
	flushes atomic.Int64
}

func (a *flushCounter) CompletionsDeliver() bool {
	return a.deliver && rdma.CompletionsDeliver(a.Agent)
}

func (a *flushCounter) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	return &flushCountingEndpoint{Endpoint: ep, a: a}, nil
}

type flushCountingEndpoint struct {
	rdma.Endpoint
	a *flushCounter
}

func (e *flushCountingEndpoint) Flush(done func(error)) {
	e.a.flushes.Add(1)
	e.Endpoint.Flush(done)
}

// TestCompletionsDeliverSkipsTheFlush: over an agent whose completions
// prove delivery (loopback's), a context rank's streams send their Result
// with no flush, and every byte still arrives; over the same backend
// behind a wrapper that does not say so, every stream flushes first.
func TestCompletionsDeliverSkipsTheFlush(t *testing.T) {
	if lb := loopback.New(); !rdma.CompletionsDeliver(lb) {
		t.Fatal("loopback does not say that its completions prove delivery")
	} else {
		_ = lb.Close()
	}
	for _, deliver := range []bool{true, false} {
		t.Run(fmt.Sprintf("deliver=%v", deliver), func(t *testing.T) {
			l := smallLayout()
			one := kvcache.Parallel{TP: 1, PP: 1}
			net := loopback.NewNetwork()
			fc := &flushCounter{Agent: loopback.New(loopback.WithNetwork(net)), deliver: deliver}
			genAgent := loopback.New(loopback.WithNetwork(net))
			c := &cluster{link: control.NewMemLink(), ctxPar: one, genPar: one}
			start := func(inst string, a rdma.Agent) *kvxfer.Engine {
				e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 4 << 20,
					Workers: 2, Link: c.link, Agent: a, TransferTimeout: 20 * time.Second})
				if err != nil {
					t.Fatalf("start %s: %v", inst, err)
				}
				return e
			}
			c.ctx = []*kvxfer.Engine{start("ctx", fc)}
			c.gen = []*kvxfer.Engine{start("gen", genAgent)}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				for _, e := range append(c.ctx, c.gen...) {
					if err := e.Close(ctx); err != nil {
						t.Errorf("close: %v", err)
					}
				}
				_ = fc.Close()
				_ = genAgent.Close()
			})
			const requests = 4
			for i := range requests {
				transfer(t, c, l, fmt.Sprintf("d%d", i), i, 64, 32, i%2 == 0)
			}
			checkNoLeaks(t, c)
			got := fc.flushes.Load()
			switch {
			case deliver && got != 0:
				t.Errorf("%d flushes, want none: the last completion of each stream proves delivery", got)
			case !deliver && got < requests:
				t.Errorf("%d flushes for %d requests, want one per stream at least", got, requests)
			}
		})
	}
}
