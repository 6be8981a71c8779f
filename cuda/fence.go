package cuda

import (
	"context"
	"fmt"
	"sync"
)

// Fence says when a producer's writes are done: OnReady calls f exactly
// once, from any goroutine, with nil or the producer's error. It is the
// shape of the engine's fence (actors.Fence), which both fences here
// satisfy.
type Fence interface {
	OnReady(f func(err error))
}

var (
	_ Fence = (*EventFence)(nil)
	_ Fence = (*HostFence)(nil)
	_ Fence = (*BorrowedFence)(nil)
)

// signal is the fired-once state both fences share.
type signal struct {
	mu    sync.Mutex
	fired bool
	err   error
	cbs   []func(error)
	done  chan struct{} // closed when fired; made on demand by Wait
}

func (s *signal) onReady(f func(error)) {
	s.mu.Lock()
	if s.fired {
		err := s.err
		s.mu.Unlock()
		f(err)
		return
	}
	s.cbs = append(s.cbs, f)
	s.mu.Unlock()
}

// fire fires once; later calls do nothing. Callbacks run on the caller.
func (s *signal) fire(err error) {
	s.mu.Lock()
	if s.fired {
		s.mu.Unlock()
		return
	}
	s.fired, s.err = true, err
	cbs := s.cbs
	s.cbs = nil
	if s.done != nil {
		close(s.done)
	}
	s.mu.Unlock()
	for _, f := range cbs {
		f(err)
	}
}

