package actors

import (
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/messages"
)

// txChunkMsg carries a chunk and its fence from the handle to the shell;
// seq is its record in the handle's pin ledger (TxChunk.Pinned).
type txChunkMsg struct {
	TxChunk
	fence Fence
	seq   uint64
}

// txPeerRequestMsg carries a resolved RequestData from the tx parent to the
// shell with what resolved it, for the tracer. Sent as a pointer: the
// shell keeps it in resolving while it steps it, with no copy to make.
type txPeerRequestMsg struct {
	TxPeerRequest
	hello *messages.Hello
	rd    *messages.RequestData
}

type txSetHandle struct {
	h     *Handle
	start TxStart
}

// txKind is the TxSession's kind of the session shell: its chunks' fences,
// its source pins, and its peer-stream children (stream.go).
type txKind struct {
	s     *TxSession
	meter *txMeter // nil: metrics off
	// inDoubt is the session's ops in doubt as published (Stats, gauge).
	inDoubt inDoubtShare
	// fence is the fence of the chunk being stepped: WatchFence takes it.
	// A panic while the chunk's effects run leaves it set, for the
	// restarted incarnation's run of the WatchFence (rerunnable).
	fence Fence
	// streams are the session's peer-stream children by generation rank
	// index, until their Terminated.
	streams map[int]*streamChild
	// release holds the effects that release the session (Unpin, Finish,
	// Stop) until every stream child has terminated.
	release []Effect
	// respawn: a stream child stopped before its terminal frame (a restart
	// of the session or of the stream past its budget); the next one for
	// that peer takes its account from the step.
	respawn map[int]bool
	// carried: stream children stopped with something of theirs still to
	// do — a terminal frame held for its ops to settle, an end without a
	// frame waiting likewise, a message a panic lost — which the step, for
	// which the stream is answered, will never emit again. Each is spawned
	// again over the same state (with its own account) as soon as the
	// session may spawn: at once, or at the Started that ends the
	// session's restart (restarted).
	carried []*streamState
	// unhanded: ops whose Submit a panic dropped (droppedEffect): no
	// stream or worker ever got them, so none counts them.
	unhanded []OpRef
	// ledger is the handle's pin ledger (txSetHandle), swept when the
	// actor stops.
	ledger *pinLedger
	env    *shellEnv
	// resolving is the TxPeerRequest being stepped with the inputs that
	// built its route (told to the tracer before the step): a panic in
	// the step leaves it set, so that the re-step of the lost message
	// tells the tracer them again (restepping) and the trace replays.
	resolving *txPeerRequestMsg
	// chunkAt is the index the chunk being stepped takes (the session's
	// Chunks() before its step), while chunkStepping: a panic in the
	// step leaves both, and fence, set, so that a chunk the step took
	// before it panicked still has its fence watched (dropped).
	chunkAt       int
	chunkStepping bool
}

// streamChild is a live peer-stream child of a session.
type streamChild struct {
	pid *actor.PID
	st  *streamState
}

// newTxCell is a new TxSession's cell. The cell and its kind live and die
// together: one allocation holds both.
func newTxCell(env *shellEnv, s *TxSession, meter *txMeter) *cell[*TxSession] {
	b := &struct {
		c cell[*TxSession]
		k txKind
	}{c: cell[*TxSession]{env: env, s: s}, k: txKind{s: s, meter: meter, env: env}}
	b.c.k = &b.k
	return &b.c
}

func (k *txKind) side() string    { return "tx" }
func (k *txKind) request() string { return k.s.Config().Request }

func (k *txKind) born(a *shell[*TxSession], ctx actor.Context, now time.Time) []Effect {
	if a.env.recorder != nil {
		// Only then: the birth takes a copy of the config on the heap.
		cfg := k.s.Config()
		a.path, a.tr = openTrace(a.env, ctx.Self().Id, Birth{At: now, Tx: &cfg})
	}
	eff := k.s.Init(now)
	if a.tr != nil {
		a.tr.Stepped(k.s, eff)
	}
	if k.meter != nil {
		k.meter.born(k.s, now)
	}
	return eff
}

