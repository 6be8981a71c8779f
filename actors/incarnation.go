package actors

import (
	"sync"
	"time"
)

// lastIncarnation is the incarnation nextIncarnation gave last in this
// process.
var lastIncarnation struct {
	sync.Mutex
	v uint64
}

// nextIncarnation is a new engine's incarnation: the wall clock at now in
// nanoseconds, but above every incarnation given before in this process,
// so that an engine reopened after the clock stepped back is still a
// later incarnation to its peers and to etcd (which refuse an earlier one).
func nextIncarnation(now time.Time) uint64 {
	lastIncarnation.Lock()
	defer lastIncarnation.Unlock()
	v := uint64(now.UnixNano())
	if v <= lastIncarnation.v {
		v = lastIncarnation.v + 1
	}
	lastIncarnation.v = v
	return v
}
