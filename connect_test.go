package kvxfer_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// gatedAgent is an agent whose Connect to one peer waits until the gate
// opens, as a UCX Connect waits for the peer's handshake.
type gatedAgent struct {
	rdma.Agent
	slow    []byte
	entered chan struct{} // closed when a Connect to slow starts waiting
	once    sync.Once
	gate    chan struct{}
}

func (a *gatedAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	if bytes.Equal(peer, a.slow) {
		a.once.Do(func() { close(a.entered) })
		<-a.gate
	}
	return a.Agent.Connect(peer)
}

// slowConnect is a context engine with one worker, on a gatedAgent whose
// Connect to generation instance A (genA) hangs until release, and two
// generation instances A and B.
type slowConnect struct {
	t          *testing.T
	l          kvcache.Layout
	ag         *gatedAgent
	ce, ga, gb *kvxfer.Engine
	release    func()
}

func newSlowConnect(t *testing.T) *slowConnect {
	l := smallLayout()
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	agA, agB := loopback.New(loopback.WithNetwork(net)), loopback.New(loopback.WithNetwork(net))
	ag := &gatedAgent{Agent: loopback.New(loopback.WithNetwork(net)), slow: agA.Address(),
		entered: make(chan struct{}), gate: make(chan struct{})}
	start := func(inst string, a rdma.Agent) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 4 << 20,
			Workers: 1, Link: link, Agent: a, TransferTimeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		return e
	}
	s := &slowConnect{t: t, l: l, ag: ag, ce: start("ctx", ag), ga: start("genA", agA), gb: start("genB", agB)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := errors.Join(s.ce.Close(ctx), s.ga.Close(ctx), s.gb.Close(ctx), ag.Close(), agA.Close(), agB.Close()); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	var once sync.Once
	s.release = func() { once.Do(func() { close(ag.gate) }) }
	t.Cleanup(s.release) // runs first: a failed test must not leave Connect hanging
	return s
}

// send opens request id on gen and hands its KV over in one chunk.
func (s *slowConnect) send(id string, gen *kvxfer.Engine) *request {
	t, l := s.t, s.l
	t.Helper()
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := s.ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	c := kvcache.Chunk{Start: 0, End: 64, FirstBlock: 0, Last: true}
	if err := tx.Chunk(c, []kvcache.BlockRun{{First: 0, IDs: src[0]}, {First: 0, IDs: src[1]}}, nil); err != nil {
		t.Fatal(err)
	}
	return &request{tx: tx, rx: rx, src: src, gen: gen}
}

type request struct {
	tx  *kvxfer.TxHandle
	rx  *kvxfer.RxHandle
	src [][]kvcache.BlockID
	gen *kvxfer.Engine
}

// outcomes waits for both sides' outcomes, then frees the source blocks
// (Done fired: no pin is left) and the received ones.
func (s *slowConnect) outcomes(r *request) (tx, rx kvxfer.Outcome) {
	s.t.Helper()
	tx = waitOutcome(s.t, r.tx.Done())
	if err := s.ce.Pools().Free(r.src); err != nil {
		s.t.Fatalf("free after Done: %v", err)
	}
	rx = waitOutcome(s.t, r.rx.Done())
	if rx.OK {
		if err := r.gen.FreeBlocks(rx.Blocks); err != nil {
			s.t.Fatal(err)
		}
	}
	return tx, rx
}

// connecting waits until the worker's Connect to instance A hangs.
func (s *slowConnect) connecting() {
	s.t.Helper()
	select {
	case <-s.ag.entered:
	case <-time.After(30 * time.Second):
		s.t.Fatal("the worker never connected to instance A")
	}
}

func (s *slowConnect) noLeaks() {
	s.t.Helper()
	checkNoLeaks(s.t, &cluster{ctx: []*kvxfer.Engine{s.ce}, gen: []*kvxfer.Engine{s.ga, s.gb}})
}

// TestSlowConnectDoesNotStallOtherPeers: the context engine's only worker
// is connecting to generation instance A, and that Connect hangs. A request
// to instance B, submitted after, completes meanwhile: the worker opens
// endpoints on connector goroutines, not in its Receive. Once A's Connect
// returns, A's request, which waited for it, completes too.
func TestSlowConnectDoesNotStallOtherPeers(t *testing.T) {
	s := newSlowConnect(t)
	a := s.send("a", s.ga)
	s.connecting()
	b := s.send("b", s.gb)
	if tx, rx := s.outcomes(b); !tx.OK || !rx.OK {
		t.Fatalf("request b while A's Connect hangs: %s %v / %s %v", tx.Status, tx.Err, rx.Status, rx.Err)
	}
	select {
	case o := <-a.tx.Done():
		t.Fatalf("request a finished (%s %v) before its Connect returned", o.Status, o.Err)
	default:
	}
	s.release()
	if tx, rx := s.outcomes(a); !tx.OK || !rx.OK {
		t.Fatalf("request a after its Connect returned: %s %v / %s %v", tx.Status, tx.Err, rx.Status, rx.Err)
	}
	s.noLeaks()
}
