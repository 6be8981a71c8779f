package cuda

import (
	"context"
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
