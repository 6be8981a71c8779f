package discovery

import (
	"sync"
	"time"
)

var lastIncarnation struct {
	sync.Mutex
	v uint64
}

// NewIncarnation returns an incarnation for a rank that is starting: the
// wall clock in nanoseconds, and above any this process returned before.
// Across restarts it grows as long as the clock does not step back by more
// than a restart takes; the etcd registry refuses a registration whose
// incarnation is not above the one it finds for the rank, so a clock that
// stepped back shows as an error, not as a reused incarnation.
func NewIncarnation() uint64 {
	lastIncarnation.Lock()
	defer lastIncarnation.Unlock()
	v := uint64(time.Now().UnixNano())
	if v <= lastIncarnation.v {
		v = lastIncarnation.v + 1
	}
	lastIncarnation.v = v
	return v
}
