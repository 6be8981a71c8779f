package cudaipc

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// Backend is the cudaipc backend's name.
const Backend = "cudaipc"

// Agent is an rdma.Agent for GPU-to-GPU writes between processes of one
// node. It is safe for concurrent use.
type Agent struct {
	dev    *cuda.Device
	poller *cuda.Poller
	addr   address
	bytes  []byte // addr, encoded
	// identity is whom the agent serves (WithIdentity), stated in its
	// agent file at file.
	identity string
	file     string

	closed    atomic.Bool
	closeOnce sync.Once

	mu      sync.Mutex
	nextReg uint64
	nextEp  uint64
	regs    map[*registration]struct{}
	eps     map[*endpoint]struct{}
	// written are the registrations Close revoked with batches still
	// counted in flight (endpoints of other agents copying into them, or
	// copies of this agent's that ended unproven): their control files
	// stay mapped, so that a later Close reads the count again.
	written []*registration
}

var _ rdma.Agent = (*Agent)(nil)

// New starts an agent of this process on a GPU (WithDevice, default 0).
// Without a usable GPU or CUDA driver it returns an error wrapping
// cuda.ErrNoDevice.
func New(opts ...Option) (*Agent, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.poller == nil {
		o.poller = cuda.DefaultPoller()
	}
	if len(o.identity) > MaxIdentity {
		return nil, fmt.Errorf("cudaipc: identity %.32q… of %d bytes: at most %d", o.identity, len(o.identity), MaxIdentity)
	}
	self, err := pidwatch.Self()
	if err != nil {
		return nil, fmt.Errorf("cudaipc: this process's start time and host, for its agent file: %w", err)
	}
	if len(self.Host) > maxHost {
		return nil, fmt.Errorf("cudaipc: host %.32q… of %d bytes: at most %d", self.Host, len(self.Host), maxHost)
	}
	dev, err := cuda.OpenDevice(o.device)
	if err != nil {
		return nil, fmt.Errorf("cudaipc: %w", err)
	}
	a := &Agent{
		dev:      dev,
		poller:   o.poller,
		identity: o.identity,
		regs:     make(map[*registration]struct{}),
		eps:      make(map[*endpoint]struct{}),
	}
	a.addr.pid = os.Getpid()
	rand.Read(a.addr.nonce[:])
	a.bytes = []byte(a.addr.String())
	a.file, err = createAgentFile(agentFile{addr: a.addr, start: self.StartTime, host: self.Host, identity: o.identity})
	if err != nil {
		_ = dev.Close()
		return nil, fmt.Errorf("cudaipc: agent %s: agent file: %w", a.addr, err)
	}
	agents.mu.Lock()
	agents.m[a.addr.nonce] = a
	agents.mu.Unlock()
	return a, nil
}

// Identity is whom the agent serves, as WithIdentity gave it ("" for
// none).
func (a *Agent) Identity() string { return a.identity }

// Backend returns "cudaipc".
func (a *Agent) Backend() string { return Backend }

// Address returns "cudaipc2:<pid>:<nonce>".
func (a *Agent) Address() []byte { return append([]byte(nil), a.bytes...) }

// Device is the GPU the agent copies with. The agent closes it in Close:
// allocate memory that outlives the agent from a Device of your own
// (cuda.OpenDevice).
func (a *Agent) Device() *cuda.Device { return a.dev }

func (a *Agent) String() string { return a.addr.String() }

// Register registers a device region (kvcache.DeviceMem) that lies inside
// one cuMemAlloc allocation: peers holding its RemoteRegion can write into
// it, and this agent's endpoints can read it as a source. Host memory is
// refused (kvcache.ErrBadRegion): use a host backend for it. It is
// RegisterSpans(r, []Span{{0, r.Len}}).
func (a *Agent) Register(r *kvcache.Region) (rdma.Registration, error) {
	if r == nil {
		return nil, fmt.Errorf("%s: register: %w: nil region", a, kvcache.ErrBadRegion)
	}
	return a.RegisterSpans(r, []Span{{0, r.Len}})
}

