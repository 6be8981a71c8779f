//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// Backend is the ucx backend's name.
const Backend = "ucx"

// Available says whether this binary has the ucx backend (built with cgo
// on Linux, without the kvxfer_noucx tag).
const Available = true

// ErrUnavailable is what New returns in a build without the ucx backend;
// this build never returns it.
var ErrUnavailable = errors.New("ucx: backend not built in (needs cgo on Linux and UCX's headers and libraries through pkg-config)")

// Agent is an rdma.Agent over one UCP context and worker, driven by one
// progress goroutine. It is safe for concurrent use.
type Agent struct {
	id   agentID
	priv *ecdh.PrivateKey // its public key is in the address; see linkkey.go
	pub  [pubLen]byte
	sign ed25519.PrivateKey // signs its region keys (key.go); public key in the address
	spub [pubLen]byte
	name string
	opts options
	w    *worker

	// Set by the progress goroutine before New returns.
	addr     []byte
	memTypes uint64

	closed    atomic.Bool
	closeOnce sync.Once
	// keep: Close leaves the memory the agent allocated mapped (KeepMemory).
	keep     atomic.Bool
	closeErr error

	mu  sync.Mutex
	eps map[*endpoint]struct{}

	// prefaults are the goroutines filling the page tables of peers'
	// memory mapped by this agent (see prefault); Close waits for them.
	prefaults sync.WaitGroup
}

var _ rdma.Agent = (*Agent)(nil)

// New creates a UCP context (RMA and active messages, with wakeup) and a
// worker, configured from the UCX_* environment as UCX reads it, and
// starts the agent's progress goroutine.
func New(opts ...Option) (*Agent, error) {
	a := &Agent{opts: defaultOptions(), eps: make(map[*endpoint]struct{})}
	for _, o := range opts {
		o(&a.opts)
	}
	if n := len(a.opts.identity); n > maxIdentity {
		// A peer drops a hello with a longer one as malformed.
		return nil, fmt.Errorf("ucx: new agent: identity %.32q… of %d bytes: at most %d", a.opts.identity, n, maxIdentity)
	}
	for _, c := range a.opts.cpus {
		if c < 0 || c >= cpuSetSize {
			return nil, fmt.Errorf("ucx: new agent: progress CPU %d: want 0..%d", c, cpuSetSize-1)
		}
	}
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ucx: new agent: link key: %w", err)
	}
	a.priv = priv
	copy(a.pub[:], priv.PublicKey().Bytes())
	spub, sign, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ucx: new agent: signing key: %w", err)
	}
	a.sign = sign
	copy(a.spub[:], spub)
	a.id = idOf(a.pub, a.spub)
	a.name = "ucx agent " + a.id.String()
	a.w = newWorker(a)
	ready := make(chan error, 1)
	go a.w.run(ready)
	if err := <-ready; err != nil {
		<-a.w.stopped
		return nil, fmt.Errorf("ucx: new agent: %w", err)
	}
	addLocalAgent(a.id)
	return a, nil
}

// cpuSetSize is how many CPUs an affinity mask names.
const cpuSetSize = len(unix.CPUSet{}) * 64

// Backend returns "ucx".
func (a *Agent) Backend() string { return Backend }

// Address returns the agent's public key and its UCP worker address.
func (a *Agent) Address() []byte { return append([]byte(nil), a.addr...) }

func (a *Agent) String() string { return a.name }

// MemoryTypes names the memory types this UCX can register ("host", and
// "cuda" where UCX was built with CUDA support).
func (a *Agent) MemoryTypes() []string { return memTypeNames(a.memTypes) }

// Register maps the region with ucp_mem_map and packs its rkey into the
// region's key. Device memory registers only where UCX reports CUDA
// support.
func (a *Agent) Register(r *kvcache.Region) (rdma.Registration, error) {
	return a.register(r, false)
}

// RegisterSource maps the region with ucp_mem_map for this agent's own
// batches to read, and packs no rkey: its Remote has no key, no peer can
// write into it, and neither a peer's failed link nor an unacknowledged
// bye keeps it mapped or makes Close return rdma.ErrCloseUnproven for it
// (rdma.SourceRegisterer). Its Deregister asks no peer.
func (a *Agent) RegisterSource(r *kvcache.Region) (rdma.Registration, error) {
	return a.register(r, true)
}

