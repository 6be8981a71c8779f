package actors

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
)

// Peer streams (DESIGN.md §7): every (request, generation rank) a context
// rank writes to is a child actor of its TxSession's actor. The session's
// step decides; the stream delivers and keeps its own account:
//
//   - It is the only sender of its stream's messages to its worker: ops
//     (Submit), Flush, CloseEndpoint, and its terminal frame (FAILED,
//     CANCELLED, IN_DOUBT or SUCCESS Result, or CancelAck). They pass through
//     the stream's mailbox, then its worker's, in the order the step emitted
//     them, so a terminal frame always follows the stream's data.
//   - It counts the ops it handed to a worker that no report settled yet (a
//     completion, a retirement, or the death of its worker). It holds its
//     terminal frame until that count is zero — a second, independent check
//     of the step's quiescence: the peer frees its pages on that frame — and
//     stops only once the frame has left. A stream the step ends without a
//     frame (EndStream: writes of it may still land at the peer) stops
//     likewise once that count is zero, and sends nothing.
//   - Its session releases the source pins and finishes only after every
//     stream child has terminated (protoactor's Terminated): the supervisor
//     tree is the drain.
//
// A stream runs on a synchronized dispatcher: its mailbox is processed on
// the goroutine that sends to it, which is always its session's (the
// session forwards the workers' reports about the stream's ops), so the
// extra hop costs a function call, not a goroutine wake-up, on the chunk
// path. Workers report to the session (its PID survives a restart of the
// session; a stream's does not).

// A stream effect for its worker (Submit, Flush, CloseEndpoint, EndStream,
// or the stream's terminal SendFrame) is the stream's message as it is:
// the Effect the step emitted, already boxed, with no wrapper to allocate
// (one was, twice a request). Nothing else sent to a stream is an Effect.

// streamSettle tells a stream that a worker report settled some of its ops
// (completed, refused or retired) or that its worker died (dead: every op it
// handed to that worker is retired: the worker closed its endpoints before
// it stopped). A TxCompleted, the commonest report, is forwarded to the
// stream as it came instead, and settles its one op as a streamSettle of
// it would (no slice and no message to allocate, once an op).
type streamSettle struct {
	seqs []int
	dead int // worker index + 1 that died; 0: none
}

// streamState is what a stream keeps across restarts of its own actor.
type streamState struct {
	// firstActor is the stream's first actor (streamProps).
	firstActor streamActor
	env        *shellEnv
	session    *actor.PID
	peer       int
	worker     int
	// inflight: ops handed to a worker and not settled by a report yet.
	inflight map[int]struct{}
	// held is the terminal frame, waiting for inflight to empty, then
	// for its hand-over to the worker to return.
	held *SendFrame
	// heldBuf is where held points: the frame is copied into the stream's
	// state, not into an allocation of its own.
	heldBuf SendFrame
	// ending: the step ended the stream without a frame (EndStream); it
	// stops once inflight is empty.
	ending bool
	// done: the terminal frame left (or the stream ended without one);
	// the stream has stopped (or is stopping). Read by its session, on the
	// session's goroutine.
	done bool
	// handling is the message the stream is handling (an Effect, a
	// streamSettle or a TxCompleted), nil between messages: a panic leaves it set — the
	// message is lost with the panic. The next incarnation (Started)
	// handles it once more (retried); a second panic in it drops it,
	// logged. Dropped, an op was never posted (it stayed SUBMITTING: the
	// session never drained) or a settle never counted (the terminal
	// frame was held for good).
	handling any
	retried  bool
	// sending: maybeFinish is handing the held frame to its worker (a
	// panic leaves it set: whether the frame left is not known).
	sending bool
	// posting: deliver is handing a Submit to its worker (a panic leaves
	// it set: whether the worker got the op is not known).
	posting bool
	// closing: deliver is handing a CloseEndpoint to its worker (a panic
	// leaves it set: whether the worker got it is not known).
	closing bool
}

type streamActor struct{ st *streamState }

// streamPropsOpts: the engine's mailbox, on a synchronized dispatcher.
var streamPropsOpts = []actor.PropsOption{actor.WithMailbox(newMailbox), actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))}

// streamProps: the producer is taken as protoactor calls it (not wrapped
// in a closure, as actor.PropsFromProducer wraps one: an allocation a
// stream).
func streamProps(st *streamState) *actor.Props {
	return actor.PropsFromProducerWithActorSystem(func(*actor.ActorSystem) actor.Actor {
		if st.firstActor.st == nil {
			// The state's first actor is allocated with it; restarts and
			// respawns get fresh ones.
			st.firstActor.st = st
			return &st.firstActor
		}
		return &streamActor{st: st}
	}, streamPropsOpts...)
}

