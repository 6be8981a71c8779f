//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h; x/sys/unix does not name them).
const (
	futexWaitPrivate = 0 | 128 // FUTEX_WAIT | FUTEX_PRIVATE_FLAG
	futexWakePrivate = 1 | 128 // FUTEX_WAKE | FUTEX_PRIVATE_FLAG
)

// napper is what an endpoint's dispatcher sleeps on while batches are
// outstanding: a futex word, 1 while it naps. A nap ends when its time is
// up (the kernel's timer wakes the thread, at no cost to any other) or
// when the progress goroutine, out of work, wakes it early.
//
// Why not a channel: a goroutine parked on one is woken by whoever sends,
// and Go does that with a futex wake of a parked thread, a system call and
// an inter-processor interrupt paid by the sender. Sent by the progress
// goroutine once per round, that costs it about a tenth of a 64 KiB
// stream. Why not a spin: a spinning dispatcher keeps a second CPU busy, so
// every other thread that wakes (the runtime's, the peer's) takes its time
// from the progress thread, and every yield looks for an idle P to start
// an M on, which is often the progress goroutine's own P while it is in a
// cgo call.
type napper struct {
	word atomic.Uint32
}

// nap sleeps for at most d (plus the kernel's timer slack, 50µs by
// default) unless ready reports true once the word is set, or wake is
// called. The goroutine's thread sleeps in a system call: its P is handed
// on if other goroutines need it.
func (n *napper) nap(d time.Duration, ready func() bool) {
	n.word.Store(1)
	if ready() {
		// A wake that looked before the store would have missed it.
		n.word.Store(0)
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	// EINTR, EAGAIN (already woken): as an early end.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&n.word)), futexWaitPrivate,
		1, uintptr(unsafe.Pointer(&ts)), 0, 0)
	n.word.Store(0)
}

// wake ends a nap in progress; a no-op (one load) when there is none.
func (n *napper) wake() {
	if n.word.Load() == 1 && n.word.CompareAndSwap(1, 0) {
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&n.word)), futexWakePrivate,
			1, 0, 0, 0)
	}
}

// currentCPU is the CPU the calling thread runs on, or -1 where getcpu
// is refused (a sandbox).
func currentCPU() int {
	var cpu uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); errno != 0 {
		return -1
	}
	return int(cpu)
}

// moveOff moves the calling thread to another CPU it may run on, if there
// is one, and leaves its affinity as it was. The kernel migrates a thread
// at once when its CPU leaves its mask; restoring the mask does not move
// it back, and the scheduler is free to later.
//
// A dispatcher that naps on the progress thread's CPU preempts it at every
// wake; the kernel places a timer's wakeup on the CPU the sleeper left, so
// the two stay together until load balancing separates them, tens of
// milliseconds (a 64 KiB stream ran at 60% for the first 50ms after a
// pause on a 2-CPU machine).
func moveOff(cpu int) bool {
	runtime.LockOSThread() // both calls on this thread
	defer runtime.UnlockOSThread()
	var orig unix.CPUSet
	if unix.SchedGetaffinity(0, &orig) != nil || !orig.IsSet(cpu) || orig.Count() < 2 {
		return false
	}
	others := orig
	others.Clear(cpu)
	if unix.SchedSetaffinity(0, &others) != nil {
		return false
	}
	return unix.SchedSetaffinity(0, &orig) == nil
}
