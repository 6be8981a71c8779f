package discovery

import (
	"context"
	"errors"
	"sync"
)

// Registry is the membership seam: a rank registers its own record and
// learns of its peers' arrivals and departures.
//
// Register publishes r (once per registry). Events delivers Up, Down,
// Rejected and Lost events in the order the registry decided them; it is
// closed when the registry closes or fails (Err then says why). The
// consumer must keep reading: a consumer that falls more than the queue
// bound behind stops the registry with ErrEventOverflow rather than have
// it block or drop an event. Peers is a snapshot of the peers up now
// (this rank excluded). Close withdraws the record (a Down with reason
// "left" at every peer), stops and closes Events; it is idempotent.
type Registry interface {
	Register(ctx context.Context, r Record) error
	Events() <-chan Event
	Peers() []Record
	Err() error
	Close() error
}

// DefaultEventQueue bounds the events a registry holds for a slow
// consumer.
const DefaultEventQueue = 4096

// eventQueue hands events to the consumer in order without blocking the
// producer: a pending list bounded by limit, a goroutine that feeds out.
type eventQueue struct {
	out   chan Event
	limit int

	mu      sync.Mutex
	pending []Event
	err     error
	ending  bool // deliver what is pending, then close out
	wake    chan struct{}
	stop    chan struct{}
	stopped sync.Once
	done    chan struct{}
	onFail  func(error)
}

func newEventQueue(limit int, onFail func(error)) *eventQueue {
	if limit <= 0 {
		limit = DefaultEventQueue
	}
	q := &eventQueue{out: make(chan Event), limit: limit, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}), onFail: onFail}
	go q.run()
	return q
}

// push queues evs; over the bound it fails the queue (and the registry).
func (q *eventQueue) push(evs ...Event) { q.pushWithin(q.limit, evs...) }

// pushWithin is push with bound in place of the queue's own.
func (q *eventQueue) pushWithin(bound int, evs ...Event) {
	if len(evs) == 0 {
		return
	}
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return
	}
	if len(q.pending)+len(evs) > bound {
		q.err = ErrEventOverflow
		q.pending = nil
		q.mu.Unlock()
		if q.onFail != nil {
			q.onFail(ErrEventOverflow)
		}
		q.close()
		return
	}
	q.pending = append(q.pending, evs...)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) run() {
	defer close(q.done)
	defer close(q.out)
	for {
		q.mu.Lock()
		var ev Event
		have, ending := len(q.pending) > 0, q.ending
		if have {
			ev = q.pending[0]
			q.pending[0] = Event{}
			q.pending = q.pending[1:]
		}
		q.mu.Unlock()
		if !have && ending {
			return
		}
		if !have {
			select {
			case <-q.wake:
				continue
			case <-q.stop:
				return
			}
		}
		select {
		case q.out <- ev:
		case <-q.stop:
			return
		}
	}
}

// end makes the queue deliver what is pending, then close out; later
// pushes are dropped. It does not wait.
func (q *eventQueue) end() {
	q.mu.Lock()
	q.ending = true
	if q.err == nil {
		q.err = errEnded
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// errEnded marks a queue that takes no more events (end); it is not
// reported.
var errEnded = errors.New("discovery: event queue ended")

// close stops delivery (pending events are dropped) and closes out; it
// waits for the delivering goroutine.
func (q *eventQueue) close() {
	q.stopped.Do(func() { close(q.stop) })
	<-q.done
}