func (a *streamActor) Receive(ctx actor.Context) {
	st := a.st
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if st.done {
			// It finished (its frame left, or it ended without one)
			// before a panic restarted it: it stops.
			st.handling, st.retried = nil, false
			ctx.Stop(ctx.Self())
			return
		}
		if m := st.handling; m != nil {
			st.handling = nil
			if st.retried {
				st.retried = false
				st.env.log.Error().Int("peer", st.peer).Str("dropped", fmt.Sprintf("%T", m)).
					Msg("stream panicked handling a message again: dropped")
				st.dropped(ctx, m)
				return
			}
			st.env.log.Error().Int("peer", st.peer).Str("again", fmt.Sprintf("%T", m)).
				Msg("stream panicked handling a message: it is handled again, once")
			st.retried = true
			if _, op := m.(Effect); op && (st.held != nil || st.ending) {
				// The panic came after the stream took its terminal
				// frame (or its end), as it finished: it finishes again
				// (the frame may have left: a duplicate at worst, which
				// the peer drops). Delivered again, it would count as a
				// second terminal frame.
				st.handling = m
				st.maybeFinish(ctx)
				st.handling = nil
			} else {
				st.handle(ctx, m)
			}
			st.retried = false
		}
	case Effect, streamSettle, TxCompleted:
		st.handle(ctx, m)
	}
}

// handle handles an Effect, a streamSettle or a TxCompleted, keeping it
// in handling until it is done (no defer: a panic leaves it, for the next
// incarnation).
func (st *streamState) handle(ctx actor.Context, msg any) {
	st.handling = msg
	if m, ok := msg.(Effect); ok && panicOnStream(m) || !ok && panicOnStream(nil) {
		panic(fmt.Sprintf("stream %d: panic injected handling %T", st.peer, msg))
	}
	switch m := msg.(type) {
	case Effect:
		st.deliver(ctx, m)
	case streamSettle:
		for _, seq := range m.seqs {
			delete(st.inflight, seq)
		}
		if m.dead > 0 && m.dead-1 == st.worker {
			clear(st.inflight)
		}
		st.maybeFinish(ctx)
	case TxCompleted:
		delete(st.inflight, m.Op.Seq)
		st.maybeFinish(ctx)
	}
	st.handling = nil
}

// deliver hands one stream effect to its worker, in order.
func (st *streamState) deliver(ctx actor.Context, e Effect) {
	if st.done || st.held != nil || st.ending {
		// Nothing of a stream follows its terminal frame (the step sends
		// it last, once every op is quiescent).
		st.env.violation(fmt.Sprintf("stream %d: %T after its terminal frame", st.peer, e))
	}
	switch e := e.(type) {
	case Submit:
		st.inflight[e.Op.Seq] = struct{}{}
		st.posting = true
		sendTo(ctx, st.env.opWorker(e.Worker), &workerSubmit{Submit: e, session: st.session, stream: ctx.Self()})
		st.posting = false
	case Flush:
		sendTo(ctx, st.env.opWorker(e.Worker), &workerFlush{Flush: e, session: st.session, stream: ctx.Self()})
	case CloseEndpoint:
		st.closing = true
		sendTo(ctx, st.env.opWorker(e.Worker), &workerClose{CloseEndpoint: e, session: st.session, stream: ctx.Self()})
		st.closing = false
	case SendFrame:
		if len(st.inflight) > 0 {
			// The step called the stream quiescent while this stream has
			// ops no report settled: hold the frame (the peer would free
			// pages a write may still reach) until they settle.
			st.env.violation(fmt.Sprintf("stream %d: terminal frame with %d ops unsettled", st.peer, len(st.inflight)))
		}
		st.heldBuf = e
		st.held = &st.heldBuf
		st.maybeFinish(ctx)
	case EndStream:
		if len(st.inflight) > 0 {
			st.env.violation(fmt.Sprintf("stream %d: ended with %d ops unsettled", st.peer, len(st.inflight)))
		}
		st.ending = true
		st.maybeFinish(ctx)
	}
}

