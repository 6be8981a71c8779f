package faulty

import (
	"sync"

	"github.com/kvxfer/kvxfer/rdma"
)

// holds counts, process-wide, the batches that faulty endpoints accepted and
// have not delivered, per source registration and per destination key, so
// that Deregister on any faulty agent refuses a region such a batch holds.
var holds = struct {
	mu sync.Mutex
	n  map[any]int
}{n: make(map[any]int)}

// dstKey is the holds key of a destination.
type dstKey string

func hold(src rdma.Registration, dst []byte) {
	holds.mu.Lock()
	defer holds.mu.Unlock()
	holds.n[src]++
	holds.n[dstKey(dst)]++
}

func unhold(src rdma.Registration, dst []byte) {
	holds.mu.Lock()
	defer holds.mu.Unlock()
	for _, k := range []any{src, dstKey(dst)} {
		if holds.n[k]--; holds.n[k] <= 0 {
			delete(holds.n, k)
		}
	}
}

// held is the number of undelivered batches that read or write reg. Called
// with holds.mu held.
func held(reg rdma.Registration) int {
	return holds.n[reg] + holds.n[dstKey(reg.Remote().Key)]
}
