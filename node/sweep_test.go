package node_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// noSuchPid is a pid no process of this pid namespace can have (past
// pid_max): to this process, the file's maker is gone.
func noSuchPid(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Skipf("pid_max: %v", err)
	}
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return max + 1
}

// TestSweepStaleSparesAHeldPool: a pool file named for a pid that no
// process here has is stale only if no process holds it. Its maker may
// live in another pid namespace that shares the directory (a rank in
// another container), where the pid in its name means nothing here: that
// live pool must not be removed (its writers could map it no more). A
// file nobody holds (its maker killed) is removed as before. Before the
// fix, SweepStale removed both.
func TestSweepStaleSparesAHeldPool(t *testing.T) {
	inst := fmt.Sprintf("sweep%d", os.Getpid())
	pid := noSuchPid(t)
	held := fmt.Sprintf("kvxfer-%s-%d", inst, pid)
	stale := fmt.Sprintf("kvxfer-%s-%d.1", inst, pid)

	// Held: made by NewRegion, as the other namespace's rank does.
	_, closer, err := shm.NewRegion(held, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	// Stale: a region file whose maker died (nothing maps it).
	f, err := os.OpenFile(filepath.Join(shm.Dir(), stale), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	defer os.Remove(filepath.Join(shm.Dir(), stale))

	n, err := node.SweepStale(inst)
	if err != nil {
		t.Fatalf("SweepStale: %v", err)
	}
	if _, err := os.Stat(filepath.Join(shm.Dir(), held)); err != nil {
		t.Errorf("the pool file its maker still maps: %v after SweepStale, want it left", err)
	}
	if _, err := os.Stat(filepath.Join(shm.Dir(), stale)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pool file nobody holds: Stat %v after SweepStale, want it removed", err)
	}
	if n != 1 {
		t.Errorf("SweepStale removed %d files, want 1", n)
	}
	if ok, err := shm.Held(held); !ok || err != nil {
		t.Errorf("shm.Held of a region this process maps: %v, %v; want true", ok, err)
	}
	if err := closer.Close(); err != nil {
		t.Fatal(err)
	}
}
