package cuda

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Driver flags the package uses.
const (
	streamNonBlocking       = 0x1 // CU_STREAM_NON_BLOCKING
	eventDisableTiming      = 0x2 // CU_EVENT_DISABLE_TIMING
	ipcLazyEnablePeerAccess = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
)

// Stream is a CUDA stream: work enqueued on it runs in order, asynchronously
// to the host. It does not synchronise with the legacy default stream
// (CU_STREAM_NON_BLOCKING). Enqueueing is safe from any goroutine; the order
// between goroutines is whatever order their calls reach the driver.
type Stream struct {
	dev    *Device
	h      uintptr
	closed atomic.Bool
}

// Copy is one device-to-device copy of Len bytes from Src to Dst.
type Copy struct {
	Dst, Src DevicePtr
	Len      uint64
}

// Copy is laid out as three 64-bit words, as CopyDtoDBatch hands it to C.
var _ [24 - unsafe.Sizeof(Copy{})]byte
var _ [unsafe.Sizeof(Copy{}) - 24]byte

// NewStream creates a non-blocking stream on the device.
func (d *Device) NewStream() (*Stream, error) {
	ctx, err := d.context()
	if err != nil {
		return nil, err
	}
	h, err := libStreamCreate(ctx, streamNonBlocking)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d, err)
	}
	return &Stream{dev: d, h: h}, nil
}

// Device is the stream's device.
func (s *Stream) Device() *Device { return s.dev }

func (s *Stream) context() (uintptr, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("cuda stream of %s: %w", s.dev, ErrClosed)
	}
	return s.dev.context()
}

// CopyDtoD enqueues a copy of n bytes between device addresses.
func (s *Stream) CopyDtoD(dst, src DevicePtr, n uint64) error {
	ctx, err := s.context()
	if err != nil {
		return err
	}
	return libCopyDtoDAsync(ctx, dst, src, n, s.h)
}

// CopyDtoDBatch enqueues every copy in order with one cgo call (copies of
// length 0 are skipped) and returns how many of them it enqueued: all of
// them, or the index of the one that failed with its error.
func (s *Stream) CopyDtoDBatch(copies []Copy) (int, error) {
	ctx, err := s.context()
	if err != nil || len(copies) == 0 {
		return 0, err
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&copies[0])), 3*len(copies))
	return libCopyDtoDBatch(ctx, s.h, words)
}

// CopyHtoD enqueues a copy of src to dst. src must stay allocated and
// unchanged until the copy has completed (a later event on the stream has
// fired); Go memory is pageable, so the driver stages it.
func (s *Stream) CopyHtoD(dst DevicePtr, src []byte) error {
	ctx, err := s.context()
	if err != nil {
		return err
	}
	return libCopyHtoDAsync(ctx, dst, src, s.h)
}

// CopyDtoH enqueues a copy of len(dst) bytes from src into dst. dst must
// not be read or freed until the copy has completed.
func (s *Stream) CopyDtoH(dst []byte, src DevicePtr) error {
	ctx, err := s.context()
	if err != nil {
		return err
	}
	return libCopyDtoHAsync(ctx, dst, src, s.h)
}

// MemsetD8 enqueues setting n bytes of device memory at dst to v.
func (s *Stream) MemsetD8(dst DevicePtr, v byte, n uint64) error {
	ctx, err := s.context()
	if err != nil {
		return err
	}
	return libMemsetD8Async(ctx, dst, v, n, s.h)
}

// Record records ev on the stream: ev completes once everything enqueued
// before it has.
func (s *Stream) Record(ev *Event) error {
	ctx, err := s.context()
	if err != nil {
		return err
	}
	defer ev.lock()()
	if ev.closed.Load() {
		return fmt.Errorf("record: cuda event: %w", ErrClosed)
	}
	return libEventRecord(ctx, ev.h, s.h)
}

// Synchronize blocks until everything enqueued on the stream completed.
// Not for actors: use a fence.
func (s *Stream) Synchronize() error {
	ctx, err := s.context()
	if err != nil {
		return err
	}
	return libStreamSynchronize(ctx, s.h)
}

// Query reports, without blocking, whether everything enqueued completed.
func (s *Stream) Query() (bool, error) {
	ctx, err := s.context()
	if err != nil {
		return false, err
	}
	return libStreamQuery(ctx, s.h)
}

// Close destroys the stream; work already enqueued still completes (CUDA's
// rule). Idempotent: once it is destroyed, later calls return nil. On a
// device closed first nothing is destroyed and every call says ErrClosed.
func (s *Stream) Close() error {
	if s.closed.Load() {
		return nil
	}
	ctx, err := s.dev.context()
	if err != nil {
		return err // not destroyed: a later call says so again
	}
	if s.closed.Swap(true) {
		return nil
	}
	return libStreamDestroy(ctx, s.h)
}
