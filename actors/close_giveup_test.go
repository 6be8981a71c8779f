//go:build kvxfer_invariants

package actors

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// stuckGate holds a call until the test opens it; entered is closed once
// the call is held.
type stuckGate struct {
	entered, open chan struct{}
	enterOnce     sync.Once
	openOnce      sync.Once
}

func newStuckGate() *stuckGate {
	return &stuckGate{entered: make(chan struct{}), open: make(chan struct{})}
}

func (g *stuckGate) hold() {
	g.enterOnce.Do(func() { close(g.entered) })
	<-g.open
}

func (g *stuckGate) release() { g.openOnce.Do(func() { close(g.open) }) }

// stuckAgent is a data-plane agent whose Connect to one address, and
// whose first Post through an endpoint to another, are held until the
// test releases them (a UCX handshake to a peer that does not answer, a
// post that waits for room on the wire); it counts Deregister calls and
// what each endpoint, by peer address, saw.
type stuckAgent struct {
	rdma.Agent
	mu           sync.Mutex
	connectAt    string // the address whose Connect is held
	connect      *stuckGate
	postAt       string // the address whose first Post is held
	post         *stuckGate
	posts        map[string]int  // Posts by address
	closed       map[string]bool // addresses whose endpoint's Close returned
	deregistered atomic.Int32
}

func newStuckAgent() *stuckAgent {
	return &stuckAgent{Agent: loopback.New(), connect: newStuckGate(), post: newStuckGate(),
		posts: map[string]int{}, closed: map[string]bool{}}
}

func (a *stuckAgent) Deregister(reg rdma.Registration) error {
	a.deregistered.Add(1)
	return a.Agent.Deregister(reg)
}

func (a *stuckAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	a.mu.Lock()
	held := a.connectAt == string(peer)
	a.mu.Unlock()
	if held {
		a.connect.hold()
	}
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	return &stuckEndpoint{Endpoint: ep, a: a, addr: string(peer)}, nil
}

func (a *stuckAgent) endpoint(addr []byte) (posts int, closed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.posts[string(addr)], a.closed[string(addr)]
}

type stuckEndpoint struct {
	rdma.Endpoint
	a    *stuckAgent
	addr string
}

func (e *stuckEndpoint) Post(b rdma.Batch) error {
	e.a.mu.Lock()
	e.a.posts[e.addr]++
	held := e.a.postAt == e.addr && e.a.posts[e.addr] == 1
	e.a.mu.Unlock()
	if held {
		e.a.post.hold()
	}
	return e.Endpoint.Post(b)
}

func (e *stuckEndpoint) Close() error {
	err := e.Endpoint.Close()
	e.a.mu.Lock()
	e.a.closed[e.addr] = true
	e.a.mu.Unlock()
	return err
}

// heartbeatGateLink is a control link whose connections hold every
// Heartbeat frame until the test opens gate (a control send that does
// not return); other frames go through.
type heartbeatGateLink struct {
	control.Link
	gate *stuckGate
}

func (l *heartbeatGateLink) Dial(peer messages.PeerID) (control.Conn, error) {
	c, err := l.Link.Dial(peer)
	if err != nil {
		return nil, err
	}
	return &heartbeatGateConn{Conn: c, gate: l.gate}, nil
}

type heartbeatGateConn struct {
	control.Conn
	gate *stuckGate
}

func (c *heartbeatGateConn) Send(f messages.Frame) error {
	if _, ok := f.(*messages.Heartbeat); ok {
		c.gate.hold()
		return nil
	}
	return c.Conn.Send(f)
}

