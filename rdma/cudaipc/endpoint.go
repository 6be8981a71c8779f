package cudaipc

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
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
	agent *Agent
	peer  address
	// proc is a pidfd of the peer's process, opened at Connect (nil for an
	// agent of this process, or where the kernel has no pidfd_open): Post
	// refuses once it is readable, the process having exited even when its
	// pid is not reaped yet or names another process now. Closed by Close.
	proc *os.File
	name string
	// identity is whom the peer agent serves, as its agent file states it
	// (for an agent of this process: as it was given).
	identity string
	stream   *cuda.Stream
	q        *cuda.Queue

	// mu serialises Post and Flush with Close: once closed is set no copy
	// is enqueued any more.
	mu      sync.Mutex
	closed  bool
	targets map[[16]byte]*target // by control-file id
	copies  []cuda.Copy          // Post's scratch

	evMu   sync.Mutex
	events []*cuda.Event // idle events, reused by Post

	// lastUnproven is why the last batch completed ended without proof
	// that its copies are over (nil when it had one): a Flush completing
	// right behind it proves nothing either. Only the queue's callbacks,
	// which run one at a time, touch it.
	lastUnproven error
	// kept are the lease releases of batches that ended unproven (their
	// leases held: a copy may still run), for Close to call once its
	// stream synchronisation proved every copy over. Only the queue's
	// callbacks append, and Close reads it once the queue has closed.
	kept []func()

	closeOnce sync.Once // concurrent Closes wait for the first
	closeErr  error
}

var _ rdma.IdentifiedEndpoint = (*endpoint)(nil)

// MaxPeerRegistrations bounds the peer registrations one endpoint maps:
// each key of a registration not seen before maps its control file and
// opens its allocations, kept until the endpoint closes, so that a peer
// handing out ever new keys cannot grow this process's mappings without
// bound. A node registers its pool once.
const MaxPeerRegistrations = 1024

// PeerIdentity is whom the peer agent serves, as it states it in its agent
// file (WithIdentity; "" when it was given none), read at Connect: an agent
// address names exactly one agent file, which only that agent's process
// creates. An endpoint to an agent of this process reports that agent's
// identity.
func (e *endpoint) PeerIdentity() string { return e.identity }

