package cuda

import (
	"fmt"
	"sync"
	"time"
)

// DefaultPollInterval is how long the poller sleeps after a pass in which
// no wait completed.
//
// Cost: a pass makes one cuEventQuery (a driver call that never blocks,
// expected well under a microsecond; BenchmarkEventQuery in test/gpu
// measures it and make gpu-check prints it) for the head wait of each busy
// Queue and for each outstanding fence. While k waits are outstanding the
// poller therefore uses about k µs of CPU per 50 µs — a few percent of one
// core for a handful of streams — and adds up to one interval (plus the
// scheduler's wake-up, tens of µs) to each completion's latency. With
// nothing outstanding its goroutine exits: an idle process pays nothing.
const DefaultPollInterval = 50 * time.Microsecond

// Poller watches CUDA events without blocking anyone: one goroutine per
// Poller polls every outstanding wait with cuEventQuery every interval and
// runs the completion callbacks. The goroutine starts with the first wait
// and exits when none is outstanding.
//
// Callbacks run on the poller goroutine, one at a time. They must not
// block (they stall every other completion of the poller) and must not
// Close the Queue that runs them.
type Poller struct {
	interval time.Duration

	mu      sync.Mutex
	running bool
	pending int            // waits added and not yet completed
	busy    map[*Queue]int // queues with pending waits → how many
	scratch []*Queue       // the loop's snapshot of busy, reused
	loose   *Queue         // unordered waits of fences
}

// NewPoller returns a poller that sleeps interval between passes that
// complete nothing (DefaultPollInterval when interval ≤ 0).
func NewPoller(interval time.Duration) *Poller {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	p := &Poller{interval: interval, busy: make(map[*Queue]int)}
	p.loose = &Queue{p: p}
	return p
}

var defaultPoller = sync.OnceValue(func() *Poller { return NewPoller(DefaultPollInterval) })

// DefaultPoller is the process's poller, used where none is given.
func DefaultPoller() *Poller { return defaultPoller() }

// Interval is the poller's sleep between passes that complete nothing.
func (p *Poller) Interval() time.Duration { return p.interval }

// Queue is an ordered sequence of waits on one Poller: a wait completes
// when its event has and every wait added before it has, so callbacks run
// in Add order, one at a time. Events recorded on one stream complete in
// record order, so a stream's waits belong in one Queue; the poller then
// queries only the head of each Queue.
type Queue struct {
	p       *Poller
	ordered bool

	// run is held while the queue's callbacks run (by the poller, or by
	// Close), so that they run one at a time and Close can wait for them.
	run sync.Mutex

	mu     sync.Mutex
	items  []wait
	closed bool
}

type wait struct {
	w  Waitable // nil: complete as soon as the waits before it are
	fn func(error)
}

// Waitable is what the poller can wait on: something it can ask, without
// blocking, whether it completed — an *Event (everything before it on its
// stream) or a *Stream (everything enqueued on it).
type Waitable interface {
	Query() (done bool, err error)
}

var (
	_ Waitable = (*Event)(nil)
	_ Waitable = (*Stream)(nil)
)

// NewQueue returns an empty ordered queue.
func (p *Poller) NewQueue() *Queue { return &Queue{p: p, ordered: true} }

// Add appends a wait: fn runs once w completed (nil) or failed (the
// error), after every earlier wait's callback, on the poller goroutine. A
// nil w completes with the waits before it (a marker). After Close, Add
// returns an error wrapping ErrClosed and fn is never called.
func (q *Queue) Add(w Waitable, fn func(error)) error {
	p := q.p
	p.mu.Lock()
	p.pending++
	p.busy[q]++
	if !p.running {
		p.running = true
		go p.loop()
	}
	p.mu.Unlock()

	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		p.finished(q, 1)
		return fmt.Errorf("cuda: queue: %w", ErrClosed)
	}
	q.items = append(q.items, wait{w: w, fn: fn})
	q.mu.Unlock()
	return nil
}

// Len is the number of waits not yet completed.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// Close stops the queue: it waits until no callback of the queue is
// running, then calls every remaining wait's callback with err, in order,
// on the calling goroutine, whatever its event's state (the caller
// synchronises what it must first). Later Adds are refused. When Close
// returns no callback of the queue runs any more. Idempotent.
func (q *Queue) Close(err error) {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()

	q.run.Lock() // wait for a callback of q in progress
	defer q.run.Unlock()
	q.mu.Lock()
	items := q.items
	q.items = nil
	q.mu.Unlock()
	for _, w := range items {
		w.fn(err)
	}
	q.p.finished(q, len(items))
}

// finished counts n waits of q completed.
func (p *Poller) finished(q *Queue, n int) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending -= n
	if p.busy[q] -= n; p.busy[q] <= 0 {
		delete(p.busy, q)
	}
}

func (p *Poller) loop() {
	for {
		p.mu.Lock()
		if p.pending == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		qs := p.scratch[:0]
		for q := range p.busy {
			qs = append(qs, q)
		}
		p.scratch = qs
		p.mu.Unlock()

		done := 0
		for _, q := range qs {
			done += q.poll()
		}
		clear(qs)
		if done == 0 {
			time.Sleep(p.interval)
		}
	}
}

// poll completes what is ready: the head run of an ordered queue, or every
// ready wait of an unordered one. It returns how many it completed.
func (q *Queue) poll() int {
	q.run.Lock()
	defer q.run.Unlock()
	total := 0
	for {
		q.mu.Lock()
		if q.closed || len(q.items) == 0 {
			q.mu.Unlock()
			break
		}
		ready, errs := q.scan()
		var run []wait
		if len(ready) > 0 {
			run = make([]wait, 0, len(ready))
			kept := q.items[:0]
			r := 0
			for i, w := range q.items {
				if r < len(ready) && ready[r] == i {
					run = append(run, w)
					r++
					continue
				}
				kept = append(kept, w)
			}
			clear(q.items[len(kept):])
			q.items = kept
		}
		q.mu.Unlock()
		if len(run) == 0 {
			break
		}
		for i, w := range run {
			w.fn(errs[i])
		}
		q.p.finished(q, len(run))
		total += len(run)
		if !q.ordered {
			break // one scan per pass for loose fences
		}
	}
	return total
}

// scan returns the indexes of the waits ready now, in order, with their
// outcomes: for an ordered queue the longest ready prefix, for an
// unordered one every ready wait. Called with q.mu held.
func (q *Queue) scan() (idx []int, errs []error) {
	for i, w := range q.items {
		ok, err := true, error(nil)
		if w.w != nil {
			ok, err = w.w.Query()
		}
		if ok || err != nil {
			idx = append(idx, i)
			errs = append(errs, err)
			continue
		}
		if q.ordered {
			break
		}
	}
	return idx, errs
}