func (s *signal) wait(ctx context.Context) error {
	s.mu.Lock()
	if s.fired {
		err := s.err
		s.mu.Unlock()
		return err
	}
	if s.done == nil {
		s.done = make(chan struct{})
	}
	done := s.done
	s.mu.Unlock()
	select {
	case <-done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *signal) state() (fired bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fired, s.err
}

// EventFence is a fence backed by a CUDA event recorded on a stream: it
// fires when the work enqueued on the stream before it completed (nil) or
// failed. A Poller watches the event with cuEventQuery — nobody blocks —
// and fires the fence on its goroutine; the fence then destroys its event.
type EventFence struct {
	signal
}

// Fence records a new event on the stream and returns a fence on it,
// watched by p (DefaultPoller when nil).
func (s *Stream) Fence(p *Poller) (*EventFence, error) {
	if p == nil {
		p = DefaultPoller()
	}
	ev, err := s.dev.NewEvent()
	if err != nil {
		return nil, err
	}
	if err := s.Record(ev); err != nil {
		ev.Close()
		return nil, err
	}
	f := &EventFence{}
	if err := p.loose.Add(ev, func(err error) {
		if cerr := ev.Close(); err == nil {
			err = cerr
		}
		f.fire(err)
	}); err != nil {
		ev.Close()
		return nil, err
	}
	return f, nil
}

// OnReady calls fn once the fence fired: on the poller goroutine, or at
// once on the caller's if it already has. fn must not block.
func (f *EventFence) OnReady(fn func(err error)) { f.onReady(fn) }

// Fired reports, without blocking, whether the fence fired and with what.
func (f *EventFence) Fired() (bool, error) { return f.state() }

// Wait blocks until the fence fired or ctx ends. Not for actors.
func (f *EventFence) Wait(ctx context.Context) error { return f.wait(ctx) }

// BorrowedFence is a fence on a CUDA event the caller owns (a framework's
// event, e.g. the handle of a recorded torch.cuda.Event): it fires nil once
// the event completed, the driver's error if the query fails. The package
// only queries the event — the Poller, with cuEventQuery — and never
// records or destroys it.
//
// The caller must keep the event alive, and must not record it again,
// until the fence fired or Release returned: a destroyed event is a
// dangling handle to the driver, and a re-recorded one makes the fence wait
// for the new work instead.
type BorrowedFence struct {
	signal
	ev *Event
	// releasing makes each release's close-then-fire one step: the
	// poller's query that failed because Release closed the event waits,
	// then finds the fence fired with Release's reason (not "closed").
	releasing sync.Mutex
}

// WatchEvent returns a fence on the caller's event handle (a CUevent, or a
// cudaEvent_t: the same thing) of device ordinal, watched by p
// (DefaultPoller when nil). The device is opened once per process and kept
// (its primary context retained): the event must belong to that primary
// context, as the CUDA runtime's (and PyTorch's) events do. Without a
// usable driver it fails at once with an error wrapping ErrNoDevice that
// says why; a zero handle or a negative ordinal with one wrapping
// ErrBadHandle.
func WatchEvent(ordinal int, event uintptr, p *Poller) (*BorrowedFence, error) {
	if event == 0 {
		return nil, fmt.Errorf("CUDA event handle 0 (an event never recorded?): %w", ErrBadHandle)
	}
	if ordinal < 0 {
		return nil, fmt.Errorf("CUDA device ordinal %d: %w", ordinal, ErrBadHandle)
	}
	d, err := sharedDevice(ordinal)
	if err != nil {
		return nil, err
	}
	return d.WatchEvent(event, p)
}

// WatchEvent returns a fence on the caller's event handle of this device
// (see the package-level WatchEvent), watched by p (DefaultPoller when
// nil). It queries the event once at once: a completed (or failed) event
// fires the fence before WatchEvent returns.
func (d *Device) WatchEvent(event uintptr, p *Poller) (*BorrowedFence, error) {
	if p == nil {
		p = DefaultPoller()
	}
	ev, err := d.BorrowEvent(event)
	if err != nil {
		return nil, err
	}
	f := &BorrowedFence{ev: ev}
	if ok, err := ev.Query(); ok || err != nil {
		f.release(err)
		return f, nil
	}
	if err := p.loose.Add(ev, f.release); err != nil {
		ev.Close()
		return nil, err
	}
	return f, nil
}

// release stops querying the event, then fires the fence with err (a no-op
// when it fired already).
func (f *BorrowedFence) release(err error) {
	f.releasing.Lock()
	defer f.releasing.Unlock()
	f.ev.Close()
	f.fire(err)
}

// Release stops watching the event: if the fence has not fired it fires
// with an error wrapping ErrClosed and err (when not nil). Once Release
// returns the package never touches the event again, so that the caller
// may destroy it. Idempotent.
func (f *BorrowedFence) Release(err error) {
	why := fmt.Errorf("cuda: borrowed event %#x released before it completed: %w", f.ev.h, ErrClosed)
	if err != nil {
		why = fmt.Errorf("%w: %w", why, err)
	}
	f.release(why)
}

// Event is the borrowed event's handle.
func (f *BorrowedFence) Event() uintptr { return f.ev.h }

// OnReady calls fn once the fence fired: on the poller goroutine, on the
// goroutine of Release, or at once on the caller's if it already has. fn
// must not block.
func (f *BorrowedFence) OnReady(fn func(err error)) { f.onReady(fn) }

// Fired reports, without blocking, whether the fence fired and with what.
func (f *BorrowedFence) Fired() (bool, error) { return f.state() }

// Wait blocks until the fence fired or ctx ends. Not for actors.
func (f *BorrowedFence) Wait(ctx context.Context) error { return f.wait(ctx) }

// shared holds the devices WatchEvent opened, one per ordinal, kept for
// the process's life.
var shared struct {
	mu   sync.Mutex
	devs map[int]*Device
}

// sharedDevice returns the process's Device of ordinal, opening it on
// first use (a failed open is retried next time).
func sharedDevice(ordinal int) (*Device, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if d := shared.devs[ordinal]; d != nil {
		return d, nil
	}
	d, err := OpenDevice(ordinal)
	if err != nil {
		return nil, err
	}
	if shared.devs == nil {
		shared.devs = make(map[int]*Device)
	}
	shared.devs[ordinal] = d
	return d, nil
}

// HostFence is the host fallback: a fence that fires when Fire is called,
// for producers that write host memory (or signal completion some other
// way). It behaves as an EventFence does.
type HostFence struct {
	signal
}

// NewHostFence returns a fence that has not fired.
func NewHostFence() *HostFence { return &HostFence{} }

// FiredFence returns a host fence that has already fired with err.
func FiredFence(err error) *HostFence {
	f := &HostFence{}
	f.fire(err)
	return f
}

// Fire fires the fence with err, running the callbacks registered so far
// on the caller's goroutine; later calls do nothing.
func (f *HostFence) Fire(err error) { f.fire(err) }

// OnReady calls fn once the fence fired: on the goroutine that fires it,
// or at once on the caller's if it already has.
func (f *HostFence) OnReady(fn func(err error)) { f.onReady(fn) }

// Fired reports whether the fence fired and with what.
func (f *HostFence) Fired() (bool, error) { return f.state() }

// Wait blocks until the fence fired or ctx ends. Not for actors.
func (f *HostFence) Wait(ctx context.Context) error { return f.wait(ctx) }