func (k *txKind) panicked(err error) any     { return TxPanic{Err: err} }
func (k *txKind) timeout(kind TimerKind) any { return TxTimeout{Kind: kind} }

// restepable: all but a chunk (its pins: txKind.receive); a TxSession
// checks every other message against its state.
func (k *txKind) restepable(m any) bool { _, chunk := m.(TxChunk); return !chunk }

// restepping: a lost TxPeerRequest is recorded again with its route's
// inputs (the Hello and RequestData that built it), as it was the first
// time: replay rebuilds the route from them.
func (k *txKind) restepping(a *shell[*TxSession], m any) {
	r := k.resolving
	k.resolving = nil
	if _, ok := m.(TxPeerRequest); ok && r != nil && a.tr != nil {
		a.tr.Resolved(r.hello, r.rd)
	}
}

// dropped: a chunk whose step panicked after the session took it (its
// pins are the session's: txKind.receive left them) lost its effects with
// the panic, its WatchFence among them. It is not stepped again (it would
// be taken twice), but its fence is watched now, with the chunk's own
// fence, which the panic left in k.fence: until it fires the chunk's
// pages may still be written, and the session cannot drain without it
// (it waited, pinned, for good). A chunk the step did not take needs
// nothing: the shell released its pins.
func (k *txKind) dropped(a *shell[*TxSession], ctx actor.Context, m any, now time.Time) {
	at, stepping, f := k.chunkAt, k.chunkStepping, k.fence
	k.chunkStepping, k.fence = false, nil
	if _, chunk := m.(TxChunk); !chunk || !stepping || k.s.Chunks() <= at || f == nil {
		return
	}
	k.fence = f
	a.exec(ctx, []Effect{WatchFence{Chunk: at}}, now)
	k.fence = nil
}

func (k *txKind) stepped(m any, now time.Time) {
	if k.meter != nil {
		k.meter.stepped(k.s, m, now)
	}
	n := k.s.InDoubt()
	if k.s.Stopped() {
		n = 0 // (it has none: a session stops quiescent)
	}
	k.inDoubt.publish(n, k.env.stats, k.env.meters)
}

func (k *txKind) stopped() {
	if k.meter != nil {
		k.meter.close()
	}
	// Its ops in doubt leave the count with it, as they leave the gauges.
	k.inDoubt.publish(0, k.env.stats, k.env.meters)
	k.sweep() // (Finish did, unless the actor stopped without one)
}

// sweep stops the handle's pin ledger and releases the pins of chunks
// that have not reached the session: nothing of theirs was taken.
func (k *txKind) sweep() {
	if k.ledger != nil {
		k.env.sweepPins(k.request(), k.ledger)
	}
}

// sweepPins stops l and releases the pins of the chunks it still holds
// (they never reached their session, and none will be taken).
func (env *shellEnv) sweepPins(request string, l *pinLedger) {
	for _, src := range l.stop() {
		if err := env.pools.UnpinRuns(src); err != nil {
			env.stats.PinErrors.Add(1)
			env.log.Error().Err(err).Str("request", request).Msg("unpin a chunk that never reached its session")
		}
	}
}

