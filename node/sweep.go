package node

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// regionName is the shared-memory file of a node's pool:
// kvxfer-INSTANCE-PID for rank 0, kvxfer-INSTANCE-PID.RANK for the others.
func regionName(self messages.PeerID, pid int) string {
	if self.Rank == 0 {
		return fmt.Sprintf("kvxfer-%s-%d", self.Instance, pid)
	}
	return fmt.Sprintf("kvxfer-%s-%d.%d", self.Instance, pid, self.Rank)
}

// SweepStale removes the shared-memory pool files of earlier processes of
// instance that are gone (killed before they could remove their own): a
// file named for a process that no longer exists, and that no process
// holds (shm.Held: its maker, in any pid namespace), can have no writer
// left that this process would disturb. It returns how many it removed. Open
// calls it; a supervisor that restarts killed ranks may call it too.
func SweepStale(instance string) (int, error) {
	prefix := "kvxfer-" + instance + "-"
	entries, err := os.ReadDir(shm.Dir())
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range entries {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, ".")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue // another instance's (its name goes on with "-"), or ours
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // alive (or not ours to judge)
		}
		// No process of this pid namespace has that pid, but the file's
		// maker may live in another one that shares the directory (a
		// rank in another container): it holds the file while it maps
		// it, from its creation. Removed under the file's own lock, so
		// that a maker between its creation and its lock makes it again.
		removed, err := shm.RemoveUnheld(name)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		if removed {
			n++
		}
	}
	return n, errors.Join(errs...)
}
