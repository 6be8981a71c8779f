package copier

import "sync/atomic"

// Slot tag bits; the pid is above them.
const (
	slotClaiming = 1 << iota
	slotHeld
	slotReclaim
	slotAbandon
	slotPIDShift = 8
)

// WriterSlot is one writer process's count of its batches under a shared
// Lease (see "Writer slots" in the package doc). It lives in shared memory, beside the
// Lease; its zero value is a free slot. A nil *WriterSlot is valid: the
// writer then counts in the shared word only.
type WriterSlot struct {
	tag    atomic.Uint64
	count  atomic.Uint64
	start  atomic.Uint64
	pidNS  atomic.Uint64
	timeNS atomic.Uint64
	nsDev  atomic.Uint64
	_      [2]uint64 // one slot per 64-byte cache line: writers do not share lines
}

// ClaimSlot claims a free slot of slots for the writer id and returns it,
// or nil when none is free (the writer then counts in the shared word
// only). Call it once per writer and table; give the slot back with Free.
func ClaimSlot(slots []WriterSlot, id ProcessID) *WriterSlot {
	if id.PID == 0 {
		return nil
	}
	for i := range slots {
		s := &slots[i]
		if s.tag.Load() != 0 || !s.tag.CompareAndSwap(0, id.tag(slotClaiming)) {
			continue
		}
		s.start.Store(id.Start)
		s.pidNS.Store(id.PIDNS)
		s.timeNS.Store(id.TimeNS)
		s.nsDev.Store(id.NSDev)
		s.count.Store(0) // a freed slot's count is 0 already; nothing counts in a claiming one
		s.tag.Store(id.tag(slotHeld))
		return s
	}
	return nil
}

// Acquire acquires l (Lease.Acquire) and, when live, counts the batch in s
// too, after l.
func (s *WriterSlot) Acquire(l *Lease) LeaseState {
	st := l.Acquire()
	if st == Live && s != nil {
		// A death here leaves the batch in l only: busy, never freed early.
		s.count.Add(1)
	}
	return st
}

// Release uncounts a batch that Acquire counted: from s first, then l.
func (s *WriterSlot) Release(l *Lease) {
	if s != nil {
		s.count.Add(^uint64(0))
	}
	l.Release()
}

// InFlight is the number of batches counted in s.
func (s *WriterSlot) InFlight() uint64 { return s.count.Load() }

// Free gives the slot back, when its count is 0, and reports whether it
// did; a slot with batches counted stays held (its owner reclaims it once
// the writer is dead). Only the writer that claimed s calls it, with none
// of its batches being acquired or released meanwhile. Nil-safe.
func (s *WriterSlot) Free() bool {
	if s == nil || s.count.Load() != 0 {
		return false
	}
	for {
		t := s.tag.Load()
		switch {
		case t&slotHeld == 0 || t&slotAbandon != 0:
			return false // not held: cannot happen for the writer that claimed it
		case t&slotReclaim != 0: // the owner is checking it: leave it to the owner
			if s.tag.CompareAndSwap(t, t|slotAbandon) {
				return true
			}
		default:
			if s.tag.CompareAndSwap(t, 0) {
				return true
			}
		}
	}
}

// id is the identity of a held slot's writer; read it only with the slot
// locked (slotReclaim), see "Who changes a slot".
func (s *WriterSlot) id(tag uint64) ProcessID {
	return ProcessID{PID: uint32(tag >> slotPIDShift), Start: s.start.Load(), PIDNS: s.pidNS.Load(),
		TimeNS: s.timeNS.Load(), NSDev: s.nsDev.Load()}
}

// Reclaimed is what ReclaimDead did.
type Reclaimed struct {
	Slots   int    // slots of dead writers freed
	Batches uint64 // their batches released from the lease
	Held    int    // slots still held (live writers, or not proven dead)
}

// ReclaimDead frees the slots of slots whose writers dead proves dead, and
// releases the batches they counted from l, the lease they count under.
// Only the lease's owner calls it, one call at a time per table, and dead
// must be a proof (ProvenDead), never a guess: a live writer's batches
// released here would let the owner reuse memory it still writes.
func ReclaimDead(slots []WriterSlot, l *Lease, dead func(ProcessID) bool) Reclaimed {
	var r Reclaimed
	for i := range slots {
		s := &slots[i]
		t := s.tag.Load()
		if t&slotHeld == 0 || t&(slotReclaim|slotAbandon) != 0 {
			// Free or claiming (see "Who changes a slot"); r or a set
			// at the start of a call: left by an owner that stopped
			// mid-check, which no live owner sees.
			continue
		}
		if !s.tag.CompareAndSwap(t, t|slotReclaim) {
			r.Held++ // changed under us: freed or claimed again; looked at next time
			continue
		}
		if dead(s.id(t)) {
			// The writer can no longer count: n is at most its share of l.
			n := s.count.Load()
			if n > 0 {
				l.ReleaseN(n)
			}
			s.count.Store(0)
			s.tag.Store(0)
			r.Slots++
			r.Batches += n
			continue
		}
		if !s.tag.CompareAndSwap(t|slotReclaim, t) {
			// Abandoned meanwhile by its live writer, with count 0.
			s.tag.Store(0)
			continue
		}
		r.Held++
	}
	return r
}

// ProcessID names a process of this host so that "it is dead" can be
// proven: its pid in its pid namespace, its start time, and its pid and
// time namespaces (a pid means something only in its namespace; the start
// time /proc shows depends on the reader's time namespace).
//
// A process keeps its pid, and its start time, until it is reaped. So when
// no process has the pid, or one with another start time has it, the
// process was reaped; and when the one that has it (same start time) is a
// zombie with no thread left, the process is dead, whether or not that
// zombie is it. None of this needs start times to be unique: a pid reused
// within the clock tick of the start time would be taken for the process
// itself, alive — the safe side.
type ProcessID struct {
	PID    uint32 // in the pid namespace PIDNS
	Start  uint64 // field 22 of /proc/<pid>/stat, in clock ticks after boot as TimeNS shows it
	PIDNS  uint64 // inode of /proc/self/ns/pid
	TimeNS uint64 // inode of /proc/self/ns/time; 0 where the kernel has no time namespaces
	NSDev  uint64 // device of the namespace file system both inodes are on
}

func (id ProcessID) tag(state uint64) uint64 { return uint64(id.PID)<<slotPIDShift | state }

// sameNamespaces reports whether id's pid and start time mean the same to
// a process self.
func (id ProcessID) sameNamespaces(self ProcessID) bool {
	return id.PIDNS == self.PIDNS && id.TimeNS == self.TimeNS && id.NSDev == self.NSDev
}
