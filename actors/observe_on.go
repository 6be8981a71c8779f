//go:build kvxfer_invariants

package actors

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// WorkerEvent is one message a sender worker took from its mailbox, as
// ObserveWorkers reports it (builds with the kvxfer_invariants tag).
type WorkerEvent struct {
	Worker int
	// Kind is "submit", "flush", "close" or "send".
	Kind    string
	Request string
	// Peer is the stream's generation rank index (submit, flush, close,
	// and a stream's terminal frame); -1 for a frame of no stream.
	Peer int
	// Frame is the frame a "send" carries.
	Frame any
	// Stream is the peer-stream actor that sent the message ("" when a
	// session or parent sent it itself); Session is the session the
	// worker reports to ("" for frames).
	Stream, Session string
	// Op is a submit's op sequence number within its stream.
	Op int
}

var workerObserver atomic.Pointer[func(WorkerEvent)]

// ObserveWorkers calls f, on the worker's goroutine, with every submit,
// flush, close and send any sender worker of any engine of this process
// takes from its mailbox, in the order it takes them; nil stops it.
func ObserveWorkers(f func(WorkerEvent)) {
	if f == nil {
		workerObserver.Store(nil)
		return
	}
	workerObserver.Store(&f)
}

func pidString(p *actor.PID) string {
	if p == nil {
		return ""
	}
	return p.Id
}

// observeWorker reports m to the observer, if one is set.
func observeWorker(idx int, m any) {
	f := workerObserver.Load()
	if f == nil {
		return
	}
	ev := WorkerEvent{Worker: idx, Peer: -1}
	switch m := m.(type) {
	case *workerSubmit:
		ev.Kind, ev.Request, ev.Peer, ev.Op = "submit", m.Op.Request, m.Peer, m.Op.Seq
		ev.Stream, ev.Session = pidString(m.stream), pidString(m.session)
	case *workerFlush:
		ev.Kind, ev.Request, ev.Peer = "flush", m.Request, m.Peer
		ev.Stream, ev.Session = pidString(m.stream), pidString(m.session)
	case *workerClose:
		ev.Kind, ev.Peer = "close", m.Peer
		ev.Stream, ev.Session = pidString(m.stream), pidString(m.session)
	case *workerSend:
		ev.Kind, ev.Request, ev.Frame, ev.Stream = "send", m.Frame.Request(), m.Frame, pidString(m.stream)
		if m.FromStream {
			ev.Peer = m.SendFrame.Peer
		}
	default:
		return
	}
	(*f)(ev)
}
