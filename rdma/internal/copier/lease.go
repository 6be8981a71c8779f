package copier

import "sync/atomic"

// Lease is the state of one registration, as one 64-bit word so that it can
// live in shared memory and be updated by several processes: the number of
// accepted batches in flight against the region, whether the registration
// was retired (deregistered), and whether its owner is gone (agent closed).
//
// A sender Acquires before accepting a batch and Releases when the batch
// completes; the owner retires only when no batch is in flight. Because both
// are one compare-and-swap on the same word, a retire and an acquire cannot
// both succeed.
type Lease struct {
	w atomic.Uint64
}

const (
	retiredBit = uint64(1) << 63
	goneBit    = uint64(1) << 62
	countMask  = goneBit - 1
)

// LeaseState is what Acquire found.
type LeaseState uint8

const (
	// Live: the lease was acquired.
	Live LeaseState = iota
	// Retired: the registration was revoked (deregistered); nothing acquired.
	Retired
	// Gone: the registration's owner closed; nothing acquired.
	Gone
)

func (s LeaseState) String() string {
	switch s {
	case Live:
		return "live"
	case Retired:
		return "retired"
	case Gone:
		return "gone"
	}
	return "LeaseState(?)"
}

// Reset sets the lease to live with nothing in flight, or to retired.
func (l *Lease) Reset(retired bool) {
	if retired {
		l.w.Store(retiredBit)
		return
	}
	l.w.Store(0)
}

// Acquire counts one more batch in flight, unless the lease is retired or
// gone.
func (l *Lease) Acquire() LeaseState {
	for {
		w := l.w.Load()
		switch {
		case w&goneBit != 0:
			return Gone
		case w&retiredBit != 0:
			return Retired
		}
		if l.w.CompareAndSwap(w, w+1) {
			return Live
		}
	}
}

// Release counts one batch in flight fewer.
func (l *Lease) Release() { l.w.Add(^uint64(0)) }

// ReleaseN counts n batches in flight fewer: those of a writer proven dead
// (ReclaimDead), which n must not exceed.
func (l *Lease) ReleaseN(n uint64) { l.w.Add(-n) }

// TryRetire retires a live lease with nothing in flight and reports whether
// it did.
func (l *Lease) TryRetire() bool { return l.w.CompareAndSwap(0, retiredBit) }

// ForceRetire retires the lease whatever is in flight; with gone it also
// marks the owner gone. Batches in flight still Release.
func (l *Lease) ForceRetire(gone bool) {
	bits := retiredBit
	if gone {
		bits |= goneBit
	}
	l.w.Or(bits)
}

// Renew makes a retired lease live again, keeping the in-flight count.
func (l *Lease) Renew() { l.w.And(countMask) }

// InFlight is the number of batches in flight.
func (l *Lease) InFlight() uint64 { return l.w.Load() & countMask }

// State is the lease's state without acquiring it.
func (l *Lease) State() LeaseState {
	w := l.w.Load()
	switch {
	case w&goneBit != 0:
		return Gone
	case w&retiredBit != 0:
		return Retired
	}
	return Live
}
