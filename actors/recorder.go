package actors

import (
	"strconv"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// Recorder receives every message a session steps on (the trace seam). It
// is called from the session's actor, just before the step, with the
// session's actor path ("instance/rank/pid", unique within a process) and
// the shell's clock. Calls for one session never overlap; calls for
// different sessions do, so an implementation must be goroutine-safe.
type Recorder interface {
	Record(actor string, msg any, at time.Time)
}

// Tracer is a Recorder that records what replay needs (DESIGN.md §8): each
// engine's topology, each session's birth, the inputs that built each
// TxPeerRequest's route, and what each step left behind. An engine whose
// Recorder is a Tracer calls Engine once when it starts and Session once
// per session, and from then on routes that session's messages to the
// SessionTracer instead of Record. Package trace implements it.
type Tracer interface {
	Recorder
	// Engine is called once, when the engine starts, before any session.
	Engine(info EngineInfo)
	// Session is called from a new session's actor before anything else
	// happens to the session. It may return nil to leave the session
	// untraced.
	Session(actor string, b Birth) SessionTracer
}

// EngineInfo is what replay needs to know about an engine.
type EngineInfo struct {
	Self     messages.PeerID
	Topology Topology
	Workers  int
}

// Birth is what a session is built from: exactly one of Tx and Rx is set.
// At is the shell's clock when the session started (a TxSession's Init
// runs at At).
type Birth struct {
	Engine messages.PeerID
	At     time.Time
	Tx     *TxConfig
	Rx     *RxConfig
}

// SessionTracer records one session. Its methods are called from the
// session's actor only, one at a time.
type SessionTracer interface {
	// Record is called before each step with the message and the clock.
	Record(msg any, at time.Time)
	// Resolved is called just before Record of a TxPeerRequest with the
	// inputs that built its route: the generation rank's Hello (nil when
	// the control plane did not know it) and its RequestData.
	Resolved(hello *messages.Hello, rd *messages.RequestData)
	// Stepped is called after each step — and once after the birth, with a
	// TxSession's Init effects (none for an RxSession) — with the session
	// (*TxSession or *RxSession) and the effects the step returned. A step
	// that panics gets no Stepped call (a StepPanicTracer is told of it).
	Stepped(session any, eff []Effect)
}

// StepPanicTracer is a SessionTracer that is told of a step that
// panicked, so that its trace holds that step even when nothing follows
// it (the session's last step, a process that dies of the panic).
// Package trace's sessions are one.
type StepPanicTracer interface {
	SessionTracer
	// StepPanicked is called instead of Stepped when the step Record
	// announced panics, with the panic's value, on the panic's way up to
	// the session's supervisor (which it goes on to, unchanged). It must
	// not panic.
	StepPanicked(v any)
}

// stepper is what both session kinds offer their shells.
type stepper interface {
	Step(msg any, now time.Time) []Effect
	// Unreturned takes the effects of a step that panicked after it
	// emitted them (and forgets them).
	Unreturned() []Effect
	// Recycle hands back a slice Step returned, its effects run and the
	// slice referenced no more: the next Step reuses its storage.
	Recycle(eff []Effect)
}

// traced steps s on m, telling the tracer (or the plain recorder) first.
func traced(env *shellEnv, path string, tr SessionTracer, s stepper, m any, now time.Time) []Effect {
	switch {
	case tr != nil:
		tr.Record(m, now)
		var eff []Effect
		if pt, ok := tr.(StepPanicTracer); ok {
			eff = stepTold(pt, s, m, now)
		} else {
			eff = s.Step(m, now)
		}
		tr.Stepped(s, eff)
		return eff
	case env.recorder != nil:
		env.recorder.Record(path, m, now)
	}
	return s.Step(m, now)
}

// stepTold steps s on m and tells tr of a panic in the step before it goes
// on up (a panic in Stepped is the tracer's, not the step's: not told).
func stepTold(tr StepPanicTracer, s stepper, m any, now time.Time) []Effect {
	defer func() {
		if r := recover(); r != nil {
			tr.StepPanicked(r)
			panic(r)
		}
	}()
	return s.Step(m, now)
}

// openTrace names a new session's actor and, under a Tracer, records its
// birth.
func openTrace(env *shellEnv, id string, b Birth) (path string, tr SessionTracer) {
	if env.recorder == nil {
		return "", nil
	}
	// env.self.String() + "/" + id, in one allocation (PeerID.String is a
	// Sprintf: one more a session, each of them while recording).
	path = env.self.Instance + "/" + strconv.Itoa(int(env.self.Rank)) + "/" + id
	if env.tracer != nil {
		b.Engine = env.self
		tr = env.tracer.Session(path, b)
	}
	return path, tr
}
