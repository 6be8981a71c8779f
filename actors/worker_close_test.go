package actors

import (
	"errors"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// heldAgent is an agent whose endpoints hold every batch posted until the
// test completes it (heldEndpoint.complete) or the endpoint closes; the
// Close of its first endpoint waits until gate is closed (a forced close
// that takes its time).
type heldAgent struct {
	mu   sync.Mutex
	eps  []*heldEndpoint
	gate chan struct{}
}

func (a *heldAgent) Backend() string                                     { return "held" }
func (a *heldAgent) Register(*kvcache.Region) (rdma.Registration, error) { return nil, nil }
func (a *heldAgent) Deregister(rdma.Registration) error                  { return nil }
func (a *heldAgent) Address() []byte                                     { return []byte("ctx-agent") }
func (a *heldAgent) Close() error                                        { return nil }

func (a *heldAgent) Connect([]byte) (rdma.Endpoint, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ep := &heldEndpoint{}
	if len(a.eps) == 0 {
		ep.gate = a.gate
	}
	a.eps = append(a.eps, ep)
	return ep, nil
}

// endpoints returns the endpoints Connect opened, in order.
func (a *heldAgent) endpoints() []*heldEndpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*heldEndpoint(nil), a.eps...)
}

type heldEndpoint struct {
	gate    chan struct{}
	mu      sync.Mutex
	closed  bool
	pending []func(error) // Done of the batches not completed, in post order
	flushes []func(error)
}

func (e *heldEndpoint) Post(b rdma.Batch) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return rdma.ErrEndpointClosed
	}
	e.pending = append(e.pending, b.Done)
	return nil
}

func (e *heldEndpoint) Flush(done func(error)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		go done(rdma.ErrEndpointClosed)
	case len(e.pending) == 0:
		go done(nil)
	default:
		e.flushes = append(e.flushes, done)
	}
}

// complete lands every batch still pending, then answers the flushes
// behind them.
func (e *heldEndpoint) complete() { e.finish(nil, false) }

func (e *heldEndpoint) Close() error {
	if e.gate != nil {
		<-e.gate
	}
	e.finish(rdma.ErrEndpointClosed, true)
	return nil
}

func (e *heldEndpoint) finish(err error, closing bool) {
	e.mu.Lock()
	pending, flushes := e.pending, e.flushes
	e.pending, e.flushes = nil, nil
	e.closed = e.closed || closing
	e.mu.Unlock()
	for _, done := range pending {
		done(err)
	}
	for _, done := range flushes {
		done(err)
	}
}

func (e *heldEndpoint) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// TestCloseEndpointSparesAnotherRequestsWrites: requests a and c write to
// one peer through one worker's endpoint E1. c's session closes it (its
// ops are in doubt), and that close takes its time. Request b's op to the
// same peer then opens a new endpoint, E2. Then a's session asks for the
// endpoint closed too (its drain timer, which fired while E1's close ran:
// its op is in doubt, on E1). a's op is not on E2 — E1's close took it and
// retires it when it returns — so closing E2 proves nothing for a; it
// only cuts b's write, failing a request that had nothing to do with a's
// (a CloseEndpoint is the stream's, not the peer's). The worker must leave
// E2 alone: b's op completes, its flush answers, and a's op is still
// retired by E1's close. (Checked to fail without the fix: the worker
// closed E2 on a's close, b's flush found no endpoint and b's op failed
// with ErrEndpointClosed.)
func TestCloseEndpointSparesAnotherRequestsWrites(t *testing.T) {
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	agent := &heldAgent{gate: make(chan struct{})}
	var openOnce sync.Once
	open := func() { openOnce.Do(func() { close(agent.gate) }) }
	t.Cleanup(open)
	env := &shellEnv{clock: SystemClock{}, log: zerolog.Nop(), throttle: control.NewThrottle(0, 0, 0)}
	slot := newWorkerSlot(0, agent, nil, nil, zerolog.Nop(), &Counters{}, env)
	worker := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &workerActor{slot: slot} }))
	t.Cleanup(func() {
		open()
		sys.Root.Poison(worker)
		<-slot.stopped // its Stopping waited for every closer
	})
	// session records what the worker reports to one session.
	session := func() (*actor.PID, chan any) {
		got := make(chan any, 16)
		return sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
			switch m := ctx.Message().(type) {
			case TxSubmitted, TxCompleted, TxRetired, TxFlushed, TxInDoubt:
				got <- m
			}
		})), got
	}
	route := &Route{Peer: messages.PeerID{Instance: "gen"}, AgentAddr: []byte("gen-agent")}
	op := func(request string) OpRef { return OpRef{Request: request, Peer: 0} }
	submit := func(s *actor.PID, got chan any, ref OpRef) {
		t.Helper()
		sys.Root.Send(worker, &workerSubmit{Submit: Submit{Op: ref, Route: route}, session: s})
		if m := wait(t, "the report of "+ref.String(), got); m != (TxSubmitted{Op: ref}) {
			t.Fatalf("%v: %#v, want it posted", ref, m)
		}
	}
	closeEP := func(s *actor.PID) {
		sys.Root.Send(worker, &workerClose{CloseEndpoint: CloseEndpoint{Route: route}, session: s})
	}
	a, aGot := session()
	b, bGot := session()
	c, cGot := session()

	submit(a, aGot, op("a"))
	submit(c, cGot, op("c"))
	closeEP(c) // E1's close runs, held by the gate
	submit(b, bGot, op("b"))
	eps := agent.endpoints()
	if len(eps) != 2 {
		t.Fatalf("%d endpoints opened, want 2: b's op connects afresh once E1 is closing", len(eps))
	}
	e2 := eps[1]

	closeEP(a) // a's drain: its op is on E1, not E2
	sys.Root.Send(worker, &workerFlush{Flush: Flush{Request: "b", Route: route}, session: b})
	e2.complete()
	if m := wait(t, "b's completion", bGot); m != (TxCompleted{Op: op("b")}) {
		t.Fatalf("b's op: %#v, want it completed: a's close of the endpoint cut another request's write", m)
	}
	if m := wait(t, "b's flush", bGot); m != (TxFlushed{}) {
		t.Fatalf("b's flush: %#v, want it answered by E2's flush", m)
	}
	if e2.isClosed() {
		t.Fatal("E2 closed on a's close: a had no op on it")
	}

	// E1's close returns: a's and c's ops are retired (their batches
	// fail first, cut by the close).
	open()
	for _, s := range []struct {
		request string
		got     chan any
	}{{"a", aGot}, {"c", cGot}} {
		m, ok := wait(t, s.request+"'s completion", s.got).(TxCompleted)
		if !ok || m.Op != op(s.request) || !errors.Is(m.Err, rdma.ErrEndpointClosed) {
			t.Fatalf("%s: %#v, want its batch cut by E1's close", s.request, m)
		}
		r, ok := wait(t, s.request+"'s retirement", s.got).(TxRetired)
		if !ok || len(r.Ops) != 1 || r.Ops[0] != op(s.request) || r.Unproven {
			t.Fatalf("%s: %#v, want its op retired by E1's close", s.request, r)
		}
	}
}
