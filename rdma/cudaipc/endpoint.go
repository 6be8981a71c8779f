package cudaipc

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
	"github.com/kvxfer/kvxfer/rdma/internal/host"
)

// endpoint is a connection to one peer agent: a CUDA stream on which its
// batches' copies run in post order, and an ordered poller queue that
// completes them. It maps the peer's control files and allocations on
// first use and keeps them until it closes.
type endpoint struct {
	agent  *Agent
	peer   address
	name   string
	stream *cuda.Stream
	q      *cuda.Queue

	// mu serialises Post and Flush with Close: once closed is set no copy
	// is enqueued any more.
	mu      sync.Mutex
	closed  bool
	targets map[[16]byte]*target // by control-file id
	copies  []cuda.Copy          // Post's scratch

	evMu   sync.Mutex
	events []*cuda.Event // idle events, reused by Post

	closeOnce sync.Once // concurrent Closes wait for the first
	closeErr  error
}

var _ rdma.Endpoint = (*endpoint)(nil)

// target is a peer region as this endpoint reaches it: the mapping of its
// control file and the device address of its allocation here.
type target struct {
	ctl  *controlMap
	base cuda.DevicePtr // the allocation's base in this process
	imp  *imported      // nil for an allocation of this process
}

// Post checks the batch (source registration, key, ranges), takes the
// source's and the destination's leases, enqueues one cuMemcpyDtoDAsync per
// segment on the endpoint's stream and records an event behind them; the
// poller completes the batch when the event has.
func (e *endpoint) Post(b rdma.Batch) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("%s: post: %w", e.name, rdma.ErrEndpointClosed)
	}
	if e.peer.pid != e.agent.addr.pid && host.ProcessGone(e.peer.pid) {
		// Its allocations died with it: do not copy into a mapping of
		// them.
		return fmt.Errorf("%s: post: %w: no process %d", e.name, rdma.ErrPeerGone, e.peer.pid)
	}
	src, ok := b.Src.(*registration)
	if !ok || src == nil || src.agent != e.agent {
		return fmt.Errorf("%s: post: source %T: %w: not a registration of agent %s", e.name, b.Src, rdma.ErrUnregistered, e.agent)
	}
	if src.dead.Load() {
		return fmt.Errorf("%s: post: source registration %d: %w: deregistered", e.name, src.id, rdma.ErrUnregistered)
	}
	k, t, err := e.resolve(b.Dst)
	if err != nil {
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	if err := copier.CheckSegments(b.Segments, src.region.Len, k.length); err != nil {
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	if st := src.ctl.c.lease.Acquire(); st != copier.Live {
		return fmt.Errorf("%s: post: source registration %d: %w (%s)", e.name, src.id, rdma.ErrUnregistered, st)
	}
	dl := &t.ctl.c.lease
	if err := acquireRemote(t.ctl, k); err != nil {
		src.ctl.c.lease.Release()
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	release := func() {
		src.ctl.c.lease.Release()
		dl.Release()
	}
	ev, err := e.event()
	if err != nil {
		release()
		return fmt.Errorf("%s: post: %w", e.name, err)
	}

	e.copies = e.copies[:0]
	dst := t.base + cuda.DevicePtr(k.offset)
	for _, s := range b.Segments {
		e.copies = append(e.copies, cuda.Copy{Dst: dst + cuda.DevicePtr(s.Dst), Src: src.ptr + cuda.DevicePtr(s.Src), Len: s.Len})
	}
	n, cerr := e.stream.CopyDtoDBatch(e.copies)
	clear(e.copies)
	var failed error // the outcome when part of the batch was not enqueued
	if cerr != nil {
		if n == 0 { // nothing enqueued: refuse
			e.recycle(ev)
			release()
			return fmt.Errorf("%s: post: segment 0: %w", e.name, cerr)
		}
		failed = &rdma.SegmentError{Index: n, Segment: b.Segments[n], Err: fmt.Errorf("%s: %w", e.name, cerr)}
	}
	var w cuda.Waitable = ev
	if err := e.stream.Record(ev); err != nil {
		// Without the event, wait here for what was enqueued (the
		// driver is failing: this is no fast path), then complete in
		// order behind the earlier batches.
		e.recycle(ev)
		w = nil
		if serr := e.stream.Synchronize(); serr != nil && failed == nil {
			// What was enqueued may still be copying: no proof.
			failed = fmt.Errorf("%s: %w: stream synchronize: %w", e.name, rdma.ErrCloseUnproven, serr)
		}
		if failed == nil {
			failed = fmt.Errorf("%s: record event: %w", e.name, err)
		}
	}
	segs, done := b.Segments, b.Done
	if err := e.q.Add(w, func(err error) {
		if w != nil {
			e.recycle(ev)
		}
		release()
		switch {
		case failed != nil:
			err = failed
		case err != nil && errors.Is(err, rdma.ErrEndpointClosed):
		case err != nil && len(segs) > 0:
			err = &rdma.SegmentError{Index: 0, Segment: segs[0], Err: fmt.Errorf("%s: copies failed on the device: %w", e.name, err)}
		case err != nil:
			err = fmt.Errorf("%s: %w", e.name, err)
		}
		if done != nil {
			done(err)
		}
	}); err != nil { // the queue closed: cannot happen while e.mu is held and e is open
		release()
		return fmt.Errorf("%s: post: %w: %v", e.name, rdma.ErrEndpointClosed, err)
	}
	return nil
}

// resolve parses rr's key, checks it names a live region of the peer, and
// returns the endpoint's target for it. Called with mu held.
func (e *endpoint) resolve(rr rdma.RemoteRegion) (regionKey, *target, error) {
	k, err := parseKey(rr.Key)
	if err != nil {
		return k, nil, err
	}
	if k.owner != e.peer.nonce || k.pid != e.peer.pid {
		return k, nil, fmt.Errorf("%w: key of another agent than the endpoint's peer %s", rdma.ErrBadKey, e.peer)
	}
	if rr.Len != k.length {
		return k, nil, fmt.Errorf("%w: remote region length %d, the key's region is %d bytes", rdma.ErrBadKey, rr.Len, k.length)
	}
	t := e.targets[k.fileID]
	if t == nil {
		if t, err = e.open(k); err != nil {
			return k, nil, err
		}
		e.targets[k.fileID] = t
	} else if !t.ctl.c.describes(k) {
		return k, nil, fmt.Errorf("%w: %s does not describe the key's region", rdma.ErrBadKey, t.ctl.path)
	}
	return k, t, nil
}

// open maps k's control file and finds its allocation: this process's own
// (a process cannot open its own IPC handles), or the peer's, mapped
// through its IPC handle on the agent's GPU.
func (e *endpoint) open(k regionKey) (*target, error) {
	ctl, err := openControl(k)
	if err != nil {
		return nil, err
	}
	t := &target{ctl: ctl}
	if k.pid == e.agent.addr.pid {
		r := lookupLocal(k.fileID)
		if r == nil || r.key != k {
			ctl.close()
			return nil, fmt.Errorf("%w: region of %s not registered (deregistered?)", rdma.ErrBadKey, e.peer)
		}
		t.base = r.alloc
		return t, nil
	}
	if t.imp, err = openImport(e.agent.dev, k.handle); err != nil {
		ctl.close()
		return nil, fmt.Errorf("%w: %v", rdma.ErrBadKey, err)
	}
	// The key and the control file are both the peer's to write: only
	// the driver's size of the allocation bounds where copies may go.
	if end := k.offset + k.length; end < k.offset || end > t.imp.size {
		_ = t.imp.release()
		ctl.close()
		return nil, fmt.Errorf("%w: region of %s: offset %d + length %d passes the end of its allocation (%d bytes)",
			rdma.ErrBadKey, e.peer, k.offset, k.length, t.imp.size)
	}
	t.base = t.imp.base
	return t, nil
}

// acquireRemote takes the destination's lease and checks that the key's
// owner and secret are the current registration's.
func acquireRemote(m *controlMap, k regionKey) error {
	switch m.c.lease.Acquire() {
	case copier.Live:
	case copier.Gone:
		return fmt.Errorf("%w: the owner of %s closed", rdma.ErrPeerGone, m.path)
	default:
		return fmt.Errorf("%w: region %s is not registered (deregistered?)", rdma.ErrBadKey, m.path)
	}
	if !m.c.ownerIs(k.owner) || !m.c.secretIs(k.secret) {
		m.c.lease.Release()
		return fmt.Errorf("%w: wrong secret for region %s (stale key?)", rdma.ErrBadKey, m.path)
	}
	return nil
}

// event returns an idle event.
func (e *endpoint) event() (*cuda.Event, error) {
	e.evMu.Lock()
	if n := len(e.events); n > 0 {
		ev := e.events[n-1]
		e.events = e.events[:n-1]
		e.evMu.Unlock()
		return ev, nil
	}
	e.evMu.Unlock()
	return e.agent.dev.NewEvent()
}

func (e *endpoint) recycle(ev *cuda.Event) {
	e.evMu.Lock()
	e.events = append(e.events, ev)
	e.evMu.Unlock()
}

// Flush calls done once every batch posted earlier has completed: a
// marker behind the endpoint's last event in its ordered queue (events of
// one stream complete in order, so no event of its own is needed).
func (e *endpoint) Flush(done func(err error)) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		done(fmt.Errorf("%s: flush: %w", e.name, rdma.ErrEndpointClosed))
		return
	}
	err := e.q.Add(nil, done)
	e.mu.Unlock()
	if err != nil {
		done(fmt.Errorf("%s: flush: %w: %v", e.name, rdma.ErrEndpointClosed, err))
	}
}