func (k *txKind) receive(a *shell[*TxSession], ctx actor.Context, msg any, now time.Time) bool {
	switch m := msg.(type) {
	case *actor.Terminated:
		k.streamTerminated(a, ctx, m.Who)
	case TxCompleted, TxRetired, TxWorkerDead:
		k.forward(ctx, m)
		return false
	case txChunkMsg:
		if m.Pinned && m.seq != 0 && (a.handle == nil || !a.handle.pins.consume(m.seq)) {
			// Its pins were released when the session finished (Finish
			// sweeps the ledger before Done fires): it came too late to be
			// taken, and nothing of it is held.
			return true
		}
		if m.Pinned {
			// A chunk the session does not take (the outcome decided, the
			// payload refused, the session stopped) leaves the pins the
			// handle took to this shell: released after the step, even
			// when the step or one of its effects panics (its ledger
			// record is consumed: no sweep would find it).
			taken := k.s.Chunks()
			defer func() {
				if k.s.Chunks() == taken {
					if err := a.env.pools.UnpinRuns(m.Src); err != nil {
						a.env.stats.PinErrors.Add(1)
						a.env.log.Error().Err(err).Str("request", k.request()).Msg("unpin a chunk the session did not take")
					}
				}
			}()
		}
		// The fence must be in place while the effects run: WatchFence
		// takes it.
		k.fence = m.fence
		// No defer: a panic in the step leaves chunkAt for dropped.
		k.chunkAt, k.chunkStepping = k.s.Chunks(), true
		eff := a.step(m.TxChunk, now)
		k.chunkStepping = false
		a.exec(ctx, eff, now)
		k.fence = nil
	case *txSetHandle:
		a.handle = m.h
		k.ledger = &m.h.pins
		if k.s.Stopped() {
			// Adopted after it finished (its Finish had no ledger to
			// sweep): no chunk will be taken; the parent finishes the
			// handle, sweeping too.
			k.sweep()
		}
		eff := a.step(m.start, now)
		if st := k.s.State(); st.Terminal() {
			// Decided before Send adopted the session (a peer's frame or a
			// timer came first): the handle learns it now, so Chunk
			// refuses at once.
			a.handle.decide(Decide{Status: st.String(), Err: k.s.Err()})
		}
		a.exec(ctx, eff, now)
	case *txPeerRequestMsg:
		if a.tr != nil {
			a.tr.Resolved(m.hello, m.rd)
		}
		// No defer: a panic in the step leaves resolving for its re-step.
		k.resolving = m
		eff := a.step(m.TxPeerRequest, now)
		k.resolving = nil
		a.exec(ctx, eff, now)
	default:
		return false
	}
	return true
}

func (k *txKind) effect(a *shell[*TxSession], ctx actor.Context, eff Effect, _ time.Time) {
	switch e := eff.(type) {
	case Pin:
		if err := a.env.pools.Pin(e.Group, e.IDs); err != nil {
			// The refusal goes back to the session before anything else
			// reaches it: the chunk's fence cannot have been stepped yet,
			// so none of its ops has left.
			a.env.stats.PinErrors.Add(1)
			a.feedback = append(a.feedback, TxPinFailed{Chunk: e.Chunk, Group: e.Group, Err: err})
		}
	case Unpin:
		if err := a.env.pools.Unpin(e.Group, e.IDs); err != nil {
			a.env.stats.PinErrors.Add(1)
			a.env.log.Error().Err(err).Str("request", k.request()).Msg("unpin")
		}
	case WatchFence:
		k.watch(a, ctx, e)
	case Submit:
		k.toStream(a, ctx, e.Peer, e.Worker, eff)
	case Flush:
		k.toStream(a, ctx, e.Peer, e.Worker, eff)
	case CloseEndpoint:
		k.toStream(a, ctx, e.Peer, e.Worker, eff)
	case EndStream:
		k.toStream(a, ctx, e.Peer, e.Worker, eff)
	case SendFrame:
		if e.FromStream {
			k.toStream(a, ctx, e.Peer, e.Worker, eff)
			break
		}
		// A frame of no stream (an answer to a peer the session has no
		// stream for): nothing of it is in flight.
		sendTo(ctx, a.env.frameWorker(e.Worker), &workerSend{SendFrame: e})
	case Decide:
		if a.handle != nil {
			a.handle.decide(e)
		}
	case Finish:
		// Chunks the handle pinned that are still on their way here will
		// not be taken (the session is released): their pins go now, so
		// that Done means every pin dropped (the caller frees its source
		// blocks at Done), and no pin is taken from now on.
		k.sweep()
		// The parent hears first: a caller woken by Done that closes the
		// engine at once (its closeReq behind this in the parent's
		// mailbox) finds the session gone, not "still draining".
		ctx.Send(ctx.Parent(), &sessionStopped{request: k.request(), session: ctx.Self(), outcome: e.Outcome, silent: k.s.SilentPeers()})
		if a.handle != nil {
			a.handle.finish(e.Outcome)
		}
	case Stop:
		// The tx supervisor poisons the session once it has taken it off
		// its table: frames it forwarded before that are still in this
		// mailbox, and the stopped session answers them instead of
		// letting them fall into dead letters.
		a.stopTimers()
	}
}

