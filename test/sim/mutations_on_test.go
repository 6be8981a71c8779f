//go:build kvxfer_invariants

package sim

import (
	"testing"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/core"
)

// mutations are the bug switches the simulator must catch
// (core.Mutations and actors.Mutations, present in kvxfer_invariants
// builds only).
var mutations = []struct {
	name string
	on   *bool
	// suspect: the mutation needs a failure detector that suspects
	// partitioned (alive) peers (Config.SuspectPartitions).
	suspect bool
}{
	{"unpin-on-cancel", &core.Mutations.UnpinOnCancelWithoutDrain, false},
	{"late-success", &core.Mutations.LateSuccessOverwritesFailed, false},
	{"admit-after-drain", &core.Mutations.AdmitAfterDrain, false},
	{"free-on-suspicion", &core.Mutations.FreeOnSuspicion, true},
	{"end-before-final-part", &core.Mutations.EndBeforeFinalPart, false},
	{"done-on-handoff", &core.Mutations.DoneOnHandoff, false},
	{"proof-from-invalid", &core.Mutations.ProofFromInvalid, false},
	{"reject-unresolved-duplicate", &core.Mutations.RejectUnresolvedDuplicate, false},
	{"readdress-keeps-predecessor", &core.Mutations.ReaddressKeepsPredecessor, false},
	{"drop-early-misaddressed", &core.Mutations.DropEarlyMisaddressed, false},
	{"whole-plan-for-parts", &actors.Mutations.WholePlanForParts, false},
}

// TestMutations proves the simulator catches bugs: with each mutation
// switch on, some seed among the first 1,000 must fail. It does not run in
// parallel with anything (the switches are package variables).
func TestMutations(t *testing.T) {
	for _, m := range mutations {
		t.Run(m.name, func(t *testing.T) {
			setMutation(t, m.name)
			const limit = 1000
			const batch = 50
			for base := uint64(1); base <= limit; base += batch {
				sw := RunSeeds(base, batch, true, Config{SuspectPartitions: m.suspect})
				if len(sw.Failures) > 0 {
					f := sw.Failures[0]
					t.Logf("caught at seed %d: %v", f.Seed, f.Msg)
					return
				}
			}
			t.Fatalf("mutation %s not caught in %d seeds", m.name, limit)
		})
	}
}
