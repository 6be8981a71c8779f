package kvxfer_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// TestSendOnlyContext: context engines started with SendOnly send as any
// other (every byte verified), yet their Hello says FeatureSendOnly and
// names only the placeholder key (a Hello earlier versions take), while a
// receiving engine's names its region's, and only their pools are
// registered as sources (rdma.RegisterSource); Receive on a send-only engine is
// refused with ErrSendOnly naming the request, and holds nothing.
func TestSendOnlyContext(t *testing.T) {
	l := smallLayout()
	var agents []*sourceAgent
	c := startClusterOn(t, l, kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 2, clusterOpts{ctxSendOnly: true,
		agent: func(inst string, _ int) rdma.Agent {
			a := &sourceAgent{Agent: loopback.New(), inst: inst}
			agents = append(agents, a)
			return a
		}})
	for i, e := range c.ctx {
		h := e.Hello()
		if !h.Has(messages.FeatureSendOnly) || !bytes.Equal(h.Region.Key, messages.SendOnlyKey) {
			t.Fatalf("send-only ctx rank %d's Hello: features %#x, key %q; want FeatureSendOnly and the placeholder key", i, h.Features, h.Region.Key)
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("send-only ctx rank %d's Hello: %v", i, err)
		}
	}
	for _, a := range agents {
		if want := a.inst == "ctx"; a.sources.Load() != want {
			t.Fatalf("%s's pool registered as a source only: %v, want %v", a.inst, a.sources.Load(), want)
		}
	}
	if h := c.gen[0].Hello(); h.Has(messages.FeatureSendOnly) || len(h.Region.Key) == 0 || bytes.Equal(h.Region.Key, messages.SendOnlyKey) {
		t.Fatalf("the receiving gen engine's Hello: features %#x, key %q", h.Features, h.Region.Key)
	}
	for i, promptLen := range []int{100, 16} {
		transfer(t, c, l, "send-only-r"+string(rune('0'+i)), i+1, promptLen, 32, i%2 == 0)
	}
	_, err := c.ctx[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "backwards", PromptLen: 16, Context: "gen"})
	if !errors.Is(err, kvxfer.ErrSendOnly) || !contains(err.Error(), "backwards") {
		t.Fatalf("Receive on a send-only engine: %v, want ErrSendOnly naming the request", err)
	}
	checkNoLeaks(t, c)
}

// sourceAgent is a loopback agent that records whether a region was
// registered as a source only.
type sourceAgent struct {
	*loopback.Agent
	inst    string
	sources atomic.Bool
}

func (a *sourceAgent) RegisterSource(r *kvcache.Region) (rdma.Registration, error) {
	a.sources.Store(true)
	return a.Agent.RegisterSource(r)
}
