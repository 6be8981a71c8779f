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