// Close refuses new batches, synchronises the stream (every copy enqueued
// has landed or failed: nothing more will be written), completes every
// batch and flush not yet reported with rdma.ErrEndpointClosed, in order,
// then closes the peer mappings, the events and the stream. Every call
// returns once that is done. A synchronisation that fails proves nothing
// (the driver is failing; copies may still run): the batches complete
// with rdma.ErrCloseUnproven too, Close's error wraps it, and the peer
// mappings stay open, so that no copy still running writes through a
// mapping closed under it.
func (e *endpoint) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()

		var errs []error
		if err := e.stream.Synchronize(); err != nil {
			err = fmt.Errorf("%s: %w: stream synchronize: %w", e.name, rdma.ErrCloseUnproven, err)
			e.q.Close(fmt.Errorf("%w: %w", rdma.ErrEndpointClosed, err))
			e.agent.forget(e)
			e.closeErr = err
			return
		}
		e.q.Close(fmt.Errorf("%s: %w", e.name, rdma.ErrEndpointClosed))

		e.mu.Lock()
		for id, t := range e.targets {
			if t.imp != nil {
				if err := t.imp.release(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", e.name, err))
				}
			}
			if err := t.ctl.close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: unmap %s: %w", e.name, t.ctl.path, err))
			}
			delete(e.targets, id)
		}
		e.mu.Unlock()
		e.evMu.Lock()
		for _, ev := range e.events {
			if err := ev.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", e.name, err))
			}
		}
		e.events = nil
		e.evMu.Unlock()
		if err := e.stream.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.name, err))
		}
		e.agent.forget(e)
		e.closeErr = errors.Join(errs...)
	})
	return e.closeErr
}
