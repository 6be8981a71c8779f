//go:build kvxfer_invariants

package core

import "testing"

// TestTx_ViolationsAreRecorded: the invariant checks themselves work — a
// fence that fires twice and a completion for an unknown op are recorded.
func TestTx_ViolationsAreRecorded(t *testing.T) {
	s := NewTxSession(TxConfig{Request: "r1"})
	s.Step(TxStart{PromptLen: 32}, testEpoch0)
	s.Step(testChunk(0, 32, true, 1), testEpoch0)
	s.Step(TxFenceFired{Index: 0}, testEpoch0)
	s.Step(TxFenceFired{Index: 0}, testEpoch0)
	s.Step(TxCompleted{Op: OpRef{Request: "r1", Peer: 4, Seq: 0}}, testEpoch0)
	s.Step("nonsense", testEpoch0)
	if len(s.Violations()) != 3 {
		t.Fatalf("violations %q, want 3", s.Violations())
	}
}
