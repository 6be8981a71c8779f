package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Event is a CUDA event (timing disabled): recorded on a stream, it
// completes once the work enqueued before it has. An event never recorded
// counts as complete.
//
// An event is either the package's own (NewEvent: Close destroys it) or
// borrowed (BorrowEvent: a handle the caller created and still owns; Close
// only stops the package from touching it, and returns once no driver call
// on it is in flight).
type Event struct {
	dev      *Device
	h        uintptr
	borrowed bool
	// use is held shared across each driver call on a borrowed event and
	// exclusively by its Close, so that after Close no call touches it.
	use    sync.RWMutex
	closed atomic.Bool
}

// NewEvent creates an event on the device.
func (d *Device) NewEvent() (*Event, error) {
	ctx, err := d.context()
	if err != nil {
		return nil, err
	}
	h, err := libEventCreate(ctx, eventDisableTiming)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d, err)
	}
	return &Event{dev: d, h: h}, nil
}

// BorrowEvent wraps a CUevent handle the caller created in the device's
// primary context (the context the CUDA runtime, and so PyTorch, uses): a
// cudaEvent_t is a CUevent. The package queries it and never records or
// destroys it; the caller keeps it alive until the Event is closed. A zero
// handle is refused with an error wrapping ErrBadHandle.
func (d *Device) BorrowEvent(h uintptr) (*Event, error) {
	if h == 0 {
		return nil, fmt.Errorf("%s: CUDA event handle 0: %w", d, ErrBadHandle)
	}
	if _, err := d.context(); err != nil {
		return nil, err
	}
	return &Event{dev: d, h: h, borrowed: true}, nil
}

// Handle is the event's CUevent handle, for a caller that passes it on
// (to another library, or to kvxfer's C ABI as a borrowed event).
func (e *Event) Handle() uintptr { return e.h }

// Borrowed reports whether the event is the caller's (BorrowEvent).
func (e *Event) Borrowed() bool { return e.borrowed }

// lock holds a borrowed event open across one driver call; the returned
// function ends it.
func (e *Event) lock() func() {
	if !e.borrowed {
		return func() {}
	}
	e.use.RLock()
	return e.use.RUnlock
}

func (e *Event) context() (uintptr, error) {
	if e.closed.Load() {
		return 0, fmt.Errorf("cuda event of %s: %w", e.dev, ErrClosed)
	}
	return e.dev.context()
}

// Query reports, without blocking, whether the event completed (one
// cuEventQuery). An error is a failure of the work before it, or of the
// driver.
func (e *Event) Query() (bool, error) {
	defer e.lock()()
	ctx, err := e.context()
	if err != nil {
		return false, err
	}
	return libEventQuery(ctx, e.h)
}

// Synchronize blocks until the event completed. Not for actors: use a
// fence. (A borrowed event's Close waits for it.)
func (e *Event) Synchronize() error {
	defer e.lock()()
	ctx, err := e.context()
	if err != nil {
		return err
	}
	return libEventSynchronize(ctx, e.h)
}

// Close destroys the event, or for a borrowed one waits for a driver call
// on it in flight and leaves it to its owner: after Close the package
// never touches the handle again. Idempotent: once it is closed, later
// calls return nil. An event of the package's own on a device closed first
// is not destroyed, and every call says ErrClosed.
func (e *Event) Close() error {
	if e.borrowed {
		e.use.Lock()
		e.closed.Store(true)
		e.use.Unlock()
		return nil
	}
	if e.closed.Load() {
		return nil
	}
	ctx, err := e.dev.context()
	if err != nil {
		return err // not destroyed: a later call says so again
	}
	if e.closed.Swap(true) {
		return nil
	}
	return libEventDestroy(ctx, e.h)
}
