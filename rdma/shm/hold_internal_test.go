//go:build linux

package shm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSweepWhileTheMakerCreatesLeavesItsFile: a sweep of stale files by a
// process of another pid namespace (to which the maker's pid names no
// process) may look at a region file between its creation and the
// maker's lock on it. The file must not be lost: it is made, and held,
// at its name once NewRegion returns, and Held says so. Before, the lock
// came only after the file was sized and reserved (fallocate of the
// whole pool, a long window), the sweep removed the file then, and the
// maker went on with an unlinked file that no writer could open.
func TestSweepWhileTheMakerCreatesLeavesItsFile(t *testing.T) {
	sweeps := map[string]func(path string) error{
		// What a sweeper that finds the file unheld does: check, then
		// remove (node.SweepStale before RemoveUnheld).
		"Held then Remove": func(path string) error {
			if held, err := Held(filepath.Base(path)); err != nil || held {
				return err
			}
			return os.Remove(path)
		},
		"RemoveUnheld": func(path string) error {
			_, err := RemoveUnheld(filepath.Base(path))
			return err
		},
	}
	for how, sweep := range sweeps {
		t.Run(how, func(t *testing.T) {
			name := "kvxfer-sweeprace-" + randomSuffix(t)
			swept := 0
			testHookBeforeHold = func(path string) {
				if swept > 0 {
					return
				}
				swept++
				if err := sweep(path); err != nil {
					t.Errorf("sweep: %v", err)
				}
			}
			defer func() { testHookBeforeHold = nil }()
			r, c, err := NewRegion(name, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if swept == 0 {
				t.Fatal("the hook did not run")
			}
			if _, err := os.Stat(filepath.Join(Dir(), name)); err != nil {
				t.Fatalf("the region file after a sweep raced its creation: %v (the maker maps a file no writer can open)", err)
			}
			if held, err := Held(name); !held || err != nil {
				t.Errorf("Held(%s) of the region just made: %v, %v; want true", name, held, err)
			}
			if removed, err := RemoveUnheld(name); removed || err != nil {
				t.Errorf("RemoveUnheld(%s) of a held region: %v, %v; want false, nil", name, removed, err)
			}
			if r.Len != 1<<20 {
				t.Errorf("region of %d bytes, want %d", r.Len, 1<<20)
			}
		})
	}
}

func randomSuffix(t *testing.T) string {
	f, err := os.CreateTemp("", "sfx")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	return filepath.Base(f.Name())
}
