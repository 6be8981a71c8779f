//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// napEnds runs a nap on another goroutine and reports whether it ended
// before limit; poke, if set, is called until it does.
func napEnds(t *testing.T, n *napper, d time.Duration, ready func() bool, poke func(), limit time.Duration) bool {
	t.Helper()
	done := make(chan struct{})
	go func() {
		n.nap(d, ready)
		close(done)
	}()
	deadline := time.After(limit)
	for {
		select {
		case <-done:
			if w := n.word.Load(); w != 0 {
				t.Errorf("word after the nap = %d, want 0", w)
			}
			return true
		case <-deadline:
			return false
		default:
		}
		if poke != nil {
			poke()
		}
		runtime.Gosched()
	}
}

func TestNapperWakeEndsNap(t *testing.T) {
	var n napper
	// An hour's nap that only wake can end within the test's limit.
	if !napEnds(t, &n, time.Hour, func() bool { return false }, n.wake, 30*time.Second) {
		t.Fatal("wake did not end the nap")
	}
}

func TestNapperReadySkipsNap(t *testing.T) {
	var n napper
	if !napEnds(t, &n, time.Hour, func() bool { return true }, nil, 30*time.Second) {
		t.Fatal("a nap whose condition already held slept")
	}
}

func TestNapperTimesOut(t *testing.T) {
	var n napper
	if !napEnds(t, &n, time.Millisecond, func() bool { return false }, nil, 30*time.Second) {
		t.Fatal("a 1ms nap did not end")
	}
}

func TestNapperWakeWithoutNapIsNoop(t *testing.T) {
	var n napper
	n.wake()
	if w := n.word.Load(); w != 0 {
		t.Fatalf("word = %d after a wake with no nap", w)
	}
}

// The progress goroutine lists each signalled endpoint once per idle
// point, and wakeNappers ends their naps and starts a new list.
func TestWakeNappersBookkeeping(t *testing.T) {
	w := &worker{round: 1, idleRound: 1}
	a, b := &endpoint{wake: make(chan struct{}, 1)}, &endpoint{wake: make(chan struct{}, 1)}
	for range 2 { // two rounds before an idle point
		w.touch(a)
		w.touch(b)
		w.signalTouched()
	}
	if len(w.napping) != 2 || w.napping[0] != a || w.napping[1] != b {
		t.Fatalf("napping = %v, want [a b] once each", w.napping)
	}
	a.napper.word.Store(1) // a naps; b does not
	w.wakeNappers()
	if got := a.napper.word.Load(); got != 0 {
		t.Errorf("a's nap word = %d after wakeNappers, want 0", got)
	}
	if len(w.napping) != 0 {
		t.Errorf("napping = %v after wakeNappers, want empty", w.napping)
	}
	w.touch(a)
	w.signalTouched()
	if len(w.napping) != 1 || w.napping[0] != a {
		t.Errorf("after the idle point, napping = %v, want [a]", w.napping)
	}
}

func TestMoveOff(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	cpu := currentCPU()
	if before.Count() < 2 {
		if moveOff(cpu) {
			t.Fatal("moveOff reported a move with one CPU allowed")
		}
		t.Skip("one CPU allowed: nowhere to move")
	}
	if err := unix.SchedSetaffinity(0, &before); err != nil {
		t.Skipf("this sandbox refuses sched_setaffinity: %v", err)
	}
	if !moveOff(cpu) {
		t.Fatalf("moveOff(%d) failed with CPUs %v allowed", cpu, before)
	}
	if now := currentCPU(); now == cpu {
		t.Errorf("still on CPU %d after moveOff", cpu)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("affinity %v after moveOff, was %v", after, before)
	}
}

// TestProgressCPUs: WithProgressCPUs pins the progress thread (it polls on
// the CPU given, and only there); a CPU out of range is refused by New.
func TestProgressCPUs(t *testing.T) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	if err := unix.SchedSetaffinity(0, &allowed); err != nil {
		t.Skipf("this sandbox refuses sched_setaffinity: %v", err)
	}
	cpu := -1
	for c := range cpuSetSize {
		if allowed.IsSet(c) {
			cpu = c // the last allowed CPU: not always the one New runs on
		}
	}
	a, err := New(WithProgressCPUs(cpu))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var got unix.CPUSet
	if err := unix.SchedGetaffinity(a.w.tid, &got); err != nil {
		t.Fatal(err)
	}
	if got.Count() != 1 || !got.IsSet(cpu) {
		t.Fatalf("progress thread's affinity %v, want CPU %d alone", got, cpu)
	}
	// The progress thread records its CPU on every poll; make it poll.
	deadline := time.Now().Add(30 * time.Second)
	for a.w.progressCPU() == -1 && time.Now().Before(deadline) {
		if _, c, err := a.Alloc(4096); err == nil {
			c.Close()
		}
	}
	if got := a.w.progressCPU(); got != cpu {
		t.Fatalf("progress thread polled on CPU %d, pinned to %d", got, cpu)
	}
	for _, bad := range []int{-1, cpuSetSize} {
		if b, err := New(WithProgressCPUs(bad)); err == nil {
			b.Close()
			t.Errorf("WithProgressCPUs(%d) accepted", bad)
		}
	}
}
