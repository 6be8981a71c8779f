package cuda

import (
	"fmt"
	"sync/atomic"
)

// Event is a CUDA event (timing disabled): recorded on a stream, it
// completes once the work enqueued before it has. An event never recorded
// counts as complete.
type Event struct {
	dev    *Device
	h      uintptr
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
	ctx, err := e.context()
	if err != nil {
		return false, err
	}
	return libEventQuery(ctx, e.h)
}

// Synchronize blocks until the event completed. Not for actors: use a
// fence.
func (e *Event) Synchronize() error {
	ctx, err := e.context()
	if err != nil {
		return err
	}
	return libEventSynchronize(ctx, e.h)
}

// Close destroys the event. Idempotent.
func (e *Event) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	ctx, err := e.dev.context()
	if err != nil {
		return err
	}
	return libEventDestroy(ctx, e.h)
}
