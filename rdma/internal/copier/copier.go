package copier

import (
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/rdma"
)

// ChunkBytes is the most a Copier copies between two checks for Close.
const ChunkBytes = 1 << 20

// Copier runs one endpoint's jobs, in order, on its own goroutine.
//
// Post and Flush may be called from any goroutine; Done callbacks run on the
// copier goroutine, one at a time, in post order. Close stops the goroutine
// and returns only once it has exited, so no copy runs after Close.
type Copier struct {
	name string // the endpoint, for error messages

	mu     sync.Mutex
	jobs   []Job // queued, not yet taken by the goroutine
	spare  []Job // the goroutine's drained slice, reused
	closed bool
	exited bool // the goroutine took its last jobs: nothing runs after

	stopping atomic.Bool   // set by Close; checked between chunks
	wake     chan struct{} // capacity 1: "jobs queued or closing"
	stopped  chan struct{} // closed when the goroutine has exited
}

// New starts a copier; name identifies its endpoint in errors.
func New(name string) *Copier {
	c := &Copier{
		name:    name,
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	go c.run()
	return c
}

// Post queues j. After Close it returns an error wrapping
// rdma.ErrEndpointClosed and j is dropped (its Done is not called and its
// leases are not released: the caller still owns them).
func (c *Copier) Post(j Job) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.closedErr()
	}
	c.jobs = append(c.jobs, j)
	c.mu.Unlock()
	c.signal()
	return nil
}

// Flush calls done once every job posted earlier has completed: with nil, or
// with rdma.ErrEndpointClosed when the copier closed first. On a closed
// copier it calls done before returning.
func (c *Copier) Flush(done func(err error)) {
	c.mu.Lock()
	if c.exited {
		c.mu.Unlock()
		done(c.closedErr())
		return
	}
	c.jobs = append(c.jobs, Job{Done: done, flush: true})
	c.mu.Unlock()
	c.signal()
}

// Close stops the copier: the job being copied stops within one chunk and
// completes with a *rdma.SegmentError wrapping rdma.ErrEndpointClosed, every
// queued job and flush completes with rdma.ErrEndpointClosed, then the
// goroutine exits. Close returns once it has. Idempotent.
func (c *Copier) Close() {
	c.mu.Lock()
	c.closed = true
	c.stopping.Store(true)
	c.mu.Unlock()
	c.signal()
	<-c.stopped
}

// Closed reports whether Close has been called.
func (c *Copier) Closed() bool { return c.stopping.Load() }

func (c *Copier) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Copier) closedErr() error {
	return fmt.Errorf("%s: %w", c.name, rdma.ErrEndpointClosed)
}

func (c *Copier) run() {
	defer close(c.stopped)
	// A peer can truncate the file behind a mapping we copy into: the copy
	// then faults. Make that a panic that runPeerJob and complete recover
	// (a memory fault only), not the death of the process. The copies are
	// Go copies (runtime memmove) and the lease updates Go atomics, on
	// this goroutine, so the setting covers them.
	debug.SetPanicOnFault(true)
	for {
		c.mu.Lock()
		for len(c.jobs) == 0 && !c.closed {
			c.mu.Unlock()
			<-c.wake
			c.mu.Lock()
		}
		jobs := c.jobs
		c.jobs = c.spare[:0]
		c.mu.Unlock()

		for i := range jobs {
			c.runJob(&jobs[i])
			jobs[i] = Job{} // drop references for the GC
		}

		c.mu.Lock()
		c.spare = jobs[:0]
		done := c.closed && len(c.jobs) == 0
		c.exited = done
		c.mu.Unlock()
		if done {
			return
		}
	}
}

func (c *Copier) runJob(j *Job) {
	if c.stopping.Load() {
		c.complete(j, 0, c.closedErr())
		return
	}
	if j.flush {
		j.Done(nil)
		return
	}
	if j.Peer == nil {
		var i int
		c.complete(j, 0, c.copySegments(j, &i))
		return
	}
	if err := j.Peer.Err(); err != nil {
		c.complete(j, 0, fmt.Errorf("%s: %w", c.name, err))
		return
	}
	c.runPeerJob(j)
}

// runPeerJob runs a job into peer memory: it copies the segments and
// releases the leases under one fault guard (the goroutine panics on
// faults, see run), then calls Done. A fault fails the job with faultErr
// and the leases left are released by complete, each guarded; any other
// panic is re-raised.
func (c *Copier) runPeerJob(j *Job) {
	var err error
	i, k := 0, -1 // the segment being copied; the lease being released (-1: none yet)
	func() {
		defer func() {
			if r := recover(); r != nil {
				seg := i
				if k >= 0 {
					seg = len(j.Segs) // the copy was done
				}
				if ferr := c.faultErr(j, seg, faultAddr(r)); err == nil {
					err = ferr
				}
			}
		}()
		err = c.copySegments(j, &i)
		for k = 0; k < len(j.Leases); k++ {
			if l := j.Leases[k]; l != nil {
				j.Slots[k].Release(l)
			}
		}
	}()
	// k is the lease that faulted, -1 if the copy did, len(j.Leases) if
	// nothing did.
	c.complete(j, min(k+1, len(j.Leases)), err)
}

// copySegments copies j's segments in order, stopping early at Close; *i
// is the segment being copied.
func (c *Copier) copySegments(j *Job, i *int) error {
	for ; *i < len(j.Segs); *i++ {
		s := j.Segs[*i]
		dst := j.Dst[s.Dst : s.Dst+s.Len]
		src := j.Src[s.Src : s.Src+s.Len]
		for len(src) > ChunkBytes {
			copy(dst[:ChunkBytes], src[:ChunkBytes])
			dst, src = dst[ChunkBytes:], src[ChunkBytes:]
			if c.stopping.Load() {
				return &rdma.SegmentError{Index: *i, Segment: s, Err: c.closedErr()}
			}
		}
		copy(dst, src)
		if c.stopping.Load() && *i+1 < len(j.Segs) {
			return &rdma.SegmentError{Index: *i + 1, Segment: j.Segs[*i+1], Err: c.closedErr()}
		}
	}
	return nil
}
