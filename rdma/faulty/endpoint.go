package faulty

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/rdma"
)

// endpoint wraps an rdma.Endpoint: it decides each batch's fault, posts what
// reaches the wire, and delivers every outcome in post order on its own
// goroutine.
type endpoint struct {
	agent *Agent
	inner rdma.Endpoint
	rng   *rand.Rand

	mu       sync.Mutex
	seq      uint64
	peerGone bool
	cut      int // batches Cut failed: Close proves nothing about them
	closed   bool
	draining bool     // every entry is ready; the deliverer exits when empty
	gone     bool     // the deliverer exited: nothing is delivered any more
	fifo     []*entry // accepted batches and flushes, in post order

	wake      chan struct{} // capacity 1
	stopped   chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// entry is one accepted batch or flush awaiting delivery.
type entry struct {
	seq   uint64
	batch rdma.Batch // Src, Dst, Segments for holds and errors; Done
	rule  *rule
	flush bool

	ready bool  // err is final; deliver when at the head
	err   error // the outcome
	stop  func() bool
}

var _ rdma.Endpoint = (*endpoint)(nil)

func newEndpoint(a *Agent, in rdma.Endpoint, rng *rand.Rand) *endpoint {
	e := &endpoint{
		agent:   a,
		inner:   in,
		rng:     rng,
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	go e.deliver()
	return e
}

// pick returns the first rule that matches batch seq, or nil.
func (e *endpoint) pick(seq uint64) *rule {
	for i := range e.agent.cfg.rules {
		r := &e.agent.cfg.rules[i]
		if r.match(seq, e.rng) {
			return r
		}
	}
	return nil
}

// Post applies the batch's fault. A batch that reaches the wrapped endpoint
// is posted with the lock held, so its completion finds its entry queued.
func (e *endpoint) Post(b rdma.Batch) error {
	if d := e.agent.cfg.postCost; d > 0 {
		time.Sleep(d) // the modelled posting cost, paid by the caller
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("faulty: post: %w", rdma.ErrEndpointClosed)
	}
	seq := e.seq
	e.seq++
	if e.peerGone {
		return fmt.Errorf("faulty: post batch %d: %w (injected earlier)", seq, rdma.ErrPeerGone)
	}
	r := e.pick(seq)
	ent := &entry{seq: seq, batch: b, rule: r}
	switch {
	case r != nil && r.kind == kindPeerGone:
		e.peerGone = true
		return fmt.Errorf("faulty: post batch %d: %w (injected)", seq, rdma.ErrPeerGone)
	case r != nil && r.kind == kindFail:
		ent.ready = true
		ent.err = injected(b, 0, fmt.Sprintf("batch %d failed", seq))
	case r != nil && r.kind == kindPartial:
		if k := partialLen(r.prefix, len(b.Segments)); k >= 0 && k < len(b.Segments) {
			pb := b
			pb.Segments = b.Segments[:k]
			pb.Done = func(err error) { e.complete(ent, err) }
			if err := e.inner.Post(pb); err != nil {
				return err
			}
			break
		}
		ent.ready = true // no segment to post: fail like Fail
		ent.err = injected(b, 0, fmt.Sprintf("batch %d failed", seq))
	default:
		ib := b
		ib.Done = func(err error) { e.complete(ent, err) }
		if err := e.inner.Post(ib); err != nil {
			return err
		}
	}
	hold(b.Src, b.Dst.Key)
	e.fifo = append(e.fifo, ent)
	if ent.ready {
		e.signal()
	}
	return nil
}

// partialLen is how many of n segments a Partial(prefix) batch posts: at
// most n-1, so at least one segment fails.
func partialLen(prefix, n int) int { return min(prefix, n-1) }

// injected is the error of an injected failure naming segment i (or no
// segment for an empty batch).
func injected(b rdma.Batch, i int, why string) error {
	err := fmt.Errorf("%w: %s", rdma.ErrInjected, why)
	if i >= len(b.Segments) {
		return err
	}
	return &rdma.SegmentError{Index: i, Segment: b.Segments[i], Err: err}
}

// complete records the wrapped endpoint's outcome for ent and applies the
// rule's hold, if any. Runs on the wrapped backend's goroutine.
func (e *endpoint) complete(ent *entry, err error) {
	e.mu.Lock()
	if ent.ready { // closed out by Close already
		e.mu.Unlock()
		return
	}
	ent.err = err
	var gate *Gate
	switch r := ent.rule; {
	case r == nil:
		ent.ready = true
	case r.kind == kindPartial:
		if err == nil {
			k := partialLen(r.prefix, len(ent.batch.Segments))
			ent.err = injected(ent.batch, k, fmt.Sprintf("partial write: batch %d stopped after %d of %d segments", ent.seq, k, len(ent.batch.Segments)))
		}
		ent.ready = true
	case r.kind == kindHang:
		// withheld until Close
	case r.kind == kindCut:
		ent.err = fmt.Errorf("faulty: batch %d cut by an injected endpoint failure: %w: %w", ent.seq, rdma.ErrPeerGone, rdma.ErrCloseUnproven)
		if err != nil {
			ent.err = fmt.Errorf("%w; %w", err, ent.err)
		}
		ent.ready = true
		e.peerGone = true
		e.cut++
	case r.kind == kindDelay:
		ent.stop = e.agent.cfg.clock.AfterFunc(r.delay, func() { e.release(ent) })
	case r.kind == kindSlow:
		gate = r.gate
	default:
		ent.ready = true
	}
	if ent.ready {
		e.signal()
	}
	e.mu.Unlock()
	if gate != nil {
		gate.wait(func() { e.release(ent) })
	}
}

// release makes a held entry deliverable with the outcome recorded.
func (e *endpoint) release(ent *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !ent.ready {
		ent.ready = true
		e.signal()
	}
}

// Flush queues a marker behind every earlier batch; its done gets nil, or
// rdma.ErrPeerGone after an injected peer loss, or rdma.ErrEndpointClosed
// once Close has begun. Only once the delivery goroutine has exited (every
// earlier batch delivered) is done called at once.
func (e *endpoint) Flush(done func(err error)) {
	e.mu.Lock()
	if e.gone {
		e.mu.Unlock()
		done(fmt.Errorf("faulty: flush: %w", rdma.ErrEndpointClosed))
		return
	}
	ent := &entry{flush: true, ready: true, batch: rdma.Batch{Done: done}}
	switch {
	case e.closed:
		// Close has begun, and batches posted before may not have been
		// delivered: done keeps its place behind them.
		ent.err = fmt.Errorf("faulty: flush: %w", rdma.ErrEndpointClosed)
	case e.peerGone:
		ent.err = fmt.Errorf("faulty: flush: %w (injected)", rdma.ErrPeerGone)
	}
	e.fifo = append(e.fifo, ent)
	e.signal()
	e.mu.Unlock()
}

// Close closes the wrapped endpoint (its unfinished batches complete), then
// completes every held batch and pending flush with rdma.ErrEndpointClosed
// and waits until the delivery goroutine has delivered them all and exited.
func (e *endpoint) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()

		e.closeErr = e.inner.Close()

		e.mu.Lock()
		closed := fmt.Errorf("faulty: %w", rdma.ErrEndpointClosed)
		cut := 0
		for _, ent := range e.fifo {
			if ent.flush {
				ent.err = closed
				continue
			}
			if !ent.ready {
				if ent.stop != nil {
					ent.stop()
				}
				ent.ready = true
				err := fmt.Errorf("faulty: batch %d held at close: %w", ent.seq, rdma.ErrEndpointClosed)
				if ent.err != nil {
					// The wrapped endpoint's outcome, which may say
					// that its writes can still land
					// (rdma.ErrCloseUnproven): kept.
					err = fmt.Errorf("%w; the wrapped endpoint completed it with: %w", err, ent.err)
				}
				ent.err = err
				if e.agent.cfg.unproven {
					ent.err = fmt.Errorf("%w: %w", ent.err, rdma.ErrCloseUnproven)
				}
				cut++
			}
		}
		var unproven []error
		if cut > 0 && e.agent.cfg.unproven {
			unproven = append(unproven, fmt.Errorf("faulty: %d batches cut at close: %w", cut, rdma.ErrCloseUnproven))
		}
		if e.cut > 0 {
			unproven = append(unproven, fmt.Errorf("faulty: %d batches cut by an injected endpoint failure: %w", e.cut, rdma.ErrCloseUnproven))
		}
		if len(unproven) > 0 && e.agent.cfg.released {
			unproven = append(unproven, fmt.Errorf("faulty: %w", rdma.ErrSourcesReleased))
		}
		e.closeErr = errors.Join(append([]error{e.closeErr}, unproven...)...)
		e.draining = true
		e.signal()
		e.mu.Unlock()

		<-e.stopped
		e.agent.forget(e)
	})
	<-e.stopped
	return e.closeErr
}

func (e *endpoint) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// deliver calls Done for the ready prefix of the queue, in order, until the
// endpoint has closed and the queue is empty.
func (e *endpoint) deliver() {
	defer close(e.stopped)
	var out []*entry
	for range e.wake {
		for {
			e.mu.Lock()
			n := 0
			for n < len(e.fifo) && e.fifo[n].ready {
				n++
			}
			out = append(out[:0], e.fifo[:n]...)
			clear(e.fifo[:n])
			e.fifo = e.fifo[n:]
			finished := e.draining && len(e.fifo) == 0
			e.gone = finished
			e.mu.Unlock()

			for _, ent := range out {
				if !ent.flush {
					unhold(ent.batch.Src, ent.batch.Dst.Key)
				}
				if ent.batch.Done != nil {
					ent.batch.Done(ent.err)
				}
			}
			clear(out)
			if finished {
				return
			}
			if n == 0 {
				break
			}
		}
	}
}
