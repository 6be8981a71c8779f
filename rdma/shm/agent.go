package shm

import (
	"crypto/rand"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
	"github.com/kvxfer/kvxfer/rdma/internal/host"
)

// Backend is the shm backend's name.
const Backend = "shm"

// Agent is a shared-memory rdma.Agent. It is safe for concurrent use.
type Agent struct {
	addr  address
	bytes []byte // addr, encoded

	closed    atomic.Bool
	closeOnce sync.Once

	mu      sync.Mutex
	nextReg uint64
	nextEp  uint64
	regs    map[*registration]struct{}
	eps     map[*endpoint]struct{}
}

var _ rdma.Agent = (*Agent)(nil)

// New starts an agent of this process.
func New() *Agent {
	a := &Agent{
		regs: make(map[*registration]struct{}),
		eps:  make(map[*endpoint]struct{}),
	}
	a.addr.pid = os.Getpid()
	rand.Read(a.addr.nonce[:])
	a.bytes = []byte(a.addr.String())
	return a
}

// Backend returns "shm".
func (a *Agent) Backend() string { return Backend }

// CompletionsDeliver is true (rdma.Delivering): the copier's goroutine
// copies into the peer's shared mapping before it calls Done; a Flush is
// only a marker behind the copies.
func (a *Agent) CompletionsDeliver() bool { return true }

// Address returns "shm:<pid>:<nonce>".
func (a *Agent) Address() []byte { return append([]byte(nil), a.bytes...) }

func (a *Agent) String() string { return a.addr.String() }

// Register registers a host region. A region made by NewRegion gets a fresh
// secret in its file header and a key peers can write through; any other
// host region is private: usable as a source by this agent's endpoints, and
// refused (rdma.ErrBadKey) as a destination. A shared region registers with
// one agent at a time.
func (a *Agent) Register(r *kvcache.Region) (rdma.Registration, error) {
	if r == nil {
		return nil, fmt.Errorf("%s: register: %w: nil region", a, kvcache.ErrBadRegion)
	}
	b := r.Bytes()
	if b == nil {
		return nil, fmt.Errorf("%s: register %s region at %#x (%d bytes): %w: only host memory can be shared by the shm backend",
			a, r.Kind, r.Base, r.Len, kvcache.ErrBadRegion)
	}
	reg := &registration{agent: a, region: r, bytes: b[:r.Len:r.Len], remote: rdma.RemoteRegion{Len: r.Len}}

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: register: %w", a, rdma.ErrAgentClosed)
	}
	a.nextReg++
	reg.id = a.nextReg
	if f := lookupFile(r); f != nil {
		if err := a.share(reg, f); err != nil {
			return nil, err
		}
	} else {
		reg.lease = &reg.own
		reg.remote.Key = regionKey{kind: kindPrivate, owner: a.addr.nonce, reg: reg.id}.encode()
	}
	a.regs[reg] = struct{}{}
	return reg, nil
}

// share makes reg the registration of f: a new secret and owner in the
// header, then the lease live. Called with a.mu held.
func (a *Agent) share(reg *registration, f *sharedFile) error {
	files.mu.Lock()
	defer files.mu.Unlock()
	switch {
	case f.closed:
		return fmt.Errorf("%s: register %s: %w: region closed", a, f.path, kvcache.ErrBadRegion)
	case f.registered:
		return fmt.Errorf("%s: register %s: %w: already registered", a, f.path, rdma.ErrRegionBusy)
	}
	f.reclaim() // slots of writers that died since: free for new ones
	k := regionKey{kind: kindFile, owner: a.addr.nonce, fileID: f.hdr.fileID, name: []byte(f.name)}
	rand.Read(k.secret[:])
	f.hdr.setSecret(k.secret)
	f.hdr.setOwner(a.addr.nonce)
	f.hdr.lease.Renew() // secret and owner first: whoever acquires sees them
	f.registered = true
	reg.file = f
	reg.lease = &f.hdr.lease
	reg.remote.Key = k.encode()
	reg.remote.Len = f.dataLen // writers address file offsets, spare included
	return nil
}

// Deregister revokes reg. With batches of any live process in flight from
// or into it, it fails with rdma.ErrRegionBusy and changes nothing. The
// batches of writers proven dead are released first (sharedFile.reclaim):
// they cannot land any more.
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
	if !r.lease.TryRetire() {
		var why string
		if f := r.file; f != nil {
			files.mu.Lock()
			why = f.reclaim().String()
			files.mu.Unlock()
		}
		if !r.lease.TryRetire() {
			return fmt.Errorf("%s: deregister registration %d: %w: %d batches in flight%s", a, r.id, rdma.ErrRegionBusy, r.lease.InFlight(), why)
		}
	}
	r.revoke()
	if f := r.file; f != nil {
		files.mu.Lock()
		f.hdr.setSecret([16]byte{})
		f.registered = false
		files.mu.Unlock()
	}
	delete(a.regs, r)
	return nil
}

// ReclaimDead releases the batches that writers proven dead left in
// flight in every region this agent has registered, and frees their
// writer slots (sharedFile.reclaim), so that the slots of writers that
// died without closing (killed, crashed) do not fill the table while the
// region stays registered; it returns how many writers' slots it freed.
// An owner calls it when it learns that a writer's process exited (a
// node: from the writer's pidfd); Register and a busy Deregister reclaim
// too. A live writer's slot is never touched (copier.ReclaimDead).
func (a *Agent) ReclaimDead() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	freed := 0
	files.mu.Lock()
	defer files.mu.Unlock()
	for r := range a.regs {
		if f := r.file; f != nil && !f.closed {
			freed += f.reclaim().Slots
		}
	}
	return freed
}

// Connect opens an endpoint to the agent at peer. It fails with
// rdma.ErrPeerGone when the peer's process does not exist.
func (a *Agent) Connect(peer []byte) (rdma.Endpoint, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	pa, err := parseAddress(peer)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", a, err)
	}
	if pa.pid != a.addr.pid && host.ProcessGone(pa.pid) {
		return nil, fmt.Errorf("%s: connect %s: %w: no process %d", a, pa, rdma.ErrPeerGone, pa.pid)
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil, fmt.Errorf("%s: connect: %w", a, rdma.ErrAgentClosed)
	}
	a.nextEp++
	e := &endpoint{agent: a, peer: pa, maps: make(map[[16]byte]*mapping)}
	e.name = fmt.Sprintf("shm endpoint %d of %s → %s", a.nextEp, a, pa)
	e.cp = copier.New(e.name)
	a.eps[e] = struct{}{}
	return e, nil
}

// Close closes every endpoint (waiting for their copies to stop, then
// unmapping), and revokes every registration: peers' later posts into them
// fail with rdma.ErrPeerGone. Idempotent.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		a.mu.Lock()
		a.closed.Store(true)
		eps := make([]*endpoint, 0, len(a.eps))
		for e := range a.eps {
			eps = append(eps, e)
		}
		a.mu.Unlock()

		for _, e := range eps {
			e.Close()
		}

		a.mu.Lock()
		defer a.mu.Unlock()
		for r := range a.regs {
			r.revoke()
			r.lease.ForceRetire(true)
			if f := r.file; f != nil {
				files.mu.Lock()
				f.registered = false
				files.mu.Unlock()
			}
			delete(a.regs, r)
		}
	})
	return nil
}

func (a *Agent) forget(e *endpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.eps, e)
}
