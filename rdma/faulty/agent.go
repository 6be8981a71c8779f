package faulty

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// Agent wraps an rdma.Agent; its endpoints inject the configured faults.
// Registrations, addresses and keys are the wrapped agent's.
type Agent struct {
	inner rdma.Agent
	cfg   config

	mu     sync.Mutex
	closed bool
	nextEp uint64
	eps    map[*endpoint]struct{}
}

var _ rdma.Agent = (*Agent)(nil)

// New wraps inner. With no fault options it behaves as inner does, except
// that completions pass through the endpoint's delivery goroutine.
func New(inner rdma.Agent, opts ...Option) *Agent {
	a := &Agent{inner: inner, cfg: config{clock: realClock{}}, eps: make(map[*endpoint]struct{})}
	for _, o := range opts {
		o(&a.cfg)
	}
	return a
}

// Backend is "faulty(<wrapped backend>)".
func (a *Agent) Backend() string { return "faulty(" + a.inner.Backend() + ")" }

// Register registers with the wrapped agent.
func (a *Agent) Register(r *kvcache.Region) (rdma.Registration, error) {
	return a.inner.Register(r)
}

// RegisterSource defers to the wrapped agent (rdma.RegisterSource).
func (a *Agent) RegisterSource(r *kvcache.Region) (rdma.Registration, error) {
	return rdma.RegisterSource(a.inner, r)
}

// Deregister refuses with rdma.ErrRegionBusy while a faulty endpoint holds a
// batch that reads or writes reg, else defers to the wrapped agent.
func (a *Agent) Deregister(reg rdma.Registration) error {
	if reg == nil {
		return fmt.Errorf("faulty: deregister: %w: nil registration", rdma.ErrUnregistered)
	}
	holds.mu.Lock()
	defer holds.mu.Unlock()
	if n := held(reg); n > 0 {
		return fmt.Errorf("faulty: deregister: %w: %d batches held", rdma.ErrRegionBusy, n)
	}
	return a.inner.Deregister(reg)
}

// Address is the wrapped agent's address.
func (a *Agent) Address() []byte { return a.inner.Address() }

// Connect connects through the wrapped agent and wraps the endpoint; the
// n-th endpoint of this agent (from 0) draws from PCG(seed, n).
func (a *Agent) Connect(peer []byte) (rdma.Endpoint, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("faulty: connect: %w", rdma.ErrAgentClosed)
	}
	in, err := a.inner.Connect(peer)
	if err != nil {
		return nil, err
	}
	e := newEndpoint(a, in, rand.New(rand.NewPCG(a.cfg.seed, a.nextEp)))
	a.nextEp++
	a.eps[e] = struct{}{}
	return e, nil
}

// Close closes every endpoint, then the wrapped agent. Idempotent.
func (a *Agent) Close() error {
	a.mu.Lock()
	a.closed = true
	eps := make([]*endpoint, 0, len(a.eps))
	for e := range a.eps {
		eps = append(eps, e)
	}
	a.mu.Unlock()
	var errs []error
	for _, e := range eps {
		errs = append(errs, e.Close())
	}
	errs = append(errs, a.inner.Close())
	return errors.Join(errs...)
}

func (a *Agent) forget(e *endpoint) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.eps, e)
}