// RegisterSpans registers a device region whose bytes in use — spans,
// relative to r.Base — may lie in several cuMemAlloc allocations (a
// framework's per-layer KV tensors, each its own allocation, with
// unmapped gaps between them): the region's key names every allocation
// that holds a span (Allocations), and peers may write, and this agent's
// endpoints read, exactly the bytes from each allocation's first span byte
// to its last; a segment elsewhere (a gap, or across two allocations) is
// refused. Spans may overlap and come in any order. Refusals wrap
// kvcache.ErrBadRegion (a *SpanError for one span). Everything else —
// control file, leases, Deregister refusing while a batch is in flight,
// Close revoking — is as for Register.
func (a *Agent) RegisterSpans(r *kvcache.Region, spans []Span) (rdma.Registration, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: register: %w", a, rdma.ErrAgentClosed)
	}
	allocs, err := a.Allocations(r, spans)
	if err != nil {
		if r == nil {
			return nil, fmt.Errorf("%s: register: %w", a, err)
		}
		return nil, fmt.Errorf("%s: register device region at %#x (%d bytes): %w", a, r.Base, r.Len, err)
	}
	es := make([]entry, len(allocs))
	local := make([]mapped, len(allocs))
	for i, al := range allocs {
		h, err := a.dev.IPCHandle(al.Base)
		if err != nil {
			return nil, fmt.Errorf("%s: register device region at %#x: allocation %d: %w", a, r.Base, i, err)
		}
		es[i] = entry{handle: h, allocOff: al.AllocOff, off: al.Off, len: al.Len}
		local[i] = mapped{off: al.Off, len: al.Len, ptr: cuda.DevicePtr(r.Base) + cuda.DevicePtr(al.Off)}
	}
	table := encodeTable(es)
	reg := &registration{agent: a, region: r, ptr: cuda.DevicePtr(r.Base), allocs: local}
	reg.key = regionKey{owner: a.addr.nonce, pid: a.addr.pid, length: r.Len, count: len(es), digest: sha256.Sum256(table)}
	rand.Read(reg.key.fileID[:])
	rand.Read(reg.key.secret[:])
	ctl, err := createControl(controlPath(a.addr.pid, reg.key.fileID), len(es), table)
	if err != nil {
		return nil, fmt.Errorf("%s: register: control file: %w", a, err)
	}
	c := ctl.c
	copy(c.magic[:], controlMagic)
	c.fileID, c.length, c.count, c.digest = reg.key.fileID, r.Len, uint64(len(es)), reg.key.digest
	c.setOwner(a.addr.nonce)
	c.setSecret(reg.key.secret) // descriptor, owner and secret first: whoever acquires sees them
	c.lease.Reset(false)
	reg.ctl = ctl
	reg.remote = rdma.RemoteRegion{Key: reg.key.encode(), Len: r.Len}

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		_, _ = reg.revoke(false) // never published: nothing in flight
		return nil, fmt.Errorf("%s: register: %w", a, rdma.ErrAgentClosed)
	}
	a.nextReg++
	reg.id = a.nextReg
	a.regs[reg] = struct{}{}
	exportLocal(reg)
	return reg, nil
}

// revoke retires a registration's lease (marking its owner gone when gone),
// clears its secret, removes its control file and unmaps it. Peers that
// mapped the file see the retirement; later ones find no file. busy
// reports batches still counted in flight after the retirement (accepted
// before it: another endpoint may still copy into or from the region), or
// a count that cannot be read (the file truncated under the mapping): the
// file then stays mapped, for Agent.unproven to read the count again.
func (r *registration) revoke(gone bool) (busy bool, err error) {
	r.use.Lock()
	defer r.use.Unlock()
	r.dead.Store(true)
	unexportLocal(r)
	c := r.ctl.c
	var inFlight uint64
	ferr := r.ctl.guard(func() {
		c.lease.ForceRetire(gone)
		c.setSecret([16]byte{})
		inFlight = c.lease.InFlight() // no batch acquires it any more
	})
	err = errors.Join(ferr, os.Remove(r.ctl.path))
	if ferr != nil || inFlight > 0 {
		return true, err
	}
	return false, errors.Join(err, r.ctl.close())
}

