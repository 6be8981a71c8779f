//go:build kvxfer_invariants

package core

import "fmt"

// Invariants is true in builds with the kvxfer_invariants tag: sessions
// record Violations, and Mutations and crash injection exist.
const Invariants = true

// Mutations are fault switches used by test/sim to prove that it catches
// bugs. Each one breaks a rule of DESIGN.md §3 on purpose. They are
// package variables, so a test that sets one must not run in parallel with
// other tests of the engine and must reset it when it ends. They exist
// only in builds with the kvxfer_invariants tag.
var Mutations struct {
	// UnpinOnCancelWithoutDrain unpins a CANCELLED session's source pages
	// at once, without waiting for its ops to become quiescent.
	UnpinOnCancelWithoutDrain bool
	// LateSuccessOverwritesFailed lets a successful completion that arrives
	// after the session FAILED reopen it (and so let it end DONE).
	LateSuccessOverwritesFailed bool
	// AdmitAfterDrain admits chunks (pins and ops) after the session's
	// outcome is decided.
	AdmitAfterDrain bool
	// FreeOnSuspicion treats a suspected writer (RxSuspect: missed
	// heartbeats) as proven quiescent, so its request's destination blocks
	// are freed instead of quarantined.
	FreeOnSuspicion bool
	// EndBeforeFinalPart ends a stream once any layer part of the last
	// chunk is written, not only its final part (the one that reaches the
	// model's last layer): the SUCCESS leaves before the later parts.
	EndBeforeFinalPart bool
	// DoneOnHandoff counts a stream's SUCCESS Result as sent once it is
	// handed to its worker, without waiting for the worker's report
	// (TxSent): a Result the control plane refused still ends DONE.
	DoneOnHandoff bool
	// ProofFromInvalid takes a writer's Result that failed validation as
	// proof that the writer is done, so the request's destination blocks
	// are freed instead of quarantined.
	ProofFromInvalid bool
	// RejectUnresolvedDuplicate answers a duplicate RequestData that
	// failed to resolve FAILED, as a first one, although the stream it
	// duplicates may have writes in flight.
	RejectUnresolvedDuplicate bool
	// ReaddressKeepsPredecessor takes a Misaddressed by sending the
	// writer's RequestData again to the incarnation that dropped it, but
	// leaves the writer addressed to the predecessor for everything else
	// (its answers, its exit proof, the rx parent's table): the
	// predecessor's exit proof then ends a writer whose successor got
	// the request.
	ReaddressKeepsPredecessor bool
	// DropEarlyMisaddressed drops a Misaddressed that comes before the
	// worker's report that its RequestData left (RxSent) as stale, as the
	// session did before it held such answers: the writer stays
	// addressed to an incarnation that never got the request.
	DropEarlyMisaddressed bool
}

func mutDropEarlyMisaddressed() bool { return Mutations.DropEarlyMisaddressed }

func mutReaddressKeepsPredecessor() bool { return Mutations.ReaddressKeepsPredecessor }

func mutRejectUnresolvedDuplicate() bool { return Mutations.RejectUnresolvedDuplicate }

func mutDoneOnHandoff() bool { return Mutations.DoneOnHandoff }

func mutProofFromInvalid() bool { return Mutations.ProofFromInvalid }

func mutFreeOnSuspicion() bool { return Mutations.FreeOnSuspicion }

func mutEndBeforeFinalPart() bool { return Mutations.EndBeforeFinalPart }

// violate records an illegal transition.
func (s *TxSession) violate(format string, args ...any) {
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

func mutAdmitAfterDrain() bool { return Mutations.AdmitAfterDrain }

// mutUnpinEarly is mutation UnpinOnCancelWithoutDrain: a CANCELLED
// session's pinned chunks are unpinned before it drains.
func (s *TxSession) mutUnpinEarly() {
	if !Mutations.UnpinOnCancelWithoutDrain || s.state != TxCancelled || s.stopped {
		return
	}
	for i := range s.chunks {
		s.unpinChunk(&s.chunks[i])
	}
}

// mutLateSuccess is mutation LateSuccessOverwritesFailed: a successful
// completion reopens a FAILED session.
func (s *TxSession) mutLateSuccess() {
	if Mutations.LateSuccessOverwritesFailed && s.state == TxFailed {
		s.state, s.err = TxTransferring, nil
	}
}
