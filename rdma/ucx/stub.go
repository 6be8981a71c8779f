//go:build !cgo || !linux || kvxfer_noucx

package ucx

import (
	"errors"
	"fmt"
	"io"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// Backend is the ucx backend's name.
const Backend = "ucx"

// Available says whether this binary has the ucx backend.
const Available = false

// ErrUnavailable: this binary was built without the ucx backend (no cgo,
// not Linux, or the kvxfer_noucx tag).
var ErrUnavailable = errors.New("ucx: backend not built in (needs cgo on Linux and UCX's headers and libraries through pkg-config)")

// Agent is the ucx backend's agent; in this build New always fails.
type Agent struct{}

var _ rdma.Agent = (*Agent)(nil)

// New fails with ErrUnavailable.
func New(...Option) (*Agent, error) { return nil, ErrUnavailable }

func (*Agent) Backend() string { return Backend }
func (*Agent) Register(*kvcache.Region) (rdma.Registration, error) {
	return nil, fmt.Errorf("%w", ErrUnavailable)
}
func (*Agent) RegisterSource(*kvcache.Region) (rdma.Registration, error) {
	return nil, fmt.Errorf("%w", ErrUnavailable)
}
func (*Agent) Deregister(rdma.Registration) error    { return ErrUnavailable }
func (*Agent) Address() []byte                       { return nil }
func (*Agent) Connect([]byte) (rdma.Endpoint, error) { return nil, ErrUnavailable }
func (*Agent) Close() error                          { return nil }

// Alloc fails with ErrUnavailable.
func (*Agent) Alloc(uint64) (*kvcache.Region, io.Closer, error) { return nil, nil, ErrUnavailable }

// MemoryTypes is empty.
func (*Agent) MemoryTypes() []string { return nil }