// maybeFinish sends the held terminal frame once no op is unsettled, then
// stops the stream; a stream ending without one (EndStream) just stops.
func (st *streamState) maybeFinish(ctx actor.Context) {
	if st.held == nil && !st.ending || len(st.inflight) > 0 {
		return
	}
	if st.ending {
		st.done = true
		ctx.Stop(ctx.Self())
		return
	}
	e := *st.held
	st.sending = true
	// The worker reports to the session whether the frame left (TxSent):
	// a SUCCESS Result that did not fails the request. The frame stays
	// held until the hand-over returned: a panic before that leaves it
	// held, and the next incarnation sends it again.
	sendTo(ctx, st.env.frameWorker(e.Worker), &workerSend{SendFrame: e, stream: ctx.Self(), report: st.session})
	if panicOnFrameSent(e) {
		panic(fmt.Sprintf("stream %d: panic injected after its frame left", st.peer))
	}
	st.held, st.heldBuf, st.done, st.sending = nil, SendFrame{}, true, false
	ctx.Stop(ctx.Self())
}

// dropped: a message the stream dropped after a second panic. When it
// was the stream's terminal frame — taken or not, or held and its
// hand-over to the worker interrupted (sending) — that frame is dropped:
// a stream alive after the panics would never send it nor stop, and its
// session's release (source unpins, Finish) would wait for it for good.
// As the session does for a frame it dropped (txKind.droppedEffect), the
// frame counts as one that did not leave (a TxSent with an error: a
// SUCCESS Result fails the request with ErrFrameUnsent; when the frame
// did leave, the worker's report that came first decided, and the step
// ignores the second), and the stream ends without it: it stops once its
// own count of ops unsettled is empty, as on EndStream.
//
// A dropped end without a frame (EndStream) is taken anyway: it touches
// no page and no peer, and the stream still stops only once its own
// count of ops unsettled is empty. Dropped, the stream never stopped.
//
// A dropped Submit whose hand-over to the worker never began (not
// posting) never reached a worker: it is reported to the session as an
// op its worker refused (never posted: NOT_SUBMITTED, quiescent), as the
// session does for a Submit it dropped. Before, the op stayed SUBMITTING
// for good — past the deadline too: the session never drained, its pins
// held, Done never came. One whose hand-over was interrupted may have
// reached its worker, which then reports it: it stays as it is.
//
// A dropped CloseEndpoint whose hand-over never began (not closing) is
// handed to the worker anyway: the close is what proves the stream's ops
// in doubt over (the session's drain timer fires once), and nothing else
// would ask for it again. Dropped, those ops stayed IN_DOUBT for good:
// the session never drained, its pins held, Done never came. One whose
// hand-over was interrupted may have reached its worker: it is not sent
// twice (a second close could cut another request's writes on an
// endpoint opened since).
//
// A dropped Flush is handed to the worker anyway, whether its hand-over
// began or not: the flush is what proves the stream's bytes landed before
// its SUCCESS Result, and nothing else would ask for it again. It touches
// no page and writes nothing; had the first reached the worker, the second
// report is ignored by the step (the stream is no longer flushing).
// Dropped, the session waited for a TxFlushed that could not come: the
// request, on both sides, waited for its deadline.
func (st *streamState) dropped(ctx actor.Context, m any) {
	if st.done {
		return
	}
	eff, _ := m.(Effect) // nil for a worker's report
	switch e := eff.(type) {
	case Submit:
		if st.posting {
			st.posting = false
			return
		}
		ctx.Send(st.session, TxCompleted{Op: e.Op, Refused: true,
			Err: fmt.Errorf("%w: stream %d panicked twice on the op: dropped, never posted", ErrSessionCrashed, st.peer)})
		return
	case CloseEndpoint:
		if st.closing {
			st.closing = false
			return
		}
		sendTo(ctx, st.env.opWorker(e.Worker), &workerClose{CloseEndpoint: e, session: st.session, stream: ctx.Self()})
		return
	case Flush:
		sendTo(ctx, st.env.opWorker(e.Worker), &workerFlush{Flush: e, session: st.session, stream: ctx.Self()})
		return
	case EndStream:
		st.ending = true
		st.maybeFinish(ctx)
		return
	case SendFrame:
	default:
		if !st.sending {
			return
		}
	}
	st.held, st.heldBuf, st.sending, st.ending = nil, SendFrame{}, false, true
	ctx.Send(st.session, TxSent{Peer: st.peer, Err: fmt.Errorf("%w: stream %d panicked twice on its terminal frame: dropped", ErrSessionCrashed, st.peer)})
	st.maybeFinish(ctx)
}
