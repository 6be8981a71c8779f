package core

// Invariant checks and test switches (DESIGN.md §7: test hooks live behind
// a build tag). A default build records no invariant violations, has every
// mutation off and no crash injection in its API; a build with the
// kvxfer_invariants tag (make test, make sim) adds them:
//
//   - TxSession.Violations lists illegal transitions (invariants_on.go);
//   - Mutations, the fault switches test/sim must catch;
//   - crash injection in package actors (TxHandle.Crash,
//     Engine.CrashWorker).

// Violations lists the illegal transitions the session saw (an op moved
// against OpState's transition table, a fence that fired twice, a
// completion for an unknown op, an unknown message). Tests require it to
// stay empty. Only builds with the kvxfer_invariants tag record them
// (Invariants reports which): in a default build it is always empty.
func (s *TxSession) Violations() []string { return s.violations }
