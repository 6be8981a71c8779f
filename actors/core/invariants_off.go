//go:build !kvxfer_invariants

package core

// Invariants is false in a default build: sessions record no Violations,
// and there are no Mutations and no crash injection.
const Invariants = false

func (*TxSession) violate(string, ...any) {}

func mutAdmitAfterDrain() bool { return false }

func (*TxSession) mutUnpinEarly() {}

func (*TxSession) mutLateSuccess() {}

func mutFreeOnSuspicion() bool { return false }

func mutEndBeforeFinalPart() bool { return false }

func mutDoneOnHandoff() bool { return false }

func mutProofFromInvalid() bool { return false }

func mutRejectUnresolvedDuplicate() bool { return false }

func mutReaddressKeepsPredecessor() bool { return false }

func mutDropEarlyMisaddressed() bool { return false }
