//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/rdma"
)

// OnTheWire reports whether every batch posted on ep so far was handed to
// UCX (none waits in the progress goroutine's queue).
func OnTheWire(ep rdma.Endpoint) bool {
	e := ep.(*endpoint)
	e.mu.Lock()
	posted := e.posted
	e.mu.Unlock()
	return e.issuedSeq.Load() == posted
}

// MemAvailable is memAvailable, for tests.
var MemAvailable = meminfo.Available

// Connecting reports how many of a's links wait for the peer's answer to
// their hello.
func Connecting(a *Agent) int {
	n := 0
	a.w.do(func() {
		for _, l := range a.w.links {
			if l.getState() == linkConnecting {
				n++
			}
		}
	})
	return n
}

// FailControlEndpoint has a's progress goroutine take an error report
// from UCX (UCS_ERR_ENDPOINT_TIMEOUT, as from the endpoint's error
// callback) for its link's control endpoint to the agent at peer; false
// when a has no such link or endpoint.
func FailControlEndpoint(a *Agent, peer []byte) bool {
	pa, err := parseAddress(peer)
	if err != nil {
		return false
	}
	ok := false
	a.w.do(func() {
		if l := a.w.links[pa.id]; l != nil && l.u != nil {
			a.w.onError(l.u.id, ucsEndpointTimeout)
			ok = true
		}
	})
	return ok
}