// watch watches a chunk's fence (WatchFence): the chunk's own, which
// k.fence holds while the chunk's effects run (and a panic leaves there).
func (k *txKind) watch(a *shell[*TxSession], ctx actor.Context, e WatchFence) {
	if k.chunkStepping && e.Chunk == k.chunkAt {
		// The chunk's own WatchFence, from the effects its step
		// emitted before it panicked (unreturned): dropped has
		// nothing left to watch.
		k.chunkStepping = false
	}
	f := k.fence
	if f == nil {
		f = FiredFence{}
	}
	sys, self, idx := ctx.ActorSystem(), ctx.Self(), e.Chunk
	if err := watchFence(f, func(err error) { sys.Root.Send(self, TxFenceFired{Index: idx, Err: err}) }); err != nil {
		a.feedback = append(a.feedback, TxFenceFired{Index: idx, Err: err})
	}
}

// toStream hands a stream effect to the stream's child actor, spawning it
// on the stream's first effect.
func (k *txKind) toStream(a *shell[*TxSession], ctx actor.Context, peer, worker int, e Effect) {
	c := k.streams[peer]
	if c == nil {
		if k.streams == nil {
			k.streams = map[int]*streamChild{}
		}
		// The child and its state in one allocation (a later respawn over
		// the same state makes a child of its own).
		b := &struct {
			c  streamChild
			st streamState
		}{st: streamState{env: a.env, session: ctx.Self(), peer: peer, worker: worker, inflight: map[int]struct{}{}}}
		st := &b.st
		if k.respawn[peer] {
			// Respawned: the stream stopped before its terminal frame (a
			// restart of the session stops its children first, and each
			// one's Terminated marks it here). What the step has in flight
			// for the peer is the new stream's account.
			for r, s := range k.s.OpStates() {
				if r.Peer == peer && (s == OpSubmitting || s == OpSubmitted || s == OpInDoubt) && !slices.Contains(k.unhanded, r) {
					st.inflight[r.Seq] = struct{}{}
				}
			}
		}
		b.c = streamChild{pid: ctx.Spawn(streamProps(st)), st: st}
		c = &b.c
		k.streams[peer] = c
	}
	ctx.Send(c.pid, e) // as it is (stream.go)
}