// Deregister revokes reg. With batches of any process in flight from or
// into it, it fails with rdma.ErrRegionBusy and changes nothing.
func (a *Agent) Deregister(reg rdma.Registration) error {
	r, ok := reg.(*registration)
	if !ok || r == nil || r.agent != a {
		return fmt.Errorf("%s: deregister %T: %w: not a registration of this agent", a, reg, rdma.ErrUnregistered)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.regs[r]; !ok {
		return fmt.Errorf("%s: deregister registration %d: %w: already deregistered", a, r.id, rdma.ErrUnregistered)
	}
	var retired bool
	var inFlight uint64
	if err := r.ctl.guard(func() {
		if retired = r.ctl.c.lease.TryRetire(); !retired {
			inFlight = r.ctl.c.lease.InFlight()
		}
	}); err != nil {
		// Its count is gone with the file: whether a batch still reads or
		// writes the region cannot be known, so it stays busy.
		return fmt.Errorf("%s: deregister registration %d: %w: batches in flight unknown: %w", a, r.id, rdma.ErrRegionBusy, err)
	}
	if !retired {
		return fmt.Errorf("%s: deregister registration %d: %w: %d batches in flight", a, r.id, rdma.ErrRegionBusy, inFlight)
	}
	delete(a.regs, r)
	if _, err := r.revoke(false); err != nil { // retired with nothing in flight: busy only with this error
		return fmt.Errorf("%s: deregister registration %d: %w", a, r.id, err)
	}
	return nil
}

// Connect opens an endpoint to the agent at peer: a stream on this agent's
// GPU. It reads the peer's agent file first (for an agent of this process:
// the agent itself), and the endpoint reports the identity the peer states
// there (rdma.IdentifiedEndpoint). It fails with rdma.ErrPeerGone when the
// agent cannot be found on this host (no such process, no agent file, one
// of another host or pid namespace, a process that is not the agent's),
// and with rdma.ErrBadAddress for an agent file that does not describe the
// address (another pid or nonce) or is not of this process's user.
func (a *Agent) Connect(peer []byte) (rdma.Endpoint, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	pa, err := parseAddress(peer)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", a, err)
	}
	var identity string
	var proc *os.File // the peer's process (nil: this one, or no pidfd_open)
	if pa.pid == a.addr.pid {
		identity, err = localIdentity(pa)
	} else {
		identity, proc, err = readAgentFile(pa)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: connect %s: %w", a, pa, err)
	}
	s, err := a.dev.NewStream()
	if err != nil {
		closeProc(proc)
		return nil, fmt.Errorf("%s: connect %s: %w", a, pa, err)
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		s.Close()
		closeProc(proc)
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	a.nextEp++
	e := &endpoint{agent: a, peer: pa, proc: proc, identity: identity, stream: s, q: a.poller.NewQueue(), targets: make(map[[16]byte]*target)}
	e.name = fmt.Sprintf("cudaipc endpoint %d of %s → %s", a.nextEp, a, pa)
	a.eps[e] = struct{}{}
	return e, nil
}

// Close closes every endpoint (each waits for its copies), revokes every
// registration — peers' later posts into them fail with rdma.ErrPeerGone
// (or rdma.ErrBadKey for a peer that never used the key) — and releases
// the device. Batches that endpoints of other agents (of this process or
// another) accepted into its registrations before still complete, on
// their streams: nothing of this agent can stop them. While one may still
// copy into its memory (or a copy of its own that ended unproven may still
// read it), Close returns an error wrapping rdma.ErrCloseUnproven naming
// the registrations, and the memory must stay allocated. Idempotent: a
// later call returns nil once those batches have completed.
func (a *Agent) Close() error {
	var errs []error
	a.closeOnce.Do(func() {
		agents.mu.Lock()
		delete(agents.m, a.addr.nonce)
		agents.mu.Unlock()
		a.mu.Lock()
		a.closed.Store(true)
		eps := make([]*endpoint, 0, len(a.eps))
		for e := range a.eps {
			eps = append(eps, e)
		}
		a.mu.Unlock()

		for _, e := range eps {
			if err := e.Close(); err != nil {
				errs = append(errs, err)
			}
		}

		a.mu.Lock()
		for r := range a.regs {
			busy, err := r.revoke(true)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: revoke registration %d: %w", a, r.id, err))
			}
			if busy {
				a.written = append(a.written, r)
			}
			delete(a.regs, r)
		}
		a.mu.Unlock()
		if err := os.Remove(a.file); err != nil {
			errs = append(errs, fmt.Errorf("%s: agent file: %w", a, err))
		}
		if err := a.dev.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
		}
	})
	return errors.Join(errors.Join(errs...), a.unproven())
}

// unproven says which registrations revoked by Close batches may still
// copy into or from, or nil when none; it unmaps the control file of each
// whose batches have all completed, and forgets it.
func (a *Agent) unproven() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var busy []string
	var errs []error
	kept := a.written[:0]
	for _, r := range a.written {
		var inFlight uint64
		if err := r.ctl.guard(func() { inFlight = r.ctl.c.lease.InFlight() }); err != nil {
			busy = append(busy, fmt.Sprintf("registration %d (batches in flight unknown: %v)", r.id, err))
		} else if inFlight > 0 {
			busy = append(busy, fmt.Sprintf("registration %d (%d batches in flight)", r.id, inFlight))
		} else {
			if err := r.ctl.close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: registration %d: %w", a, r.id, err))
			}
			continue
		}
		kept = append(kept, r)
	}
	clear(a.written[len(kept):])
	a.written = kept
	if len(busy) > 0 {
		errs = append(errs, fmt.Errorf("%s: close: %w: batches accepted before Close may still copy into or from %s: keep the memory allocated, and call Close again once they have completed (their Done called, or their endpoints closed)",
			a, rdma.ErrCloseUnproven, strings.Join(busy, ", ")))
	}
	return errors.Join(errs...)
}

func (a *Agent) forget(e *endpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.eps, e)
}
