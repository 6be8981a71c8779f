package proc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvxfer/kvxfer/rdma/shm"
)

// regionName is the shared-memory file of a generation process's pool.
func regionName(instance string, pid int) string { return fmt.Sprintf("kvxfer-%s-%d", instance, pid) }

// SweepStale removes the pool files of earlier generation processes of the
// same instance that are gone (killed before they could remove their own):
// a file named for a process that no longer exists can have no writer left
// that this process would disturb. It returns how many it removed.
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
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(name, prefix))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // alive (or not ours to judge)
		}
		if err := os.Remove(filepath.Join(shm.Dir(), name)); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