func (a *Agent) register(r *kvcache.Region, source bool) (rdma.Registration, error) {
	if r == nil {
		return nil, fmt.Errorf("%s: register: %w: nil region", a, kvcache.ErrBadRegion)
	}
	if r.Len == 0 || r.Base == 0 {
		return nil, fmt.Errorf("%s: register %s region at %#x (%d bytes): %w: empty", a, r.Kind, r.Base, r.Len, kvcache.ErrBadRegion)
	}
	switch r.Kind {
	case kvcache.HostMem:
	case kvcache.DeviceMem:
		if a.memTypes&(1<<memTypeCUDA) == 0 {
			return nil, fmt.Errorf("%s: register device region at %#x (%d bytes, GPU %d): %w: this UCX has no CUDA memory support (it registers: %s); build UCX with CUDA or stage through host memory",
				a, r.Base, r.Len, r.Device, kvcache.ErrBadRegion, strings.Join(a.MemoryTypes(), ", "))
		}
	default:
		return nil, fmt.Errorf("%s: register %s region at %#x: %w: unknown memory kind", a, r.Kind, r.Base, kvcache.ErrBadRegion)
	}
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: register: %w", a, rdma.ErrAgentClosed)
	}
	c := &call{region: r, source: source, done: make(chan struct{})}
	if !a.w.call(reqRegister, c) {
		return nil, fmt.Errorf("%s: register: %w", a, rdma.ErrAgentClosed)
	}
	if c.err != nil {
		return nil, c.err
	}
	return c.reg, nil
}

// Alloc allocates an n-byte host region from UCX (ucp_mem_map with
// UCP_MEM_MAP_ALLOCATE): UCX places it where its transports reach it best,
// on this host a shared-memory segment that peers of the host map and
// write into with one memory copy (any host region works as a destination;
// Go or malloc memory is reached through UCX's software RMA, one copy more).
// Register it with this agent to receive writes. Closing the returned
// Closer frees it once it is deregistered; Close of the agent frees it
// too, after which it must not be touched.
func (a *Agent) Alloc(n uint64) (*kvcache.Region, io.Closer, error) {
	if n == 0 {
		return nil, nil, fmt.Errorf("%s: alloc: %w: length 0", a, kvcache.ErrBadRegion)
	}
	// The region is faulted in whole below: one larger than the memory
	// available would push the host into swap or the OOM killer (and
	// leave UCX's shared-memory file behind) rather than fail.
	if avail, ok := meminfo.Available(); ok && n > avail {
		return nil, nil, fmt.Errorf("%s: alloc %d bytes: %w: the host has %d bytes of memory available (MemAvailable): use a smaller pool",
			a, n, kvcache.ErrBadRegion, avail)
	}
	c := &call{size: n, done: make(chan struct{})}
	if !a.w.call(reqAlloc, c) {
		return nil, nil, fmt.Errorf("%s: alloc: %w", a, rdma.ErrAgentClosed)
	}
	if c.err != nil {
		return nil, nil, c.err
	}
	// Faulted in now, as shm.NewRegion's memory is, rather than a page at
	// a time under the first transfers.
	prefault(uintptr(c.region.Base), c.region.Len)
	return c.region, allocCloser{a: a, region: c.region}, nil
}

type allocCloser struct {
	a      *Agent
	region *kvcache.Region
}

func (c allocCloser) Close() error {
	fc := &call{region: c.region, done: make(chan struct{})}
	if !c.a.w.call(reqFree, fc) {
		return nil // the agent closed and freed it
	}
	return fc.err
}

// Deregister revokes reg at every linked peer, then unmaps it. With batches
// of this agent reading it, or of a peer writing into it, it fails with
// rdma.ErrRegionBusy and changes nothing.
func (a *Agent) Deregister(reg rdma.Registration) error { return a.DeregisterBy(reg, time.Time{}) }

// DeregisterBy is Deregister that waits for its peers' answers until by at
// the latest (zero: the revoke timeout, WithRevokeTimeout), so that a
// caller's deadline bounds it: a peer that has not answered by then makes
// the region busy, as at the timeout.
func (a *Agent) DeregisterBy(reg rdma.Registration, by time.Time) error {
	r, ok := reg.(*registration)
	if !ok || r == nil || r.a != a {
		return fmt.Errorf("%s: deregister %T: %w: not a registration of this agent", a, reg, rdma.ErrUnregistered)
	}
	c := &call{reg: r, by: by, done: make(chan struct{})}
	if !a.w.call(reqDeregister, c) {
		return fmt.Errorf("%s: deregister registration %d: %w: the agent closed", a, r.id, rdma.ErrUnregistered)
	}
	return c.err
}

// Connect links with the peer agent (once per peer: a handshake over UCP
// active messages) and opens a UCP endpoint to it.
func (a *Agent) Connect(peer []byte) (rdma.Endpoint, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	pa, err := parseAddress(peer)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", a, err)
	}
	c := &call{addr: address{id: pa.id, pub: pa.pub, spub: pa.spub, worker: append([]byte(nil), pa.worker...)}, done: make(chan struct{})}
	if !a.w.call(reqConnect, c) {
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	if c.err != nil {
		return nil, c.err
	}
	return c.ep, nil
}

var (
	_ rdma.ExitProofTaker   = (*Agent)(nil)
	_ rdma.SourceRegisterer = (*Agent)(nil)
)

