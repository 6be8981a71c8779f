package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/kvcache"
)

// rxKind is the RxSession's kind of the session shell: its destination
// blocks (freed, quarantined, released) and its RequestData reports.
type rxKind struct {
	s     *RxSession
	stats *Counters
	meter *rxMeter // nil: metrics off
	// stale is how many of the session's StaleFrames stats counted.
	stale int
	// revoked is what a revocation of the destination blocks left for the
	// proof to release (EngineConfig.Revoker); nil without one.
	revoked *revoked
	// callerHeld: the framework's blocks this session counts in
	// Counters.CallerAwaitingProof.
	callerHeld int64
	// refused: the pools refused a quarantine, release or free of the
	// destination blocks (destRefused): they stay where they were, and
	// the session moves them no more.
	refused bool
}

// newRxCell is a new RxSession's cell. The cell and its kind live and die
// together: one allocation holds both.
func newRxCell(env *shellEnv, s *RxSession, handle *Handle, meter *rxMeter) *cell[*RxSession] {
	b := &struct {
		c cell[*RxSession]
		k rxKind
	}{c: cell[*RxSession]{env: env, s: s, handle: handle}, k: rxKind{s: s, stats: env.stats, meter: meter}}
	b.c.k = &b.k
	return &b.c
}

func (k *rxKind) side() string    { return "rx" }
func (k *rxKind) request() string { return k.s.Config().Request }

func (k *rxKind) born(a *shell[*RxSession], ctx actor.Context, now time.Time) []Effect {
	if a.env.recorder != nil {
		// Only then: the birth takes a copy of the config on the heap.
		cfg := k.s.Config()
		a.path, a.tr = openTrace(a.env, ctx.Self().Id, Birth{At: now, Rx: &cfg})
	}
	if a.tr != nil {
		a.tr.Stepped(k.s, nil)
	}
	if k.meter != nil {
		k.meter.born(k.s, now)
	}
	return a.step(RxBegin{}, now)
}

func (k *rxKind) panicked(err error) any     { return RxPanic{Err: err} }
func (k *rxKind) timeout(kind TimerKind) any { return RxTimeout{Kind: kind} }

// restepable: every message (an RxSession checks each against its state:
// one it took already changes nothing more).
func (k *rxKind) restepable(any) bool { return true }

// restepping: an RxSession's messages carry all a replay needs.
func (k *rxKind) restepping(*shell[*RxSession], any) {}

// dropped: an RxSession takes no message it must act on later.
func (k *rxKind) dropped(*shell[*RxSession], actor.Context, any, time.Time) {}

func (k *rxKind) stepped(_ any, now time.Time) {
	if n := k.s.StaleFrames - k.stale; n > 0 {
		// Frames the session ignored: Counters.FramesStale, as the meter
		// counts them kvxfer_frames_rejected_total{reason="stale"}.
		k.stats.FramesStale.Add(int64(n))
		k.stale = k.s.StaleFrames
	}
	if k.meter != nil {
		k.meter.stepped(k.s, now)
	}
}

func (k *rxKind) stopped() {
	if k.meter != nil {
		k.meter.close()
	}
}

func (k *rxKind) receive(*shell[*RxSession], actor.Context, any, time.Time) bool { return false }
func (k *rxKind) hold(*shell[*RxSession], []Effect) bool                         { return false }

// readdressed tells the rx parent that a session addressed writer writer
// of request to incarnation inc (RxAddress, or Readdress).
type readdressed struct {
	request string
	writer  int
	inc     uint64
}

// unaddressed checks a RequestData against its writer's latest Hello just
// before it leaves (it has never left: a writer is sent one until it
// does), as core.Addressing decides: nil, it leaves; an RxAddress, it is
// re-addressed (the parent's table follows); an RxSent refusal, it waits
// for a Hello (counted unsent, as a frame the control plane refused).
func (k *rxKind) unaddressed(a *shell[*RxSession], ctx actor.Context, e SendRequestData) any {
	if a.env.link == nil {
		return nil
	}
	h, err := a.env.link.Hello(e.To)
	switch m := core.Addressing(e, h, err).(type) {
	case RxAddress:
		// The parent's table too: exit proofs are matched there.
		ctx.Send(ctx.Parent(), &readdressed{request: k.request(), writer: e.Writer, inc: m.Incarnation})
		return m
	case RxSent:
		a.env.stats.FramesUnsent.Add(1)
		return m
	}
	return nil
}