// droppedEffect: a stream's terminal frame dropped after a second panic
// (run) never reached its stream (a panic that escapes the effect comes
// before the stream takes it: rerunnable), so it never left, and nothing
// will report it. It is stepped as a frame that did not leave (TxSent with
// an error: a SUCCESS Result fails the request at once, another terminal
// frame changes nothing), and the stream ends without it (EndStream: it
// stops once its own count of ops unsettled is empty, holding the
// session's release until then). Before, the session waited for a TxSent
// that never came and decided only at its deadline.
//
// Likewise a stream's Submit dropped so never reached the stream, nor a
// worker: it is stepped as an op its worker refused (never posted:
// NOT_SUBMITTED, quiescent). Before, the op stayed SUBMITTING for good:
// the session never drained, its source pins held, Done never came. A
// stream spawned again takes the step's ops in flight as its account
// (toStream), but never such an op: no report would settle it.
//
// A stream's end without a frame (EndStream) dropped is handed to the
// stream anyway, unless it has it: it touches no page and no peer, and
// the stream still stops only once its own count of ops unsettled is
// empty. Before, a stream that lived through the panics (its session
// resumed past its restart budget, not restarted) never stopped, and the
// session's release waited for it for good.
//
// A stream's CloseEndpoint dropped is handed to the stream anyway too: it
// never reached it, nor a worker, and it is what proves the ops in doubt
// over (the drain timer fires once). Before, they stayed IN_DOUBT for
// good: the session never drained, its pins held, Done never came.
//
// A chunk's WatchFence dropped is watched anyway: it touches no page and
// no peer (watchFence turns a panic of the fence's own into the fence
// failing), and the fence is the only word that the producer stopped
// writing the chunk. Before, nothing watched it: the chunk stayed pinned
// and unfired for good, the session never drained, Done never came.
func (k *txKind) droppedEffect(a *shell[*TxSession], ctx actor.Context, e Effect) {
	switch e := e.(type) {
	case Submit:
		// (Until that is stepped the op is still SUBMITTING in the step:
		// a stream spawned again meanwhile must not count it.)
		k.unhanded = append(k.unhanded, e.Op)
		// A stream spawned again before the drop may have counted it
		// already (its account is the step's ops in flight, this one's
		// Submit still to run then): it is settled there too, as the
		// worker's refusal would have been. Else that stream — alive
		// past the session's restart budget, which stops no child —
		// counted it unsettled for good: it held its terminal frame and
		// the session's release (Done never came, the pins stayed).
		k.settle(ctx, e.Peer, streamSettle{seqs: []int{e.Op.Seq}})
		a.feedback = append(a.feedback, TxCompleted{Op: e.Op, Refused: true, Err: fmt.Errorf("%w: it panicked twice handing the op to its stream: dropped, never posted", ErrSessionCrashed)})
	case SendFrame:
		if !e.FromStream {
			return
		}
		a.feedback = append(a.feedback, TxSent{Peer: e.Peer, Err: fmt.Errorf("%w: it panicked twice handing the frame to its stream: dropped", ErrSessionCrashed)})
		k.toStream(a, ctx, e.Peer, e.Worker, EndStream{Worker: e.Worker, Peer: e.Peer})
	case EndStream:
		if c := k.streams[e.Peer]; c == nil || !c.st.ending && !c.st.done {
			k.toStream(a, ctx, e.Peer, e.Worker, e)
		}
	case CloseEndpoint:
		k.toStream(a, ctx, e.Peer, e.Worker, e)
	case WatchFence:
		k.watch(a, ctx, e)
	}
}

// restarted is told first thing when a restart of the session ends
// (Started): the stream children the restart stopped with something of
// theirs still to do are spawned again, before anything else of the
// session runs (its leftover effects, its TxPanic).
func (k *txKind) restarted(_ *shell[*TxSession], ctx actor.Context) { k.spawnCarried(ctx) }

// spawnCarried spawns each carried stream again over its state: its held
// frame leaves once its own count of ops unsettled is empty, as it would
// have; a message a panic lost is handled again at its Started.
func (k *txKind) spawnCarried(ctx actor.Context) {
	for _, st := range k.carried {
		if k.streams == nil {
			k.streams = map[int]*streamChild{}
		}
		k.streams[st.peer] = &streamChild{pid: ctx.Spawn(streamProps(st)), st: st}
	}
	k.carried = nil
}

// watchFence calls f.OnReady(fired), and turns a panic in it (the
// caller's Fence: a nil pointer, a broken implementation) into the
// chunk's fence failing with the panic, named. Crashing the session
// instead would leave the chunk pinned and its fence never watched again:
// the session would never drain. (A second fire, if OnReady fired before
// it panicked, is ignored by the step.)
func watchFence(f Fence, fired func(error)) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: fence %T panicked in OnReady: %v", ErrFence, f, r)
		}
	}()
	f.OnReady(fired)
	return nil
}