// target is a peer region as this endpoint reaches it: the mapping of its
// control file and its allocations as this process reaches them
// (ascending, disjoint; imp nil for memory of this process).
type target struct {
	ctl    *controlMap
	allocs []mapped
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
	if e.peerGone() {
		// Its allocations died with it: do not copy into a mapping of
		// them.
		return fmt.Errorf("%s: post: %w: process %d exited", e.name, rdma.ErrPeerGone, e.peer.pid)
	}
	src, ok := b.Src.(*registration)
	if !ok || src == nil || src.agent != e.agent {
		return fmt.Errorf("%s: post: source %T: %w: not a registration of agent %s", e.name, b.Src, rdma.ErrUnregistered, e.agent)
	}
	// Held until the source's lease is taken (and to the end of Post): a
	// Deregister racing this Post cannot unmap its control file under it.
	src.use.RLock()
	defer src.use.RUnlock()
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
	// Each segment within one allocation on both sides, before any lease
	// is taken or copy enqueued.
	e.copies = e.copies[:0]
	for i, s := range b.Segments {
		if s.Len == 0 { // copies nothing: any mapped address does
			e.copies = append(e.copies, cuda.Copy{Dst: t.allocs[0].ptr, Src: src.allocs[0].ptr})
			continue
		}
		dm := find(t.allocs, s.Dst, s.Len)
		if dm == nil {
			clear(e.copies)
			return fmt.Errorf("%s: post: %w", e.name, &rdma.SegmentError{Index: i, Segment: s,
				Err: fmt.Errorf("%w: destination [%d, +%d) does not lie in one allocation of the peer's region (%s): it falls into a gap or crosses from one allocation into another",
					rdma.ErrOutOfRange, s.Dst, s.Len, describeAllocs(t.allocs, s.Dst))})
		}
		sm := find(src.allocs, s.Src, s.Len)
		if sm == nil {
			clear(e.copies)
			return fmt.Errorf("%s: post: %w", e.name, &rdma.SegmentError{Index: i, Segment: s,
				Err: fmt.Errorf("%w: source [%d, +%d) does not lie in one registered allocation of source registration %d (%s)",
					rdma.ErrOutOfRange, s.Src, s.Len, src.id, describeAllocs(src.allocs, s.Src))})
		}
		e.copies = append(e.copies, cuda.Copy{Dst: dm.ptr + cuda.DevicePtr(s.Dst-dm.off), Src: sm.ptr + cuda.DevicePtr(s.Src-sm.off), Len: s.Len})
	}
	var st copier.LeaseState
	if err := src.ctl.guard(func() { st = src.ctl.c.lease.Acquire() }); err != nil {
		clear(e.copies)
		return fmt.Errorf("%s: post: source registration %d: %w", e.name, src.id, err)
	}
	if st != copier.Live {
		clear(e.copies)
		return fmt.Errorf("%s: post: source registration %d: %w (%s)", e.name, src.id, rdma.ErrUnregistered, st)
	}
	if err := acquireRemote(t.ctl, k); err != nil {
		clear(e.copies)
		_ = src.ctl.guard(src.ctl.c.lease.Release)
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	dst := t.ctl
	release := func() {
		// After Post returned: the source is revoked under a held lease
		// only by its agent's Close, which retires the count anyway.
		src.use.RLock()
		if !src.dead.Load() {
			_ = src.ctl.guard(src.ctl.c.lease.Release)
		}
		src.use.RUnlock()
		_ = dst.guard(dst.c.lease.Release) // a truncated file has no count left to release
	}
	ev, err := e.event()
	if err != nil {
		clear(e.copies)
		release()
		return fmt.Errorf("%s: post: %w", e.name, err)
	}

	n, cerr := e.stream.CopyDtoDBatch(e.copies)
	clear(e.copies)
	var failed error // the outcome when part of the batch was not enqueued
	// unproven: what was enqueued may still be copying and nothing will
	// say when it is over (a stream synchronisation that failed).
	var unproven error
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
		if serr := e.stream.Synchronize(); serr != nil {
			// What was enqueued may still be copying: no proof.
			unproven = fmt.Errorf("%s: %w: stream synchronize: %w", e.name, rdma.ErrCloseUnproven, serr)
		}
		if failed == nil && unproven == nil {
			failed = fmt.Errorf("%s: record event: %w", e.name, err)
		}
	}
	segs, done := b.Segments, b.Done
	if err := e.q.Add(w, func(err error) {
		if w != nil {
			e.recycle(ev)
		}
		unproven := unproven
		switch {
		case unproven != nil:
		case errors.Is(err, rdma.ErrCloseUnproven): // the endpoint's Close could not prove it
			unproven = err
		case err != nil && w != nil && !errors.Is(err, rdma.ErrEndpointClosed):
			// The event reported an error instead of completing: that
			// says nothing of when the copies before it stop (DESIGN
			// §3 counts no such proof), whatever the driver does.
			unproven = fmt.Errorf("%s: %w: the batch's event reported %w", e.name, rdma.ErrCloseUnproven, err)
		}
		// A later batch's proof (its event, or a synchronisation) covers
		// this one too: a stream runs its work in order.
		e.lastUnproven = unproven
		switch {
		case failed != nil:
			err = failed
		case err != nil && errors.Is(err, rdma.ErrEndpointClosed):
		case err != nil && len(segs) > 0:
			err = &rdma.SegmentError{Index: 0, Segment: segs[0], Err: fmt.Errorf("%s: copies failed on the device: %w", e.name, err)}
		case err != nil:
			err = fmt.Errorf("%s: %w", e.name, err)
		}
		// The leases say the copies are over only when they are: an
		// unproven end (a synchronise that failed) keeps both held, so
		// that the regions stay busy (Deregister refuses) for as long as a
		// copy may still read or write them — until a Close of the
		// endpoint proves them over — and Done says so whatever else
		// failed (a segment the driver refused after others were
		// enqueued).
		if unproven == nil {
			release()
		} else {
			e.kept = append(e.kept, release)
		}
		switch {
		case unproven == nil:
		case err == nil:
			err = unproven
		case !errors.Is(err, rdma.ErrCloseUnproven):
			err = fmt.Errorf("%w; %w", err, unproven)
		}
		if done != nil {
			done(err)
		}
	}); err != nil { // the queue closed: cannot happen while e.mu is held and e is open
		// Copies were enqueued and nothing will complete them: the leases
		// stay held (the regions busy) rather than claim they are over.
		return fmt.Errorf("%s: post: %w: %w: %v", e.name, rdma.ErrCloseUnproven, rdma.ErrEndpointClosed, err)
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
		if len(e.targets) >= MaxPeerRegistrations {
			return k, nil, fmt.Errorf("%w: the peer %s handed out keys of more than %d registrations: refused (an endpoint keeps each one mapped until it closes; a peer registers its pool once)", rdma.ErrBadKey, e.peer, MaxPeerRegistrations)
		}
		if t, err = e.open(k); err != nil {
			return k, nil, err
		}
		e.targets[k.fileID] = t
		return k, t, nil
	}
	var ok bool
	if err := t.ctl.guard(func() { ok = t.ctl.c.describes(k) }); err != nil {
		return k, nil, err
	}
	if !ok {
		return k, nil, fmt.Errorf("%w: %s does not describe the key's region", rdma.ErrBadKey, t.ctl.path)
	}
	return k, t, nil
}

