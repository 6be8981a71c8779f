package gcfloor

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		floor, live uint64
		want        int
	}{
		{64 * mib, 4 * mib, 1500}, // goal 4 × 16 = 64 MiB
		{64 * mib, 32 * mib, 100}, // 2 × live reaches the floor: GOGC=100
		{64 * mib, 40 * mib, 100}, // above it: GOGC=100
		{64 * mib, 16 * mib, 300}, // goal 16 × 4
		{64 * mib, 0, 6300},       // nothing counted yet: 1 MiB assumed
		{1 << 40, 1, 1 << 20},     // clamped
		{64 * mib, 31 * mib, 106}, // just below
	} {
		if got := percent(c.floor, c.live); got != c.want {
			t.Errorf("percent(floor %d, live %d) = %d, want %d", c.floor, c.live, got, c.want)
		}
		// The goal GOGC gives is the floor, or 2 × live above it.
		if c.live > 0 && c.want < 1<<20 {
			goal := c.live * uint64(100+c.want) / 100
			want := max(c.floor, 2*c.live)
			if goal > want || want-goal > c.live/100+1 {
				t.Errorf("floor %d, live %d: goal %d, want about %d", c.floor, c.live, goal, want)
			}
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
		// The hook set GOGC for a goal of the floor: read it back.
		got := debug.SetGCPercent(100)
		if got <= 100 {
			t.Fatalf("cycle %d: GOGC %d after the hook, want above 100 for a 256 MiB floor on a small heap", i, got)
		}
		debug.SetGCPercent(got)
	}
	Set(1) // later calls change nothing
	if Floor() != 256<<20 {
		t.Fatalf("a second Set changed the floor to %d", Floor())
	}
}