// PeerExited takes a proof, found outside UCX, that the process of the
// peer agent at addr, which serves identity, has exited (a node's pidfd
// on a process of this host seen mapping this agent's Alloc memory):
// rdma.ExitProofTaker. The caller vouches that the peer wrote into this
// agent's memory over UCX's shared-memory transports, where a put into
// Alloc memory is a copy by one of the writer's own threads, which ends
// with its process; over tcp, or into memory registered with ucp_mem_map
// (UCX's software RMA), what the peer queued is applied by this agent's
// worker after its exit, and the proof covers none of it.
//
// So a link to the peer that failed without proof (an unanswered hello,
// an error UCX reported on its control endpoint) no longer keeps
// deregistrations of Alloc memory busy, nor Close from unmapping it;
// memory registered with ucp_mem_map stays as unproven as before. A link
// still up fails (Connect and Post to the peer fail with
// rdma.ErrPeerGone). The link's hello must have named identity (sealed
// under its key, WithIdentity): a proof for another peer, or for an
// agent that named none, releases nothing and returns an error wrapping
// rdma.ErrBadAddress. No link to the agent: nil, nothing to release.
func (a *Agent) PeerExited(addr []byte, identity, how string) error {
	pa, err := parseAddress(addr)
	if err != nil {
		return fmt.Errorf("%s: peer exited: %w", a, err)
	}
	c := &call{addr: address{id: pa.id}, ident: identity, how: how, done: make(chan struct{})}
	if !a.w.call(reqPeerExited, c) {
		return fmt.Errorf("%s: peer exited: %w", a, rdma.ErrAgentClosed)
	}
	return c.err
}

// PeerDrained takes the statement of the peer agent at addr, which
// serves identity, that every write into this agent's memory it made is
// over: its node's engine read its last frame and drained every write it
// started (a drained goodbye on the control link, as kvxfer's
// Engine.WritesOver reports it); how names the proof for the errors. The
// caller vouches that the peer agent writes only for the engine
// incarnation that made the statement (a node's agent serves its one
// engine) and that the statement came on a link authenticated for that
// incarnation. It is the proof the peer's bye gives: a link to the peer
// that failed without proof (an unanswered hello's timeout, an error UCX
// reported on its control endpoint), before or after, no longer keeps
// deregistrations busy, nor Close from unmapping memory, whether
// allocated (Alloc) or registered with ucp_mem_map (every write the peer
// posted completed, or never reached the wire); nor does a bye of this
// agent it leaves unacknowledged. A link still up stays up. It covers
// nothing of this agent's own writes into the peer. The link's hello must
// have named identity, as for PeerExited: else an error wrapping
// rdma.ErrBadAddress, and nothing is released. No link to the agent:
// nil, nothing to release.
func (a *Agent) PeerDrained(addr []byte, identity, how string) error {
	pa, err := parseAddress(addr)
	if err != nil {
		return fmt.Errorf("%s: peer drained: %w", a, err)
	}
	c := &call{addr: address{id: pa.id}, ident: identity, how: how, done: make(chan struct{})}
	if !a.w.call(reqPeerDrained, c) {
		return fmt.Errorf("%s: peer drained: %w", a, rdma.ErrAgentClosed)
	}
	return c.err
}

// KeepMemory has Close leave the memory this agent allocated (Alloc)
// mapped, and its UCX context alive, for the rest of the process. A node
// whose close could not prove every peer's writes over calls it first: a
// late write may still reach that memory (a peer on this host writes by
// address over cma), which must then never be unmapped and reused.
func (a *Agent) KeepMemory() { a.keep.Store(true) }

// Close closes every endpoint, says goodbye to every linked peer and waits
// for each to acknowledge (it then writes no more into this agent's
// regions), unmaps every registration and destroys the worker and the
// context. When a peer did not acknowledge (doc.go), it keeps the memory
// it allocated and returns an error wrapping rdma.ErrCloseUnproven.
// Idempotent.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		a.closed.Store(true)
		a.mu.Lock()
		eps := make([]*endpoint, 0, len(a.eps))
		for e := range a.eps {
			eps = append(eps, e)
		}
		a.mu.Unlock()
		for _, e := range eps {
			e.requestClose()
		}
		c := &call{done: make(chan struct{})}
		if a.w.call(reqCloseAgent, c) {
			a.closeErr = c.err
		}
		<-a.w.stopped
		// The worker closed every endpoint, including any a racing
		// Connect opened after the snapshot: wait for their callbacks.
		// Such an endpoint whose UCP endpoint closed before the shutdown
		// began (UCX reported it failed) was marked closing by neither
		// the snapshot nor the shutdown, and its dispatcher exits only
		// once it is.
		a.mu.Lock()
		for e := range a.eps {
			eps = append(eps, e)
		}
		clear(a.eps)
		a.mu.Unlock()
		for _, e := range eps {
			e.requestClose()
			e.signal()
			<-e.stopped
		}
		// The worker unmapped what they fill: they end at once.
		a.prefaults.Wait()
		removeLocalAgent(a.id)
	})
	return a.closeErr
}

func (a *Agent) adopt(e *endpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.eps[e] = struct{}{}
}

func (a *Agent) forget(e *endpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.eps, e)
}
