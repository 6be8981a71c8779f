package actors

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/messages"
)

// streamHarness runs one stream actor under a parent that records its
// Terminated, with a fake worker that records what it takes.
type streamHarness struct {
	sys        *actor.ActorSystem
	env        *shellEnv
	got        chan any
	terminated chan struct{}
	stream     *actor.PID
	worker     *actor.PID
}

// marker is sent to the fake worker straight after a step of the test:
// whatever the stream sent it before comes first.
type marker struct{}

func newStreamHarness(t *testing.T) *streamHarness {
	t.Helper()
	h := &streamHarness{sys: actor.NewActorSystem(), got: make(chan any, 64), terminated: make(chan struct{})}
	h.worker = h.sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *workerSubmit, *workerFlush, *workerClose, *workerSend, marker:
			h.got <- m
		}
	}))
	h.env = &shellEnv{workers: []*actor.PID{h.worker}, stats: &Counters{}, log: zerolog.Nop(), clock: SystemClock{}}
	ready := make(chan *actor.PID, 1)
	h.sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *actor.Started:
			st := &streamState{env: h.env, session: ctx.Self(), peer: 1, worker: 0, inflight: map[int]struct{}{}}
			ready <- ctx.Spawn(streamProps(st))
		case *actor.Terminated:
			_ = m
			close(h.terminated)
		}
	}))
	h.stream = <-ready
	t.Cleanup(h.sys.Shutdown)
	return h
}

// nothingSent checks that the worker took nothing from the stream since
// the last check.
func (h *streamHarness) nothingSent(t *testing.T, when string) {
	t.Helper()
	h.sys.Root.Send(h.worker, marker{})
	if m := h.next(t); m != (marker{}) {
		t.Fatalf("%s: the worker took %#v", when, m)
	}
}

// next is the next message the worker took.
func (h *streamHarness) next(t *testing.T) any {
	t.Helper()
	select {
	case m := <-h.got:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("the worker got nothing within 10s")
		return nil
	}
}

// TestStreamHoldsTerminalFrameUntilOpsSettle: a stream given its terminal
// frame while an op it handed to its worker is unsettled holds the frame
// (and counts a violation) until a report settles the op; it then sends
// the frame after the op, and only then stops.
func TestStreamHoldsTerminalFrameUntilOpsSettle(t *testing.T) {
	h := newStreamHarness(t)
	send := func(m any) { h.sys.Root.Send(h.stream, m) }
	ref := OpRef{Request: "r", Peer: 1, Seq: 0}
	send(Submit{Worker: 0, Peer: 1, Op: ref, Route: &Route{}})
	if m, ok := h.next(t).(*workerSubmit); !ok || m.Op != ref || !m.stream.Equal(h.stream) {
		t.Fatalf("worker took %#v, want the submit from the stream", m)
	}
	result := &messages.Result{RequestID: "r", Status: messages.StatusFailed}
	send(SendFrame{Worker: 0, FromStream: true, Peer: 1, Frame: result})
	// Settle an op the stream never handed over: the frame stays held.
	send(streamSettle{seqs: []int{7}})
	h.nothingSent(t, "with the stream's op unsettled")
	select {
	case <-h.terminated:
		t.Fatal("the stream stopped with an op unsettled")
	default:
	}
	if n := h.env.stats.StreamViolations.Load(); n != 1 {
		t.Fatalf("violations %d, want 1", n)
	}
	send(streamSettle{seqs: []int{0}})
	if m, ok := h.next(t).(*workerSend); !ok || m.Frame != result || !m.stream.Equal(h.stream) {
		t.Fatalf("worker took %#v, want the held Result from the stream", m)
	}
	select {
	case <-h.terminated:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not stop after its terminal frame")
	}
}

// TestStreamWorkerDeathSettlesItsOps: the death of the stream's worker
// settles every op it handed over (the worker closed its endpoints before
// it stopped); a dead other worker settles nothing.
func TestStreamWorkerDeathSettlesItsOps(t *testing.T) {
	h := newStreamHarness(t)
	send := func(m any) { h.sys.Root.Send(h.stream, m) }
	for seq := range 3 {
		send(Submit{Worker: 0, Peer: 1, Op: OpRef{Request: "r", Peer: 1, Seq: seq}, Route: &Route{}})
		h.next(t)
	}
	send(SendFrame{Worker: 0, FromStream: true, Peer: 1, Frame: &messages.Result{RequestID: "r"}})
	send(streamSettle{dead: 2}) // worker 1: not the stream's
	h.nothingSent(t, "after another worker died")
	send(streamSettle{dead: 1}) // worker 0: the stream's
	if _, ok := h.next(t).(*workerSend); !ok {
		t.Fatal("the terminal frame did not leave after the stream's worker died")
	}
}

// TestStreamSettledByCompletion: a worker's TxCompleted, forwarded to the
// stream as it came, settles its op as a streamSettle of it would: a
// completion of another op leaves the terminal frame held, the op's own
// releases it.
func TestStreamSettledByCompletion(t *testing.T) {
	h := newStreamHarness(t)
	send := func(m any) { h.sys.Root.Send(h.stream, m) }
	ref := OpRef{Request: "r", Peer: 1, Seq: 3}
	send(Submit{Worker: 0, Peer: 1, Op: ref, Route: &Route{}})
	h.next(t)
	result := &messages.Result{RequestID: "r"}
	send(SendFrame{Worker: 0, FromStream: true, Peer: 1, Frame: result})
	send(TxCompleted{Op: OpRef{Request: "r", Peer: 1, Seq: 4}})
	h.nothingSent(t, "after another op's completion")
	send(TxCompleted{Op: ref})
	if m, ok := h.next(t).(*workerSend); !ok || m.Frame != result {
		t.Fatalf("worker took %#v, want the held Result once its op completed", m)
	}
	select {
	case <-h.terminated:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not stop after its terminal frame")
	}
}
