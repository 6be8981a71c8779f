package kvxfer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// namingAgent is an agent whose endpoints report that the agent they
// reach serves serves (rdma.IdentifiedEndpoint), as a ucx agent given an
// identity does.
type namingAgent struct {
	rdma.Agent
	serves string
}

func (a *namingAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	return &namedEndpoint{Endpoint: ep, serves: a.serves}, nil
}

type namedEndpoint struct {
	rdma.Endpoint
	serves string
}

func (e *namedEndpoint) PeerIdentity() string { return e.serves }

// TestWriterChecksWhomTheAgentServes: a context rank posts a request's
// writes only through an endpoint whose agent serves the request's peer.
// When the agent at the address the generation rank's Hello named serves
// another rank (a peer that named another instance's agent, and passes on
// its key, would have the writes land in that instance's pool), every op
// is refused before it is posted and the request fails naming both; the
// agent of the right rank carries the same request through.
func TestWriterChecksWhomTheAgentServes(t *testing.T) {
	for _, c := range []struct {
		serves string
		ok     bool
	}{{"gen/0", true}, {"", true}, {"gen2/0", false}} {
		t.Run("serves="+c.serves, func(t *testing.T) {
			l := smallLayout()
			one := kvcache.Parallel{TP: 1, PP: 1}
			net := loopback.NewNetwork()
			ctxAgent := &namingAgent{Agent: loopback.New(loopback.WithNetwork(net)), serves: c.serves}
			genAgent := loopback.New(loopback.WithNetwork(net))
			t.Cleanup(func() { _, _ = ctxAgent.Close(), genAgent.Close() })
			cl := startClusterOn(t, l, one, one, 2, clusterOpts{agent: func(inst string, _ int) rdma.Agent {
				if inst == "ctx" {
					return ctxAgent
				}
				return genAgent
			}})
			ce, ge := cl.ctx[0], cl.gen[0]
			rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "id-1", PromptLen: 64, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
			tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "id-1", PromptLen: 64})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sendFilled(t, ce, tx, l, 64, 64, 1); err != nil && c.ok {
				t.Fatal(err)
			}
			var o kvxfer.Outcome
			select {
			case o = <-rx.Done():
			case <-time.After(time.Minute):
				t.Fatal("no outcome within a minute")
			}
			if c.ok {
				if !o.OK {
					t.Fatalf("agent serving %q: %s: %v", c.serves, o.Status, o.Err)
				}
				verify(t, ge, l, 64, o.Blocks, 1)
				if err := ge.FreeBlocks(o.Blocks); err != nil {
					t.Fatal(err)
				}
				return
			}
			if o.OK {
				t.Fatal("READY through an agent serving another rank")
			}
			var to kvxfer.Outcome
			select {
			case to = <-tx.Done():
			case <-time.After(time.Minute):
				t.Fatal("no Send outcome within a minute")
			}
			err = to.Err
			if !errors.Is(err, rdma.ErrBadAddress) || !strings.Contains(err.Error(), "serves gen2/0, not gen/0") {
				t.Fatalf("Send: %v, want ErrBadAddress naming both ranks", err)
			}
			select {
			case <-rx.Released():
			case <-time.After(time.Minute):
				t.Fatal("the failed receive's blocks were not released within a minute")
			}
		})
	}
}