// open maps k's control file, reads its table of allocations, checks
// that the registration is live and k's owner and secret are its own, and
// only then maps each allocation: this process's own (a process cannot
// open its own IPC handles), or the peer's, each opened through its IPC
// handle on the agent's GPU (once per process: imports) and checked
// against the size the driver gives it. A key refused here leaves nothing
// mapped.
func (e *endpoint) open(k regionKey) (*target, error) {
	ctl, es, err := openControl(k)
	if err != nil {
		return nil, err
	}
	// Before any import: a key the registration does not vouch for (a
	// wrong secret or owner, a revoked registration) must not open the
	// peer's allocations nor take a slot of MaxPeerRegistrations.
	var st copier.LeaseState
	var verr error
	if err := ctl.guard(func() { st, verr = ctl.c.lease.State(), vouch(ctl, k) }); err != nil {
		ctl.close()
		return nil, err
	}
	if err := leaseErr(ctl, st); err != nil {
		ctl.close()
		return nil, err
	}
	if verr != nil {
		ctl.close()
		return nil, verr
	}
	t := &target{ctl: ctl}
	if k.pid == e.agent.addr.pid {
		r := lookupLocal(k.fileID)
		if r == nil || r.key != k {
			ctl.close()
			return nil, fmt.Errorf("%w: region of %s not registered (deregistered?)", rdma.ErrBadKey, e.peer)
		}
		t.allocs = r.allocs
		return t, nil
	}
	t.allocs = make([]mapped, 0, len(es))
	for i, en := range es {
		imp, err := openImport(e.agent.dev, en.handle)
		if err != nil {
			t.release()
			return nil, fmt.Errorf("%w: region of %s: allocation %d of %d: %v", rdma.ErrBadKey, e.peer, i, len(es), err)
		}
		t.allocs = append(t.allocs, mapped{off: en.off, len: en.len, ptr: imp.base + cuda.DevicePtr(en.allocOff), imp: imp})
		// The key and the control file are both the peer's to write:
		// only the driver's size of the allocation bounds where copies
		// may go.
		if en.allocOff > imp.size || en.len > imp.size-en.allocOff {
			t.release()
			return nil, fmt.Errorf("%w: region of %s: allocation %d of %d: offset %d + length %d passes the end of its allocation (%d bytes)",
				rdma.ErrBadKey, e.peer, i, len(es), en.allocOff, en.len, imp.size)
		}
	}
	return t, nil
}