// forward forwards a worker's report about streams' ops (TxCompleted,
// TxRetired, TxWorkerDead) to those streams (settle).
func (k *txKind) forward(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case TxCompleted:
		// The report itself (msg, the interface it came in: nothing to
		// allocate), which the stream settles as streamSettle{seqs:
		// []int{m.Op.Seq}}.
		k.settle(ctx, m.Op.Peer, msg)
	case TxRetired:
		for _, r := range m.Ops {
			k.settle(ctx, r.Peer, streamSettle{seqs: []int{r.Seq}})
		}
	case TxWorkerDead:
		for peer := range k.streams {
			k.settle(ctx, peer, streamSettle{dead: m.Worker + 1})
		}
	}
}

// reforward: a worker's report a panic inside the step lost is forwarded
// to its streams again before it is stepped again (restep). The first
// forward may not have counted: the stream may have dropped it (a panic
// in it, twice) and been spawned again over its state since (carried).
// Never forwarded again, the report that settles a stream's count was
// lost for it, while the step, which takes it, says the op is over: the
// stream held its terminal frame, and its session's release, for good. A
// settle is idempotent: forwarded twice, it changes nothing more.
func (k *txKind) reforward(_ *shell[*TxSession], ctx actor.Context, m any) { k.forward(ctx, m) }

// settle forwards a worker's report about a stream's ops to the stream
// before the session steps it: the frame the step may emit in answer
// finds the stream's account settled.
func (k *txKind) settle(ctx actor.Context, peer int, m any) {
	if c := k.streams[peer]; c != nil && !c.st.done {
		ctx.Send(c.pid, m)
	}
}

// hold keeps the session's release (Unpin…, Finish, Stop) while stream
// children are still alive: it runs once the last of them has terminated.
func (k *txKind) hold(_ *shell[*TxSession], rest []Effect) bool {
	if len(k.streams) == 0 || len(rest) == 0 {
		return false
	}
	switch rest[0].(type) {
	case Unpin, Finish:
	default:
		return false
	}
	for _, e := range rest {
		switch e.(type) {
		case Unpin, Finish, Stop:
		default:
			return false
		}
	}
	if _, ok := rest[len(rest)-1].(Stop); !ok {
		return false
	}
	k.release = slices.Clone(rest)
	return true
}

// streamTerminated forgets a stream child; the last one lets a held
// release run.
func (k *txKind) streamTerminated(a *shell[*TxSession], ctx actor.Context, who *actor.PID) {
	for peer, c := range k.streams {
		if c.pid.Equal(who) {
			switch st := c.st; {
			case st.done:
			case st.held != nil || st.ending || st.handling != nil:
				// Stopped (by a restart of the session, or past its own
				// restart budget) with its terminal frame held, its end
				// waiting, or a message lost: nothing would send that
				// frame again, and its count of ops unsettled, the check
				// on the step's, would be lost with it. It is spawned
				// again over the same state.
				a.env.log.Warn().Str("request", k.request()).Int("peer", peer).Bool("frame", st.held != nil).
					Int("unsettled", len(st.inflight)).Msg("stream stopped before its terminal frame left: spawned again over its state")
				k.carried = append(k.carried, st)
			default:
				// Stopped by a restart of the session, not by its own
				// terminal frame: it is spawned again on its next effect.
				a.env.log.Debug().Str("request", k.request()).Int("peer", peer).Msg("stream stopped before its terminal frame")
				if k.respawn == nil {
					k.respawn = map[int]bool{}
				}
				k.respawn[peer] = true
			}
			delete(k.streams, peer)
		}
	}
	if !a.restarting && !a.stopping {
		// (While the session restarts or stops, a child spawned now would
		// hold that up: restarted spawns them.)
		k.spawnCarried(ctx)
	}
	if len(k.streams) == 0 && len(k.carried) == 0 && k.release != nil {
		rel := k.release
		k.release = nil
		a.run(ctx, rel, a.env.clock.Now())
	}
}
