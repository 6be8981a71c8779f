package actors

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// gateCloseAgent is an agent whose endpoints' Close, once gated is set,
// waits until open is closed: a backend whose close waits long for its
// writes (a copier to stop, a forced close) or never returns.
type gateCloseAgent struct {
	rdma.Agent
	gated    atomic.Bool
	open     chan struct{}
	returned atomic.Int32 // gated Closes that returned
}

func (a *gateCloseAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	return &gateCloseEndpoint{Endpoint: ep, a: a}, nil
}

type gateCloseEndpoint struct {
	rdma.Endpoint
	a *gateCloseAgent
}

func (e *gateCloseEndpoint) Close() error {
	if !e.a.gated.Load() {
		return e.Endpoint.Close()
	}
	<-e.a.open
	err := e.Endpoint.Close()
	e.a.returned.Add(1)
	return err
}

// TestCloseWaitsForAnEndpointClosePastTheBound: a transfer leaves a
// worker an open endpoint, which its Stopping closes as the engine
// closes; that Close does not return. Only a close that returned proves
// that no write of the endpoint lands, so Engine.Close must not go on to
// deregister the memory and report the engine closed: it waits, and
// says after workerStopLog which endpoint it waits for. (Before the fix
// Close stopped waiting for the worker after protoactor's 10 s future
// timeout, and again for the senders, and returned nil ~20 s in with the
// close still running: checked to fail without the fix.)
func TestCloseWaitsForAnEndpointClosePastTheBound(t *testing.T) {
	ml := control.NewMemLink()
	agent := &gateCloseAgent{Agent: loopback.New(), open: make(chan struct{})}
	logs := &syncBuf{}
	ctxR := startTestRankWith(t, "ctx", ml, agent, true, func(c *EngineConfig) {
		c.Log = zerolog.New(logs).Level(zerolog.WarnLevel)
	})
	gen2R := startTestRank(t, "gen2", ml)
	// Registered after the ranks: runs before their Closes at the end.
	var openOnce sync.Once
	t.Cleanup(func() { openOnce.Do(func() { close(agent.open) }) })
	prev := workerStopLog
	workerStopLog = 50 * time.Millisecond
	t.Cleanup(func() { workerStopLog = prev })

	oneTransfer(t, ctxR, gen2R, "r")

	agent.gated.Store(true)
	done := make(chan error, 1)
	go func() { done <- ctxR.e.Close(context.Background()) }()
	gen2 := messages.PeerID{Instance: "gen2"}.String()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for logged := false; !logged; {
		select {
		case err := <-done:
			t.Fatalf("Close returned %v while the endpoint close to %s had not returned (%d returned): a write of it may still land in memory Close deregistered and handed back", err, gen2, agent.returned.Load())
		case <-deadline:
			t.Fatalf("no warning naming %s a minute into Close; logs:\n%s", gen2, logs)
		case <-tick.C:
			l := logs.String()
			logged = strings.Contains(l, "not stopped") && strings.Contains(l, gen2)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Close returned %v while the endpoint close to %s had not returned", err, gen2)
	default:
	}
	openOnce.Do(func() { close(agent.open) })
	if err := wait(t, "Close's return once the endpoint close returned", done); err != nil {
		t.Fatalf("close: %v", err)
	}
	if n := agent.returned.Load(); n != 1 {
		t.Fatalf("%d endpoint closes returned before Close did, want 1", n)
	}
}
