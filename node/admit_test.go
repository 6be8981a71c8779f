package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// TestUCXAgentLinksOnlyWithPeersAgents: a generation node's ucx agent
// answers the agent of its authenticated peer (the context node moves
// bytes into it) and no other: an agent that reaches its worker with the
// node's agent address, but whose address no peer's Hello carried, gets
// no answer to its hello (before, any agent that said hello linked, learnt
// the secret the node's region keys are signed with and cost it an
// endpoint).
func TestUCXAgentLinksOnlyWithPeersAgents(t *testing.T) {
	if !ucx.Available {
		t.Skip("this build has no UCX")
	}
	cc, gc := pair(t, ucx.Backend)
	cc.SendOnly = true
	genN, ctxN := open(t, gc), open(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	moveOne(t, ctxN, genN, "req-1", 40)

	stranger, err := ucx.New(ucx.WithHandshakeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	ep, err := stranger.Connect(genN.Engine().Hello().AgentAddr)
	if err == nil {
		ep.Close()
		t.Fatal("an agent no peer vouched for linked with the generation node's agent")
	}
	if !errors.Is(err, rdma.ErrPeerGone) {
		t.Fatalf("Connect of a stranger: %v, want ErrPeerGone (no answer to its hello)", err)
	}
	moveOne(t, ctxN, genN, "req-2", 40)
}
