package kvcache

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// MemKind says where a region's memory lives.
type MemKind uint8

const (
	// HostMem is CPU-addressable memory.
	HostMem MemKind = iota
	// DeviceMem is GPU memory; Bytes() is nil for it.
	DeviceMem
)

func (k MemKind) String() string {
	switch k {
	case HostMem:
		return "host"
	case DeviceMem:
		return "device"
	}
	return fmt.Sprintf("MemKind(%d)", uint8(k))
}

// Region is one contiguous span of memory that a pool carves into blocks and
// that the data plane registers. Offsets in Segments are relative to Base.
type Region struct {
	// Base is the address of the first byte.
	Base uintptr
	// Len is the size in bytes.
	Len uint64
	// Kind says whether the memory is host or device memory.
	Kind MemKind
	// Device is the GPU ordinal for DeviceMem.
	Device int

	buf     []byte       // the memory backing a host region (keeps it alive)
	release func() error // unmaps memory this package mapped; nil otherwise
	// closed is set by Close or MarkClosed before the memory goes: Bytes,
	// which may run on other goroutines (Engine.Block), returns nil from
	// then on.
	closed atomic.Bool
}

// MaxHostRegion is the largest host region NewHostRegion allocates (64 TiB,
// beyond any host's memory).
const MaxHostRegion = 1 << 46

// NewHostRegion allocates a zeroed host region of n bytes, owned by the
// region: on Linux an anonymous mapping outside the Go heap, whatever its
// size (its address may be handed to C, which writes into it), unmapped by
// Close. A length of 0 or above 64 TiB, or one the kernel refuses to map,
// is an error wrapping ErrBadRegion.
func NewHostRegion(n uint64) (*Region, error) {
	if n == 0 {
		return nil, fmt.Errorf("%w: region length 0", ErrBadRegion)
	}
	buf, release, err := allocHost(n)
	if err != nil {
		return nil, err
	}
	return &Region{Base: uintptr(unsafe.Pointer(&buf[0])), Len: n, Kind: HostMem, buf: buf, release: release}, nil
}

// Close releases memory the region allocated itself (host regions are
// mapped directly) and marks every region closed (MarkClosed): Bytes is nil
// from then on. The region must not be used afterwards, and nothing may
// still write into it: its owner (an engine) closes it only after every
// writer is quiescent. Idempotent.
func (r *Region) Close() error {
	r.MarkClosed()
	if r.release == nil {
		return nil
	}
	f := r.release
	r.release = nil
	return f()
}

// MarkClosed withdraws the region's bytes without releasing anything:
// Bytes returns nil from then on. The owner of memory the region only
// wraps (a shared-memory file, a UCX allocation) calls it before it frees
// that memory, so that accessors over the region (Engine.Block) stop
// handing out slices of memory about to be unmapped. Idempotent.
func (r *Region) MarkClosed() { r.closed.Store(true) }

// ExternalHostRegion wraps host memory allocated elsewhere (a serving
// framework, a pinned-memory allocator, a shared-memory mapping). The caller
// keeps it alive and mapped for the region's whole life. A length of 0 or
// above 64 TiB, or one that runs past the end of the address space, is an
// error wrapping ErrBadRegion.
func ExternalHostRegion(p unsafe.Pointer, n uint64) (*Region, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: base address 0", ErrBadRegion)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: region length 0", ErrBadRegion)
	}
	if n > MaxHostRegion {
		return nil, fmt.Errorf("%w: region length %d: more than %d bytes", ErrBadRegion, n, uint64(MaxHostRegion))
	}
	if base := uint64(uintptr(p)); base+n < base || base+n-1 > uint64(^uintptr(0)) {
		return nil, fmt.Errorf("%w: region length %d at address %#x runs past the end of the address space", ErrBadRegion, n, base)
	}
	return &Region{Base: uintptr(p), Len: n, Kind: HostMem, buf: unsafe.Slice((*byte)(p), n)}, nil
}

// ExternalDeviceRegion wraps GPU memory (a device pointer, not addressable
// by the CPU) allocated elsewhere, for example by the cuda package.
func ExternalDeviceRegion(base uintptr, n uint64, device int) (*Region, error) {
	if base == 0 {
		return nil, fmt.Errorf("%w: base address 0", ErrBadRegion)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: region length 0", ErrBadRegion)
	}
	if device < 0 {
		return nil, fmt.Errorf("%w: device %d", ErrBadRegion, device)
	}
	return &Region{Base: base, Len: n, Kind: DeviceMem, Device: device}, nil
}

// HostBytesRegion wraps an existing host byte slice (for example an mmap'd
// shared-memory file) without copying it.
func HostBytesRegion(b []byte) (*Region, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: region length 0", ErrBadRegion)
	}
	return &Region{Base: uintptr(unsafe.Pointer(&b[0])), Len: uint64(len(b)), Kind: HostMem, buf: b}, nil
}

// Bytes returns the region as a byte slice, or nil for device memory.
func (r *Region) Bytes() []byte {
	if r.Kind != HostMem || r.closed.Load() {
		return nil
	}
	return r.buf
}

// Contains reports whether [off, off+n) lies inside the region.
func (r *Region) Contains(off, n uint64) bool {
	return off <= r.Len && n <= r.Len-off
}
