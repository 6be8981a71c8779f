package copier

import "github.com/kvxfer/kvxfer/kvcache"

// Job is one accepted batch as the copier runs it: copy every segment from
// Src to Dst (whole regions; segment offsets are relative to them), release
// the leases, then call Done.
type Job struct {
	Src, Dst []byte
	Segs     []kvcache.Segment
	// Done gets the outcome; nil is allowed.
	Done func(err error)
	// Leases are released (nil entries skipped) just before Done is called,
	// so that a region is free again by the time its batch is reported.
	Leases [2]*Lease
	// Slots are this process's writer slots of the Leases (nil: none),
	// each released with its lease, first (WriterSlot.Release).
	Slots [2]*WriterSlot
	// Peer, when not nil, is the peer-owned mapping that Dst (and possibly
	// a lease) lies in. A job whose Peer is already gone fails with its
	// error without copying; a fault inside Peer marks it gone.
	Peer *PeerMemory

	flush bool // a Flush marker: no copy, Done(nil) in its place in order
}

// complete releases j's leases from index from on, then calls Done with
// err. For a job into peer memory each release is fault-guarded: a lease
// that faults (it lies in a file truncated under us) is left as it is, and
// the fault is reported if err is nil (in the Peer, it marks it gone).
func (c *Copier) complete(j *Job, from int, err error) {
	for i := from; i < len(j.Leases); i++ {
		l, s := j.Leases[i], j.Slots[i]
		switch {
		case l == nil:
		case j.Peer == nil:
			s.Release(l)
		default:
			if addr, faulted := release(s, l); faulted {
				if ferr := c.faultErr(j, len(j.Segs), addr); err == nil {
					err = ferr
				}
			}
		}
	}
	if j.Done != nil {
		j.Done(err)
	}
}

// release releases l and its slot s on the copier's goroutine (panic on
// fault set) and recovers a fault.
func release(s *WriterSlot, l *Lease) (addr uintptr, faulted bool) {
	defer func() {
		if r := recover(); r != nil {
			addr, faulted = faultAddr(r), true
		}
	}()
	s.Release(l)
	return 0, false
}
