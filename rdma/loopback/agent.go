package loopback

import (
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// Backend is the loopback backend's name.
const Backend = "loopback"

// Agent is an in-process rdma.Agent. It is safe for concurrent use.
type Agent struct {
	net   *Network
	id    uint64
	addr  address
	bytes []byte // addr, encoded

	closed    atomic.Bool
	closeOnce sync.Once

	mu      sync.RWMutex
	nextReg uint64
	regs    map[uint64]*registration
	eps     map[*endpoint]struct{}
	// written: the registrations Close revoked while another agent's
	// batches into them were in flight (Close's proof waits for them).
	written []*registration
}

var (
	_ rdma.Agent            = (*Agent)(nil)
	_ rdma.SourceRegisterer = (*Agent)(nil)
)

// New starts an agent in the process-wide network, or the one WithNetwork
// names.
func New(opts ...Option) *Agent {
	cfg := config{network: defaultNetwork}
	for _, o := range opts {
		o(&cfg)
	}
	a := &Agent{
		net:  cfg.network,
		regs: make(map[uint64]*registration),
		eps:  make(map[*endpoint]struct{}),
	}
	rand.Read(a.addr.nonce[:])
	a.net.add(a)
	a.addr.id = a.id
	a.bytes = []byte(a.addr.String())
	return a
}

// Backend returns "loopback".
func (a *Agent) Backend() string { return Backend }

// CompletionsDeliver is true (rdma.Delivering): the copier's goroutine
// copies into the peer's memory (this process's) before it calls Done.
func (a *Agent) CompletionsDeliver() bool { return true }

// Address returns "loopback:<id>:<nonce>".
func (a *Agent) Address() []byte { return append([]byte(nil), a.bytes...) }

func (a *Agent) String() string { return a.addr.String() }

// Register registers a host region; its key embeds a fresh random secret.
func (a *Agent) Register(r *kvcache.Region) (rdma.Registration, error) {
	return a.register(r, false)
}

// RegisterSource registers r for this agent's own batches to read: its
// Remote has no key, and no batch can write into it
// (rdma.SourceRegisterer).
func (a *Agent) RegisterSource(r *kvcache.Region) (rdma.Registration, error) {
	return a.register(r, true)
}

func (a *Agent) register(r *kvcache.Region, source bool) (rdma.Registration, error) {
	if r == nil {
		return nil, fmt.Errorf("%s: register: %w: nil region", a, kvcache.ErrBadRegion)
	}
	b := r.Bytes()
	if b == nil {
		return nil, fmt.Errorf("%s: register %s region at %#x (%d bytes): %w: only host memory can be copied by the loopback backend",
			a, r.Kind, r.Base, r.Len, kvcache.ErrBadRegion)
	}
	reg := &registration{agent: a, region: r, bytes: b[:r.Len:r.Len]}
	rand.Read(reg.secret[:])

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: register: %w", a, rdma.ErrAgentClosed)
	}
	a.nextReg++
	reg.id = a.nextReg
	reg.remote = rdma.RemoteRegion{Len: r.Len}
	if !source {
		reg.remote.Key = regionKey{agent: a.id, reg: reg.id, secret: reg.secret}.encode()
	}
	a.regs[reg.id] = reg
	return reg, nil
}

// Deregister revokes reg; with batches in flight from or into it, it fails
// with rdma.ErrRegionBusy and changes nothing.
func (a *Agent) Deregister(reg rdma.Registration) error {
	r, ok := reg.(*registration)
	if !ok || r == nil || r.agent != a {
		return fmt.Errorf("%s: deregister %T: %w: not a registration of this agent", a, reg, rdma.ErrUnregistered)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.regs[r.id] != r {
		return fmt.Errorf("%s: deregister registration %d: %w: already deregistered", a, r.id, rdma.ErrUnregistered)
	}
	if !r.lease.TryRetire() {
		return fmt.Errorf("%s: deregister registration %d: %w: %d batches in flight", a, r.id, rdma.ErrRegionBusy, r.lease.InFlight())
	}
	delete(a.regs, r.id)
	return nil
}

// Connect opens an endpoint to the agent at peer, which must be in the same
// network and open.
func (a *Agent) Connect(peer []byte) (rdma.Endpoint, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	pa, err := parseAddress(peer)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", a, err)
	}
	p := a.net.lookup(pa.id)
	if p == nil || p.addr.nonce != pa.nonce || p.closed.Load() {
		return nil, fmt.Errorf("%s: connect %s: %w: no open agent at that address in this network", a, pa, rdma.ErrPeerGone)
	}
	e := &endpoint{agent: a, peer: p}
	e.name = fmt.Sprintf("loopback endpoint %d→%d", a.id, p.id)

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	e.cp = copier.New(e.name)
	a.eps[e] = struct{}{}
	return e, nil
}

// Close closes every endpoint (waiting for their copies to stop), revokes
// every registration and leaves the network. Batches that endpoints of
// other agents accepted into its registrations before still complete, on
// those endpoints' goroutines: while one may still copy into its memory,
// Close returns an error wrapping rdma.ErrCloseUnproven, so that the
// memory stays mapped. Idempotent: a later call returns nil once those
// batches have completed.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		a.mu.Lock()
		a.closed.Store(true)
		eps := make([]*endpoint, 0, len(a.eps))
		for e := range a.eps {
			eps = append(eps, e)
		}
		a.mu.Unlock()

		a.net.remove(a)
		for _, e := range eps {
			e.Close()
		}

		a.mu.Lock()
		for id, r := range a.regs {
			// No batch acquires it from here on; those counted in it
			// are other agents' (this agent's endpoints have stopped)
			// and release it when their copy is over.
			r.lease.ForceRetire(true)
			if r.lease.InFlight() > 0 {
				a.written = append(a.written, r)
			}
			delete(a.regs, id)
		}
		a.mu.Unlock()
	})
	return a.unproven()
}

// unproven says which registrations revoked by Close other agents'
// endpoints may still copy into, or nil when none.
func (a *Agent) unproven() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var busy []string
	for _, r := range a.written {
		if n := r.lease.InFlight(); n > 0 {
			busy = append(busy, fmt.Sprintf("registration %d (%d batches in flight)", r.id, n))
		}
	}
	if len(busy) == 0 {
		a.written = nil
		return nil
	}
	return fmt.Errorf("%s: close: %w: endpoints of other agents still copy into %s: keep its memory mapped, and call Close again once their batches have completed (their Done called, or their endpoints closed)",
		a, rdma.ErrCloseUnproven, strings.Join(busy, ", "))
}

// lookup returns the live registration id, or nil.
func (a *Agent) lookup(id uint64) *registration {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.regs[id]
}

func (a *Agent) forget(e *endpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.eps, e)
}
