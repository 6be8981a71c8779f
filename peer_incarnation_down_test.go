package kvxfer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// heldFlush wraps an agent: it counts Connects, and holds the first Flush
// of its endpoints until release (as a slow NIC's flush behind a long
// write) or until that endpoint closes, which fails it with
// rdma.ErrEndpointClosed, as every backend fails a flush pending at close.
// It does not say that its completions prove delivery, so every stream
// flushes before its Result.
type heldFlush struct {
	rdma.Agent
	connects atomic.Int64
	once     sync.Once
	held     chan struct{} // closed once the first Flush is held
	mu       sync.Mutex
	ep       rdma.Endpoint // the wrapped endpoint the held Flush came to
	done     func(error)   // the held Flush's; nil once completed
}

func (a *heldFlush) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	a.connects.Add(1)
	return &heldFlushEndpoint{Endpoint: ep, a: a}, nil
}

// release passes the held Flush on to its endpoint, if its Close has
// not failed it yet.
func (a *heldFlush) release() {
	a.mu.Lock()
	ep, done := a.ep, a.done
	a.done = nil
	a.mu.Unlock()
	if done != nil {
		ep.Flush(done)
	}
}

type heldFlushEndpoint struct {
	rdma.Endpoint
	a *heldFlush
}

func (e *heldFlushEndpoint) Flush(done func(error)) {
	hold := false
	e.a.once.Do(func() { hold = true })
	if !hold {
		e.Endpoint.Flush(done)
		return
	}
	e.a.mu.Lock()
	e.a.ep, e.a.done = e.Endpoint, done
	e.a.mu.Unlock()
	close(e.a.held)
}

func (e *heldFlushEndpoint) Close() error {
	e.a.mu.Lock()
	var done func(error)
	if e.a.ep == e.Endpoint {
		done, e.a.done = e.a.done, nil
	}
	e.a.mu.Unlock()
	err := e.Endpoint.Close()
	if done != nil {
		done(fmt.Errorf("held flush: %w", rdma.ErrEndpointClosed))
	}
	return err
}

// TestEarlierIncarnationsDownKeepsLiveEndpoint: a quick restart of a
// generation rank, whose new incarnation's Hello reached the context rank
// before the Down of the incarnation it replaced (an etcd lease expiring
// late, a goodbye delayed). That Down fails only the streams addressed to
// the old incarnation; a stream to the live one goes on. But each worker
// also closed its control connection and its data endpoint to the peer
// as soon as no op was in flight there, and so failed the live
// incarnation's stream whose flush was pending on that endpoint: both
// sides FAILED ("endpoint closed"). Now a Down of an incarnation earlier
// than the one the link knows leaves the workers alone: the flush
// completes, both sides end DONE and READY, and a later request reuses
// the endpoint (no second Connect).
func TestEarlierIncarnationsDownKeepsLiveEndpoint(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	ag := &heldFlush{Agent: loopback.New(loopback.WithNetwork(net)), held: make(chan struct{})}
	genAgent := loopback.New(loopback.WithNetwork(net))
	defer func() { _, _ = ag.Close(), genAgent.Close() }()
	start := func(inst string, a rdma.Agent) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Parallel: tp1, Rank: tp1.RankAt(0),
			Layout: &l, PoolBytes: 4 << 20, Workers: 1, Link: link, Agent: a, TransferTimeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		return e
	}
	gen := start("gen", genAgent)
	ctxE := start("ctx", ag)
	defer closeWithin(t, gen, "gen")
	defer closeWithin(t, ctxE, "ctx")
	genID, inc := gen.Hello().From, gen.Hello().Incarnation

	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tx, src := sendWhole(t, ctxE, l, "r", 1, 64)
	select {
	case <-ag.held: // r's writes are over; its flush is pending
	case <-time.After(10 * time.Second):
		t.Fatal("r's stream never flushed")
	}
	ctxE.PeerIncarnationDown(genID, inc-1, "is out of the cluster (test: the previous incarnation's lease expired)")

	// r2 is the barrier: its write is posted by the worker after the
	// worker took the Down (one worker, its mailbox in order).
	posted := ctxE.Stats().OpsPosted
	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r2", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tx2, src2 := sendWhole(t, ctxE, l, "r2", 2, 64)
	deadline := time.Now().Add(10 * time.Second)
	for ctxE.Stats().OpsPosted == posted {
		if time.Now().After(deadline) {
			t.Fatal("r2's write was never posted")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	connects := ag.connects.Load()
	ag.release()

	for _, c := range []struct {
		id     string
		req    int
		rx, tx <-chan kvxfer.Outcome
	}{{"r", 1, rx.Done(), tx.Done()}, {"r2", 2, rx2.Done(), tx2.Done()}} {
		o, to := waitOutcome(t, c.rx), waitOutcome(t, c.tx)
		if !o.OK || !to.OK {
			t.Errorf("%s: gen %s %v, ctx %s %v: a Down of gen's incarnation %d failed a request to its live incarnation %d",
				c.id, o.Status, o.Err, to.Status, to.Err, inc-1, inc)
		}
		if o.OK {
			verify(t, gen, l, 64, o.Blocks, c.req)
			_ = gen.FreeBlocks(o.Blocks)
		}
	}
	_ = ctxE.Pools().Free(src)
	_ = ctxE.Pools().Free(src2)
	if connects != 1 {
		t.Errorf("ctx connected %d times to gen: a Down of gen's incarnation %d closed the endpoint to its live incarnation %d, want 1 connect",
			connects, inc-1, inc)
	}
}
