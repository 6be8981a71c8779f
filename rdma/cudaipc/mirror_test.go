package cudaipc_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// mirror adapts a cudaipc agent to the conformance suite, which fills and
// checks host bytes (Region.Bytes) directly. Each host region it is asked
// to register gets a device twin of the same size, registered with the
// real agent; the suite's host bytes are the twin's mirror:
//
//   - a source's host bytes are copied to its twin before a Post whenever
//     they changed since the last copy;
//   - when a batch completes, each of its destination segments is copied
//     back from the destination's twin into the host bytes, before the
//     suite's Done runs.
//
// Everything else — keys, leases, refusals, ordering, Close — is the real
// agent's. Device regions pass straight through (the suite's
// RegisterDevice check then sees the agent refuse a bogus device
// address). What the mirror cannot show, a write landing in device memory
// after Close, TestCloseNoLateWrite checks on the device itself.
type mirror struct {
	inner *cudaipc.Agent
	dev   *cuda.Device // the mirror's own reference: twins outlive inner's

	mu     sync.Mutex
	regs   map[*twin]struct{}
	closed bool
	errs   []error // failed mirror copies, reported by the factory
}

// twin is a host region registered through the mirror.
type twin struct {
	m       *mirror
	host    *kvcache.Region
	mem     *cuda.Memory
	inner   rdma.Registration
	key     string
	mu      sync.Mutex
	pushed  []byte // the host bytes last copied to the device
	dropped bool   // deregistered: the device memory is gone
}

var (
	_ rdma.Agent        = (*mirror)(nil)
	_ rdma.Registration = (*twin)(nil)
)

// twins finds a destination's twin by its key, across mirrors.
var twins = struct {
	mu sync.Mutex
	m  map[string]*twin
}{m: make(map[string]*twin)}

func newMirror() (*mirror, error) {
	a, err := cudaipc.New()
	if err != nil {
		return nil, err
	}
	dev, err := cuda.OpenDevice(a.Device().Ordinal())
	if err != nil {
		a.Close()
		return nil, err
	}
	return &mirror{inner: a, dev: dev, regs: make(map[*twin]struct{})}, nil
}

func (m *mirror) fail(err error) {
	m.mu.Lock()
	m.errs = append(m.errs, err)
	m.mu.Unlock()
}

func (m *mirror) failures() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return errors.Join(m.errs...)
}

func (m *mirror) Backend() string { return m.inner.Backend() }
func (m *mirror) Address() []byte { return m.inner.Address() }

func (m *mirror) Register(r *kvcache.Region) (rdma.Registration, error) {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if r == nil || r.Kind != kvcache.HostMem || closed {
		return m.inner.Register(r)
	}
	mem, err := m.dev.Alloc(r.Len)
	if err != nil {
		return nil, err
	}
	dr, err := mem.Region()
	if err == nil {
		var reg rdma.Registration
		if reg, err = m.inner.Register(dr); err == nil {
			t := &twin{m: m, host: r, mem: mem, inner: reg, key: string(reg.Remote().Key)}
			m.mu.Lock()
			m.regs[t] = struct{}{}
			m.mu.Unlock()
			twins.mu.Lock()
			twins.m[t.key] = t
			twins.mu.Unlock()
			return t, nil
		}
	}
	mem.Free()
	return nil, err
}

func (t *twin) Region() *kvcache.Region   { return t.host }
func (t *twin) Remote() rdma.RemoteRegion { return t.inner.Remote() }

// drop forgets a twin whose registration is gone and frees its memory.
func (t *twin) drop() error {
	twins.mu.Lock()
	delete(twins.m, t.key)
	twins.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropped = true
	return t.mem.Free()
}

func (m *mirror) Deregister(reg rdma.Registration) error {
	t, ok := reg.(*twin)
	if !ok {
		return m.inner.Deregister(reg)
	}
	if err := m.inner.Deregister(t.inner); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.regs, t)
	m.mu.Unlock()
	return t.drop()
}

func (m *mirror) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := m.inner.Connect(peer)
	if err != nil {
		return nil, err
	}
	return &mirrorEndpoint{m: m, inner: ep}, nil
}

func (m *mirror) Close() error {
	err := m.inner.Close()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return err
	}
	m.closed = true
	regs := m.regs
	m.regs = nil
	m.mu.Unlock()
	errs := []error{err}
	for t := range regs {
		errs = append(errs, t.drop())
	}
	return errors.Join(append(errs, m.dev.Close())...)
}

type mirrorEndpoint struct {
	m     *mirror
	inner rdma.Endpoint
}

// push copies a source's host bytes to its twin if they changed.
func (t *twin) push() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.host.Bytes()
	if t.dropped || bytes.Equal(b, t.pushed) {
		return nil // the agent refuses a deregistered source
	}
	if err := t.m.dev.CopyHtoD(t.mem.Ptr(), b); err != nil {
		return fmt.Errorf("mirror: push source: %w", err)
	}
	t.pushed = append(t.pushed[:0], b...)
	return nil
}

// pull copies segs' destination ranges from the twin into its host bytes.
func (t *twin) pull(segs []kvcache.Segment) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dropped {
		return nil
	}
	b := t.host.Bytes()
	for _, s := range segs {
		if s.Len == 0 {
			continue
		}
		if err := t.m.dev.CopyDtoH(b[s.Dst:s.Dst+s.Len], t.mem.Ptr()+cuda.DevicePtr(s.Dst)); err != nil {
			return fmt.Errorf("mirror: pull destination: %w", err)
		}
	}
	return nil
}

func (e *mirrorEndpoint) Post(b rdma.Batch) error {
	src := b.Src
	if t, ok := b.Src.(*twin); ok {
		src = t.inner
		if t.m == e.m {
			if err := t.push(); err != nil {
				return err
			}
		}
	}
	twins.mu.Lock()
	dst := twins.m[string(b.Dst.Key)]
	twins.mu.Unlock()
	done := b.Done
	b.Src = src
	b.Done = func(err error) {
		if dst != nil {
			if perr := dst.pull(b.Segments); perr != nil {
				e.m.fail(perr)
			}
		}
		if done != nil {
			done(err)
		}
	}
	return e.inner.Post(b)
}

func (e *mirrorEndpoint) Flush(done func(error)) { e.inner.Flush(done) }
func (e *mirrorEndpoint) Close() error           { return e.inner.Close() }
