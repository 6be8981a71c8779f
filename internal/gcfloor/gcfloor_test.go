package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"syscall"
	"testing"

	"github.com/kvxfer/kvxfer/internal/meminfo"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	// The runtime's goal at GOGC=p (runtime/mgcpacer.go).
	goal := func(p int, live, roots uint64) uint64 {
		return max(live+(live+roots)*uint64(p)/100, heapMinimum*uint64(p)/100)
	}
	for _, c := range []struct {
		floor, live, roots uint64
		base               bool // the floor is below the base goal: GOGC=100
	}{
		{64 * mib, 0, 0, false},       // before the first cycle: the minimum alone
		{64 * mib, 1 * mib, 0, false}, // a small heap: the minimum bounds it
		{64 * mib, 3 * mib, 512 << 10, false},
		{64 * mib, 4 * mib, 0, false},
		{64 * mib, 16 * mib, 1 * mib, false},
		{64 * mib, 31 * mib, 0, false},
		{64 * mib, 32 * mib, 0, true}, // 2 × live reaches the floor
		{64 * mib, 40 * mib, 1 * mib, true},
		{128 * mib, 2 * mib, 256 << 10, false},
		{1 * mib, 0, 0, true}, // a floor below the runtime's own minimum
	} {
		p := percent(c.floor, c.live, c.roots)
		g := goal(p, c.live, c.roots)
		switch {
		case c.base && p != basePercent:
			t.Errorf("floor %d, live %d: GOGC %d, want %d", c.floor, c.live, p, basePercent)
		case !c.base && (g > c.floor || c.floor-g > c.floor/50):
			t.Errorf("floor %d, live %d, roots %d: GOGC %d gives a goal of %d, want within 2%% below the floor", c.floor, c.live, c.roots, p, g)
		}
	}
}

// TestFromEnv: the variable's mistakes are named with the value; off and
// a GOGC of the owner's set nothing. (No case here calls Set: it is once
// per process, and TestSetRetunesAfterEachCycle owns it.)
func TestFromEnv(t *testing.T) {
	t.Setenv(Env, "64 elephants")
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), `KVXFER_GC_FLOOR="64 elephants"`) {
		t.Fatalf("bad value: err %v, want it named", err)
	}
	// Past the memory available: named, not set (Warm would make it
	// resident and the process end out of memory, naming nothing).
	if _, ok := meminfo.Available(); ok {
		t.Setenv(Env, "100000GiB")
		if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), `KVXFER_GC_FLOOR="100000GiB": more than the `) {
			t.Fatalf("a floor past the memory available: err %v, want it named", err)
		}
	}
	t.Setenv(Env, "off")
	if n, err := FromEnv(); n != 0 || err != nil {
		t.Fatalf("off: %d %v, want 0 nil", n, err)
	}
	t.Setenv(Env, "128MiB")
	t.Setenv("GOGC", "200")
	if n, err := FromEnv(); n != 0 || err != nil {
		t.Fatalf("GOGC set: %d %v, want nothing set", n, err)
	}
	if Floor() != 0 {
		t.Fatalf("a floor was set: %d", Floor())
	}
}

// TestSetRetunesAfterEachCycle: after Set, each collection runs the hook,
// which puts GOGC back to the floor's pace.
func TestSetRetunesAfterEachCycle(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	Set(256 << 20)
	if Floor() != 256<<20 {
		t.Fatalf("Floor %d after Set", Floor())
	}
	for i := 0; i < 3; i++ {
		before := cycle.Load()
		debug.SetGCPercent(100) // what the hook must undo
		// The sentinel armed before this collection is found unreachable
		// by it; its finalizer runs after. Poll, with a bound.
		for tries := 0; cycle.Load() == before; tries++ {
			if tries == 1000 {
				t.Fatalf("cycle %d: the hook never ran", i)
			}
			runtime.GC()
			runtime.Gosched()
		}
		// The hook set GOGC for a goal of the floor: the runtime's own
		// goal says so (this test's heap is a few MB).
		goal := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
		metrics.Read(goal)
		if g := goal[0].Value.Uint64(); g > 256<<20 || g < 240<<20 {
			t.Fatalf("cycle %d: the runtime's heap goal is %d MiB after the hook, want the 256 MiB floor (GOGC %d)",
				i, g>>20, debug.SetGCPercent(-1))
		}
	}
	Set(1) // later calls change nothing
	if Floor() != 256<<20 {
		t.Fatalf("a second Set changed the floor to %d", Floor())
	}
}

// TestWarmFaultsTheHeapInAhead: objects allocated after warm land in pages
// already resident. The same allocation on fresh heap, just before in this
// process, is the calibration: it pays a minor fault per page.
func TestWarmFaultsTheHeapInAhead(t *testing.T) {
	if raceOn {
		t.Skip("the race detector's shadow memory faults in with every page written")
	}
	// No collection of the test's own: the first batch stays in use and
	// the warmed pages stay free until the second batch takes them (the
	// hook of a floor set by another test keeps a goal of 256 MiB, above
	// all of this).
	old := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(old)
	const batch = 32 << 20
	type obj struct {
		_ *obj // a pointer: the engine's garbage is of spans with heap bits
		_ [56]byte
	}
	faults := func() int64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return ru.Minflt
	}
	alloc := func() ([]*obj, int64) {
		f0 := faults()
		objs := make([]*obj, batch/64)
		for i := range objs {
			objs[i] = &obj{}
		}
		return objs, faults() - f0
	}
	pages := int64(batch / pageSize)
	first, fresh := alloc()
	if fresh < pages/2 {
		t.Skipf("%d minor faults for %d pages of fresh heap: this kernel faults the heap in larger pages, nothing to measure", fresh, pages)
	}
	warm(2 * batch)
	second, warmed := alloc()
	if warmed > fresh/4 {
		t.Fatalf("%d minor faults for %d MiB of objects after warm, %d before it: the warmed pages were not reused", warmed, batch>>20, fresh)
	}
	t.Logf("minor faults for %d MiB of small objects: %d on fresh heap, %d after warm", batch>>20, fresh, warmed)
	runtime.KeepAlive(first)
	runtime.KeepAlive(second)
}