// startTransfer starts request id from genR to ctxR (one chunk, the
// whole prompt) and returns without waiting for its outcome.
func startTransfer(t *testing.T, ctxR, genR *testRank, id string) {
	t.Helper()
	const prompt = 32
	if _, err := genR.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
		ContextParallel: ctxR.e.cfg.Topology.Parallel, Deadline: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	src, err := ctxR.e.Pools().Alloc([]int{prompt / 16})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ctxR.e.Send(TxRequest{ID: id, PromptLen: prompt, Deadline: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	c := kvcache.Chunk{Start: 0, End: prompt, Last: true}
	if err := tx.Chunk(c, c.Runs(16, src), nil); err != nil {
		t.Fatal(err)
	}
}

// TestCloseKeepsMemoryOfAWorkerItGivesUpOn: a context rank's only sender
// worker, which holds an open endpoint to gen2, is stuck in a control
// send as the engine closes, so it never reaches its Stopping (where its
// endpoints are closed). Engine.Close gives up on it after
// workerStopLog, but the endpoint's writes are not proven over: Close
// must not deregister the memory nor report the engine closed cleanly
// (kvxfer's Close would then unmap the pool); it keeps the memory and
// fails with ErrUndrained naming the worker and gen2. Before the fix it
// deregistered and returned nil, with WritesOver true (checked).
func TestCloseKeepsMemoryOfAWorkerItGivesUpOn(t *testing.T) {
	ml := control.NewMemLink()
	gate := newStuckGate()
	agent := newStuckAgent()
	ctxR := startTestRankWith(t, "ctx", &heartbeatGateLink{Link: ml, gate: gate}, agent, true, func(c *EngineConfig) {
		c.Workers = 1
	})
	ctxR.undrainedOK = true
	gen2R := startTestRank(t, "gen2", ml)
	// Registered after the ranks: runs before their Closes at the end.
	t.Cleanup(gate.release)
	prev := workerStopLog
	workerStopLog = 50 * time.Millisecond
	t.Cleanup(func() { workerStopLog = prev })

	oneTransfer(t, ctxR, gen2R, "r")
	gen2 := messages.PeerID{Instance: "gen2"}
	ctxR.e.sys.Root.Send(ctxR.e.env.workers[0], &workerSend{SendFrame: SendFrame{To: gen2,
		Frame: &messages.Heartbeat{From: messages.PeerID{Instance: "ctx"}}}})
	wait(t, "the worker's stuck send", gate.entered)

	done := make(chan error, 1)
	go func() { done <- ctxR.e.Close(context.Background()) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return a minute after it began")
	}
	if n := agent.deregistered.Load(); n != 0 {
		t.Errorf("Close deregistered the pool region (%d times) while the worker it gave up on held an endpoint to %s", n, gen2)
	}
	if !errors.Is(err, ErrUndrained) || !errors.Is(err, ErrWorkerStuck) || !strings.Contains(err.Error(), "worker 0") || !strings.Contains(err.Error(), gen2.String()) {
		t.Errorf("Close: %v; want ErrUndrained and ErrWorkerStuck naming worker 0 and %s", err, gen2)
	}
	if ctxR.e.WritesOver() {
		t.Error("WritesOver after Close gave up on a worker")
	}
	gate.release()
	wait(t, "the worker's stop once its send returned", ctxR.e.slots[0].stopped)
}

// TestConnectAfterCloseGaveUpClosesItsEndpoint: the worker starts a
// Connect to gen3, which does not return, then is stuck in a Post to gen2
// as the engine closes, and Close gives up on it. The Connect returns
// after that: its endpoint must be closed at once, unused, not left open
// (or posted through) by a worker the engine no longer waits for. Before
// the fix it stayed open for as long as the worker was stuck (checked:
// fails on the endpoint still open), and Close deregistered the memory
// while the Post to gen2 ran.
func TestConnectAfterCloseGaveUpClosesItsEndpoint(t *testing.T) {
	ml := control.NewMemLink()
	agent := newStuckAgent()
	ctxR := startTestRankWith(t, "ctx", ml, agent, true, func(c *EngineConfig) {
		c.Workers = 1
	})
	ctxR.undrainedOK = true
	// Their receives never drain: the context rank writes nothing.
	gen2R := startTestRankClose(t, "gen2", ml, loopback.New(), false)
	gen3R := startTestRankClose(t, "gen3", ml, loopback.New(), false)
	t.Cleanup(agent.post.release)
	t.Cleanup(agent.connect.release)
	prev := workerStopLog
	workerStopLog = 50 * time.Millisecond
	t.Cleanup(func() { workerStopLog = prev })
	gen2Addr, gen3Addr := gen2R.e.Hello().AgentAddr, gen3R.e.Hello().AgentAddr
	agent.mu.Lock()
	agent.connectAt, agent.postAt = string(gen3Addr), string(gen2Addr)
	agent.mu.Unlock()

	startTransfer(t, ctxR, gen3R, "r3")
	wait(t, "the worker's Connect to gen3", agent.connect.entered)
	startTransfer(t, ctxR, gen2R, "r2")
	wait(t, "the worker's Post to gen2", agent.post.entered)

	// Its ctx already ended: the two sends cannot drain (their ops wait
	// for the stuck worker), so Close goes on at once to stop the worker.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- ctxR.e.Close(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return a minute after it began")
	}
	if !errors.Is(err, ErrUndrained) {
		t.Errorf("Close: %v; want ErrUndrained", err)
	}
	if n := agent.deregistered.Load(); n != 0 {
		t.Errorf("Close deregistered the pool region (%d times) while the worker it gave up on was posting to gen2", n)
	}

	agent.connect.release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		posts, closed := agent.endpoint(gen3Addr)
		if posts != 0 {
			t.Fatalf("%d posts to gen3 through an endpoint opened after Close gave up on its worker", posts)
		}
		if closed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the endpoint to gen3, opened after Close gave up on its worker, is still open 10s later")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	agent.post.release()
	wait(t, "the worker's stop once its Post returned", ctxR.e.slots[0].stopped)
	if posts, _ := agent.endpoint(gen3Addr); posts != 0 {
		t.Fatalf("%d posts to gen3 through an endpoint opened after Close gave up on its worker", posts)
	}
}
