package kvxfer_test

import (
	"fmt"
	"sync/atomic"
	"testing"

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
			t.Cleanup(func() { _, _ = fc.Close(), genAgent.Close() }) // after the engines' Close (cleanups run last first)
			c := startClusterOn(t, l, one, one, 2, clusterOpts{agent: func(inst string, _ int) rdma.Agent {
				if inst == "ctx" {
					return fc
				}
				return genAgent
			}})
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
