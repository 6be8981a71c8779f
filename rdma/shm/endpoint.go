package shm

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// testHookPostSourceChecked, when set (tests), runs in Post after its
// first check that the source registration is live.
var testHookPostSourceChecked func()

// endpoint is a connection to a peer agent of this host. It maps the peer's
// region files on first use and keeps the mappings until it closes.
type endpoint struct {
	agent *Agent
	peer  address
	name  string
	cp    *copier.Copier

	// mu serialises Post with Close's unmapping: a mapping is only used
	// with mu held or by an accepted batch, and unmapped only after the
	// copier stopped.
	mu     sync.Mutex
	maps   map[[16]byte]*mapping // by file id
	closed bool
}

var _ rdma.Endpoint = (*endpoint)(nil)

// Post checks the batch (source registration, key, file, ranges), takes the
// source's lease and the destination's shared lease, checks the secret and
// queues the batch for the endpoint's copier.
func (e *endpoint) Post(b rdma.Batch) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.cp.Closed() {
		return fmt.Errorf("%s: post: %w", e.name, rdma.ErrEndpointClosed)
	}
	src, ok := b.Src.(*registration)
	if !ok || src == nil || src.agent != e.agent {
		return fmt.Errorf("%s: post: source %T: %w: not a registration of agent %s", e.name, b.Src, rdma.ErrUnregistered, e.agent)
	}
	if src.dead.Load() {
		return fmt.Errorf("%s: post: source registration %d: %w: deregistered", e.name, src.id, rdma.ErrUnregistered)
	}
	if testHookPostSourceChecked != nil {
		testHookPostSourceChecked()
	}
	k, m, err := e.resolve(b.Dst)
	if err != nil {
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	if err := copier.CheckSegments(b.Segments, src.region.Len, uint64(len(m.data))); err != nil {
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	// Deregistered meanwhile (its file may be unmapped since): refused
	// without touching its lease.
	st, ok := src.acquire()
	if !ok {
		return fmt.Errorf("%s: post: source registration %d: %w: deregistered", e.name, src.id, rdma.ErrUnregistered)
	}
	if st != copier.Live {
		return fmt.Errorf("%s: post: source registration %d: %w (%s)", e.name, src.id, rdma.ErrUnregistered, st)
	}
	if err := m.acquire(k); err != nil {
		src.lease.Release()
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	err = e.cp.Post(copier.Job{
		Src:    src.bytes,
		Dst:    m.data,
		Segs:   b.Segments,
		Done:   b.Done,
		Leases: [2]*copier.Lease{src.lease, &m.hdr.lease},
		Slots:  [2]*copier.WriterSlot{nil, m.slot},
		Peer:   m.peer,
	})
	if err != nil {
		src.lease.Release()
		m.unacquire()
		return fmt.Errorf("post: %w", err)
	}
	return nil
}

// resolve parses rr's key, checks it names a shared region of the peer, and
// returns the endpoint's mapping of its file. Called with mu held.
func (e *endpoint) resolve(rr rdma.RemoteRegion) (regionKey, *mapping, error) {
	k, err := parseKey(rr.Key)
	if err != nil {
		return k, nil, err
	}
	if k.owner != e.peer.nonce {
		return k, nil, fmt.Errorf("%w: key of another agent than the endpoint's peer %s", rdma.ErrBadKey, e.peer)
	}
	if k.kind == kindPrivate {
		return k, nil, fmt.Errorf("%w: registration %d of %s is private memory, not a shared region: receive into a region made by shm.NewRegion",
			rdma.ErrBadKey, k.reg, e.peer)
	}
	m := e.maps[k.fileID]
	if m == nil {
		if m, err = openMapping(k); err != nil {
			return k, nil, err
		}
		e.maps[k.fileID] = m
	} else if m.name != string(k.name) {
		return k, nil, fmt.Errorf("%w: key names file %q, its region is file %q", rdma.ErrBadKey, k.name, m.name)
	}
	if rr.Len != uint64(len(m.data)) {
		return k, nil, fmt.Errorf("%w: remote region length %d, region %s is %d bytes", rdma.ErrBadKey, rr.Len, m.path, len(m.data))
	}
	return k, m, nil
}

// acquireLease takes the destination file's lease (and counts the batch in
// the mapping's writer slot) and checks that the key's owner and secret are
// the current registration's. It reads the owner's header page: call it
// through mapping.acquire, which catches a fault.
func acquireLease(m *mapping, k regionKey) error {
	switch m.slot.Acquire(&m.hdr.lease) {
	case copier.Live:
	case copier.Gone:
		return fmt.Errorf("%w: the owner of %s closed", rdma.ErrPeerGone, m.path)
	default:
		return fmt.Errorf("%w: region %s is not registered (deregistered?)", rdma.ErrBadKey, m.path)
	}
	if !m.hdr.ownerIs(k.owner) || !m.hdr.secretIs(k.secret) {
		m.slot.Release(&m.hdr.lease)
		return fmt.Errorf("%w: wrong secret for region %s (stale key?)", rdma.ErrBadKey, m.path)
	}
	return nil
}

// Flush calls done once every batch posted earlier has completed.
func (e *endpoint) Flush(done func(err error)) { e.cp.Flush(done) }

// Close stops the copier (waiting for it), then unmaps every mapping.
func (e *endpoint) Close() error {
	e.cp.Close()
	e.mu.Lock()
	var errs []error
	if !e.closed {
		e.closed = true
		for id, m := range e.maps {
			if err := m.close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: unmap %s: %w", e.name, m.path, err))
			}
			delete(e.maps, id)
		}
	}
	e.mu.Unlock()
	e.agent.forget(e)
	return errors.Join(errs...)
}
