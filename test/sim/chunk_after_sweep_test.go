package sim

import "testing"

// TestChunkAfterSweep keeps fixed a model bug of the simulator that
// -suspect-partitions found (seed 326825): a context session that failed
// (its peer declared gone) and stopped swept its handle's pin ledger at
// Finish, but the serving process, which had not yet heard Done, handed
// another chunk; the simulated handle pinned it (the real one pins nothing
// once its ledger stopped: pinLedger.take, TxHandle.ChunkPayload returns
// an error), so the process's free after Done found a block still pinned.
// The model now refuses such a chunk, and the parent's sweep at
// sessionStopped (a Send that adopted the session after its Finish) stops
// the ledger too, as parents.go does.
func TestChunkAfterSweep(t *testing.T) {
	if res := Run(Config{Seed: 326825, SuspectPartitions: true}); res.Failure != nil {
		t.Errorf("%v\n\treproduce: go test -tags kvxfer_invariants ./test/sim -run 'TestSeed$' -seed=326825 -suspect-partitions -v", res.Failure)
	}
}
