package copier

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"unsafe"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// A memory fault is an access to a mapped address with no page behind it:
// typically a shared file truncated by another process under our mapping
// (SIGBUS). By default the Go runtime kills the whole process for it
// ("unexpected fault address"). On a goroutine that set
// runtime/debug.SetPanicOnFault it panics instead, with a runtime.Error
// that has an Addr() uintptr method, and the goroutine can recover and go
// on (cmd/go reads its mmap'd module index this way). See the package doc
// for where the copier does.

// PeerMemory is a mapping of memory that a peer process owns and can take
// away under us, such as its region file (which it may truncate): one per
// mapping, shared by every job that writes into it. A fault inside it fails
// the job with rdma.ErrPeerGone instead of killing this process, and marks
// the mapping gone: later jobs into it fail the same way without touching
// it. Safe for concurrent use.
type PeerMemory struct {
	name   string  // for errors, e.g. "region file /dev/shm/x"
	lo, hi uintptr // the mapping's addresses [lo, hi)
	fault  atomic.Uintptr
}

// NewPeerMemory describes the mapping mem; name says what it is in errors.
func NewPeerMemory(name string, mem []byte) *PeerMemory {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return &PeerMemory{name: name, lo: lo, hi: lo + uintptr(len(mem))}
}

// Contains reports whether addr lies in the mapping.
func (p *PeerMemory) Contains(addr uintptr) bool { return addr >= p.lo && addr < p.hi }

// MarkFaulted records a fault at addr; the first one is kept.
func (p *PeerMemory) MarkFaulted(addr uintptr) {
	if addr == 0 { // no fault has this address; 0 would read as live
		addr = p.lo
	}
	p.fault.CompareAndSwap(0, addr)
}

// Err is nil while no access to the mapping faulted, then an error wrapping
// rdma.ErrPeerGone that names the mapping and the faulting address.
func (p *PeerMemory) Err() error {
	addr := p.fault.Load()
	if addr == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s faulted at %#x (offset %d of the mapping): its owner truncated or unmapped it under us",
		rdma.ErrPeerGone, p.name, addr, addr-p.lo)
}

// CatchFault calls f on the calling goroutine with memory faults turned
// into panics, and recovers a fault: it returns the faulting address and
// true. Any other panic propagates. The goroutine's own SetPanicOnFault
// setting is restored.
func CatchFault(f func()) (addr uintptr, faulted bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			addr = faultAddr(r)
			faulted = true
		}
	}()
	f()
	return 0, false
}

// faultAddr returns the address of the memory fault that a recovered panic
// value r reports, and re-panics with r if r is not a memory fault.
func faultAddr(r any) uintptr {
	if e, ok := r.(runtime.Error); ok {
		if a, ok := e.(interface{ Addr() uintptr }); ok {
			return a.Addr()
		}
	}
	panic(r)
}

// faultErr is the error of job j whose segment i faulted at addr, naming
// the side that faulted. A fault in j.Peer marks it gone.
func (c *Copier) faultErr(j *Job, i int, addr uintptr) error {
	var err error
	switch {
	case j.Peer != nil && j.Peer.Contains(addr):
		j.Peer.MarkFaulted(addr)
		err = fmt.Errorf("%s: %w", c.name, j.Peer.Err())
	case within(addr, j.Src):
		err = fmt.Errorf("%s: %w: the source memory faulted at %#x (offset %d): the file behind it was truncated?",
			c.name, kvcache.ErrBadRegion, addr, addr-base(j.Src))
	case within(addr, j.Dst):
		err = fmt.Errorf("%s: %w: the destination memory faulted at %#x (offset %d): the file behind it was truncated?",
			c.name, kvcache.ErrBadRegion, addr, addr-base(j.Dst))
	default:
		err = fmt.Errorf("%s: %w: memory fault at %#x, outside the source and the destination", c.name, kvcache.ErrBadRegion, addr)
	}
	if i < len(j.Segs) {
		return &rdma.SegmentError{Index: i, Segment: j.Segs[i], Err: err}
	}
	return err
}

func base(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func within(addr uintptr, b []byte) bool { return addr-base(b) < uintptr(len(b)) }