func (k *rxKind) effect(a *shell[*RxSession], ctx actor.Context, eff Effect, _ time.Time) {
	switch e := eff.(type) {
	case SendFrame:
		sendTo(ctx, a.env.frameWorker(e.Worker), &workerSend{SendFrame: e})
	case Readdress:
		// A Misaddressed taken: the parent's table follows, as for an
		// RxAddress (unaddressed).
		ctx.Send(ctx.Parent(), &readdressed{request: k.request(), writer: e.Writer, inc: e.Incarnation})
	case SendRequestData:
		if held := k.unaddressed(a, ctx, e); held != nil {
			a.feedback = append(a.feedback, held)
			break
		}
		w := a.env.frameWorker(e.Worker)
		if w == nil {
			// No worker left: it never leaves.
			a.feedback = append(a.feedback, RxSent{Writer: e.Writer, Err: fmt.Errorf("%w: no sender worker left", ErrEngineFailed)})
			break
		}
		ctx.Send(w, &workerSend{SendFrame: SendFrame{Worker: e.Worker, To: e.To, Frame: e.Frame},
			report: ctx.Self(), writer: e.Writer})
	case Finish:
		if hoptrace.On {
			hoptrace.Mark("rx.finish", k.request())
		}
		// After the step's other effects (exec): a READY session stops in
		// the same step, and a caller woken by Done that closes the
		// engine at once must find it gone, not "still draining".
		a.finishLater = func() {
			if e.Outcome.OK {
				// READY: every writer reported, none can touch the blocks
				// (the doc's promise: Released is closed at READY, so a
				// caller woken by Done finds it closed already).
				a.handle.release()
			}
			a.handle.finish(e.Outcome)
		}
	case QuarantineDest:
		if k.s.Config().CallerOwned {
			// The framework's: Released tells it only after the proof.
			k.callerHeld = int64(countBlocks(e.Blocks))
			a.env.stats.CallerAwaitingProof.Add(k.callerHeld)
			break
		}
		if a.env.revoker != nil {
			r := a.env.revokeDest(k.request(), e.Blocks)
			k.revoked = &r
			break
		}
		if err := a.env.pools.Quarantine(e.Blocks); err != nil {
			k.destRefused(a, "quarantine", e.Blocks, err)
		}
	case ReleaseDest:
		if k.s.Config().CallerOwned {
			if e.Quarantined && k.callerHeld != 0 {
				a.env.stats.CallerAwaitingProof.Add(-k.callerHeld)
				k.callerHeld = 0
			}
			break // the framework's: Released tells it below
		}
		if e.Quarantined && k.revoked != nil {
			a.env.releaseRevoked(k.request(), *k.revoked)
			k.revoked = nil
			break
		}
		if k.refused {
			// Their quarantine was refused: they are not in quarantine,
			// and what state they are in is not what this session
			// thinks. They stay as the pools hold them (counted once).
			break
		}
		if e.Quarantined {
			if err := a.env.pools.ReleaseQuarantine(e.Blocks); err != nil {
				k.destRefused(a, "release from quarantine", e.Blocks, err)
			}
			break
		}
		if err := a.env.pools.Free(e.Blocks); err != nil {
			k.destRefused(a, "free", e.Blocks, err)
		}
	case Stop:
		a.stopTimers()
		// Every writer is quiescent, or the request holds no destination
		// block (each one a prefix hit): no write can touch its blocks,
		// which may be reused, and the parent says Released as it takes
		// this (before, the session said it first, and a caller it woke
		// could close the engine before the parent knew the session had
		// stopped). A session abandoned at Close with writers unproven
		// keeps its blocks quarantined: the handle never says Released,
		// and Close reports the request (inDoubt).
		quiet := k.s.WritersQuiescent()
		ctx.Send(ctx.Parent(), &sessionStopped{request: k.request(), session: ctx.Self(), inDoubt: !quiet && k.s.HoldsBlocks()})
		ctx.Stop(ctx.Self())
	}
}

// destRefused records that the pools refused op (a quarantine, a release
// from quarantine, a free) of the request's destination blocks. Both
// effects follow the request's terminal outcome (its step emits them after
// Finish, and READY's blocks are the caller's), so there is no request
// left to fail: the refusal is counted (Counters.DestBlockErrors) and
// logged once. The pools change every group or none, so the blocks stay
// where they were: quarantined, or held by the receive (in use), as the
// pools' own counters say. They are never freed: a block whose state is
// not the one this session expects may be another's, or still written.
func (k *rxKind) destRefused(a *shell[*RxSession], op string, blocks [][]kvcache.BlockID, err error) {
	k.refused = true
	a.env.destRefused(k.request(), op, blocks, err)
}

// destRefused counts (Counters.DestBlockErrors) and logs once a refused
// op on request's destination blocks (rxKind.destRefused, revokeDest,
// releaseRevoked).
func (env *shellEnv) destRefused(request, op string, blocks [][]kvcache.BlockID, err error) {
	env.stats.DestBlockErrors.Add(1)
	env.log.Error().Err(err).Str("request", request).Str("op", op).Int("blocks", countBlocks(blocks)).
		Msg("the pools refused this " + op + " of the request's destination blocks: they stay held as they are (quarantined or in use), never freed while the engine runs; a bug: report it with this line")
}

// countBlocks counts the block ids of every layer group.
func countBlocks(groups [][]kvcache.BlockID) int {
	n := 0
	for _, ids := range groups {
		n += len(ids)
	}
	return n
}