// release drops t's imports and unmaps its control file.
func (t *target) release() error {
	var errs []error
	for _, m := range t.allocs {
		if m.imp != nil {
			if err := m.imp.release(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	t.allocs = nil
	if err := t.ctl.close(); err != nil {
		errs = append(errs, fmt.Errorf("unmap %s: %w", t.ctl.path, err))
	}
	return errors.Join(errs...)
}

// describeAllocs names the allocations of ms around region offset off,
// for an error.
func describeAllocs(ms []mapped, off uint64) string {
	i, _ := slices.BinarySearchFunc(ms, off, func(m mapped, off uint64) int { return cmp.Compare(m.off, off) })
	var parts []string
	for j := max(i-1, 0); j <= i && j < len(ms); j++ {
		parts = append(parts, fmt.Sprintf("[%d, %d)", ms[j].off, ms[j].off+ms[j].len))
	}
	return fmt.Sprintf("%d allocations; nearest: %s", len(ms), strings.Join(parts, ", "))
}

// acquireRemote takes the destination's lease and checks that the key's
// owner and secret are the current registration's.
// Every access goes through m.guard: the owner may truncate the file.
func acquireRemote(m *controlMap, k regionKey) error {
	var st copier.LeaseState
	if err := m.guard(func() { st = m.c.lease.Acquire() }); err != nil {
		return err
	}
	if err := leaseErr(m, st); err != nil {
		return err
	}
	var verr error
	if err := m.guard(func() { verr = vouch(m, k) }); err != nil {
		return err // the file is gone, and the count taken with it
	}
	if verr != nil {
		_ = m.guard(m.c.lease.Release)
		return verr
	}
	return nil
}

// leaseErr is why a lease in state st takes no batch (nil when Live).
func leaseErr(m *controlMap, st copier.LeaseState) error {
	switch st {
	case copier.Live:
		return nil
	case copier.Gone:
		return fmt.Errorf("%w: the owner of %s closed", rdma.ErrPeerGone, m.path)
	}
	return fmt.Errorf("%w: region %s is not registered (deregistered?)", rdma.ErrBadKey, m.path)
}

// vouch checks that k's owner and secret are those of the registration
// m's header holds now. Called inside m.guard.
func vouch(m *controlMap, k regionKey) error {
	switch {
	case !m.c.ownerIs(k.owner):
		return fmt.Errorf("%w: region %s belongs to another agent than the key's owner %x", rdma.ErrBadKey, m.path, k.owner)
	case !m.c.secretIs(k.secret):
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
// one stream complete in order, so no event of its own is needed). When
// the last batch completed before it ended without proof that its copies
// are over (rdma.ErrCloseUnproven), done gets that error: the copies may
// still run.
func (e *endpoint) Flush(done func(err error)) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		done(fmt.Errorf("%s: flush: %w", e.name, rdma.ErrEndpointClosed))
		return
	}
	err := e.q.Add(nil, func(err error) {
		if err == nil && e.lastUnproven != nil {
			// The batch before the marker ended without proof: its
			// copies may still run.
			err = fmt.Errorf("%s: flush: %w", e.name, e.lastUnproven)
		}
		done(err)
	})
	e.mu.Unlock()
	if err != nil {
		done(fmt.Errorf("%s: flush: %w: %v", e.name, rdma.ErrEndpointClosed, err))
	}
}

// peerGone reports whether the peer agent's process has exited (false for
// an agent of this process). Called with e.mu held, which keeps Close from
// closing the pidfd under it.
func (e *endpoint) peerGone() bool {
	switch {
	case e.peer.pid == e.agent.addr.pid:
		return false
	case e.proc != nil:
		return exited(e.proc)
	}
	return host.ProcessGone(e.peer.pid)
}

// Close refuses new batches, synchronises the stream (every copy enqueued
// has landed or failed: nothing more will be written), completes every
// batch and flush not yet reported with rdma.ErrEndpointClosed, in order,
// releases the leases that batches which ended unproven kept (the
// synchronisation proved their copies over too), then closes the peer
// mappings, the events and the stream. Every call
// returns once that is done. A synchronisation that fails proves nothing
// (the driver is failing; copies may still run): the batches complete
// with rdma.ErrCloseUnproven too, Close's error wraps it, and the peer
// mappings stay open, so that no copy still running writes through a
// mapping closed under it.
func (e *endpoint) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true // no Post reads proc any more
		closeProc(e.proc)
		e.proc = nil
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
		// The stream is idle: the copies of batches that ended unproven
		// are over too, and their regions no longer busy.
		for _, release := range e.kept {
			release()
		}
		e.kept = nil

		e.mu.Lock()
		for id, t := range e.targets {
			if err := t.release(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", e.name, err))
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
