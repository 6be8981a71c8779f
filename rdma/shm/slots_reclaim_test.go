package shm_test

import (
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"github.com/kvxfer/kvxfer/rdma/rdmatest"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestSlotTableDoesNotFillWithDeadWriters: 61 writers, one after another,
// each killed with a batch in flight while the region stays registered
// (a long-lived receiver registers its pool once), and the owner reclaims
// when it learns of each death (Agent.ReclaimDead, as a node does from a
// writer's pidfd). The 61st still finds a slot, so after its death the
// region is not busy. Without the reclaim between deaths the slots of
// dead writers filled the table (60), the 61st counted in the shared
// word only, and the region stayed busy for ever (found by review).
func TestSlotTableDoesNotFillWithDeadWriters(t *testing.T) {
	if os.Getenv(deadWriterEnv) != "" {
		t.Skip("parent only")
	}
	const n = 1 << 16
	r, c, err := shm.NewRegion("", n)
	if err != nil {
		t.Fatal(err)
	}
	a := shm.New()
	t.Cleanup(func() { a.Close(); c.Close() })
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	rr := reg.Remote()
	env := fmt.Sprintf("%s=%s %s %d", deadWriterEnv, a.Address(), hex.EncodeToString(rr.Key), rr.Len)
	freed := 0
	for range 61 { // 60 slots, then one writer more
		child := rdmatest.StartChild(t, "TestDeadWriterChild", env)
		child.Expect(t, heldLine)
		if err := child.Process().Kill(); err != nil {
			t.Fatal(err)
		}
		child.Reap(t)
		freed += a.ReclaimDead()
	}
	if freed != 61 {
		t.Errorf("ReclaimDead freed %d slots of 61 dead writers", freed)
	}
	if err := a.Deregister(reg); err != nil {
		t.Fatalf("Deregister after 61 writers were killed with a batch in flight, each reclaimed: %v", err)
	}
}
