package actors

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// closeHookAgent is an agent whose endpoints call hook (when set) once
// their Close has returned.
type closeHookAgent struct {
	rdma.Agent
	mu   sync.Mutex
	hook func()
}

func (a *closeHookAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	return &closeHookEndpoint{Endpoint: ep, a: a}, nil
}

type closeHookEndpoint struct {
	rdma.Endpoint
	a *closeHookAgent
}

func (e *closeHookEndpoint) Close() error {
	err := e.Endpoint.Close()
	e.a.mu.Lock()
	f := e.a.hook
	e.a.mu.Unlock()
	if f != nil {
		f()
	}
	return err
}

// gateLink is a link whose connections to peer gated wait in Close until
// open is closed: a connection whose Close lingers (zmq waits up to
// closeLinger for what it queued to leave).
type gateLink struct {
	control.Link
	gated messages.PeerID
	open  chan struct{}
}

func (l *gateLink) Dial(peer messages.PeerID) (control.Conn, error) {
	c, err := l.Link.Dial(peer)
	if err != nil || peer != l.gated {
		return c, err
	}
	return &gateConn{Conn: c, open: l.open}, nil
}

type gateConn struct {
	control.Conn
	open chan struct{}
}

func (c *gateConn) Close() error {
	<-c.open
	return c.Conn.Close()
}

// TestCloseSendsFramesWaitingForADownPeersConnection: a peer declared down
// has each worker close its connection to it on a goroutine (the close
// lingers while the connection's queue drains), and a frame to that peer
// meanwhile waits until the close returned (so that it cannot overtake
// what the old connection queued). Here that frame is a CancelAck — the
// proof a generation rank waits for before it frees its blocks. The engine
// closes before the old connection's close returns: the worker stops, and
// the CancelAck must still leave. (Before the fix the worker's Stopping
// waited for the close, then stopped without sending what waited for it:
// the proof was lost, and the generation side kept the request's blocks in
// quarantine. Checked to fail without the fix.)
func TestCloseSendsFramesWaitingForADownPeersConnection(t *testing.T) {
	ml := control.NewMemLink()
	gen := messages.PeerID{Instance: "gen"}
	gl := &gateLink{Link: ml, gated: gen, open: make(chan struct{})}
	var openOnce sync.Once
	t.Cleanup(func() { openOnce.Do(func() { close(gl.open) }) })
	agent := &closeHookAgent{Agent: loopback.New()}
	ctxR := startTestRankOn(t, "ctx", gl, agent)
	gen2R := startTestRank(t, "gen2", ml)
	ctxID, gen2 := messages.PeerID{Instance: "ctx"}, messages.PeerID{Instance: "gen2"}

	// A generation "rank" that only records the CancelAcks it gets.
	acks := make(chan string, 16)
	lis, err := ml.Listen(&messages.Hello{From: gen}, func(f messages.Frame) {
		if a, ok := f.(*messages.CancelAck); ok {
			acks <- a.RequestID
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	toCtx, err := ml.Dial(ctxID)
	if err != nil {
		t.Fatal(err)
	}

	// A request to gen2 leaves worker w an open data endpoint, which its
	// Stopping closes: that close opens the gate, so the lingering close
	// returns once the worker is stopping, never before.
	const id = "r"
	w := WorkerFor(id, gen2, 2)
	oneTransfer(t, ctxR, gen2R, id)

	// Requests of gen whose frames go through worker w.
	var ids []string
	for i := 0; len(ids) < 2; i++ {
		if r := fmt.Sprintf("c%d", i); WorkerFor(r, gen, 2) == w {
			ids = append(ids, r)
		}
	}
	cancel := func(r string) {
		t.Helper()
		if err := toCtx.Send(&messages.Cancel{RequestID: r, Epoch: 1, From: gen}); err != nil {
			t.Fatal(err)
		}
	}
	// The first Cancel's answer gives worker w a connection to gen.
	cancel(ids[0])
	if got := wait(t, "the first CancelAck", acks); got != ids[0] {
		t.Fatalf("CancelAck for %s, want %s", got, ids[0])
	}
	agent.mu.Lock()
	agent.hook = func() { openOnce.Do(func() { close(gl.open) }) }
	agent.mu.Unlock()
	ctxR.e.PeerDown(gen, "missed its heartbeats (test)")
	cancel(ids[1]) // answered while the connection's close lingers
	// The tx parent answered it: its CancelAck is in worker w's mailbox,
	// behind the worker's peer-down.
	if _, err := ctxR.e.sys.Root.RequestFuture(ctxR.e.tx, &listSessions{}, 10*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := ctxR.e.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	// (Bounded, as every wait of these tests: without the fix it never
	// comes.)
	if got := wait(t, "the CancelAck that waited for the down peer's old connection", acks); got != ids[1] {
		t.Fatalf("CancelAck for %s, want %s", got, ids[1])
	}
}

// oneTransfer moves request id (32 tokens, one chunk) from ctxR to genR,
// whose ranks name the context "ctx", and frees both sides' blocks: the
// sending worker keeps its data endpoint to genR open.
func oneTransfer(t *testing.T, ctxR, genR *testRank, id string) {
	t.Helper()
	const prompt = 32
	rx, err := genR.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
		ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(time.Minute)})
	if err != nil {
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
	if o := wait(t, "the send's outcome", tx.Done()); !o.OK {
		t.Fatalf("send %s %v", o.Status, o.Err)
	}
	ro := wait(t, "the receive's outcome", rx.Done())
	if !ro.OK {
		t.Fatalf("receive %s %v", ro.Status, ro.Err)
	}
	_ = genR.e.FreeBlocks(ro.Blocks)
	_ = ctxR.e.FreeBlocks(src)
}
