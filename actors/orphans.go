package actors

import (
	"sync"
	"sync/atomic"
)

// orphanStats is the tx table's orphans as the tx parent last published
// them (txTable.publish, after each call that may change them), for
// Engine.Orphans to read from any goroutine: requests a generation
// instance's RequestData opened that no Send adopted.
type orphanStats struct {
	live, ended atomic.Int64
	v           atomic.Uint64 // the ids' version (written by the tx parent only)
	mu          sync.Mutex
	ids         []string // a copy of core.TxTable.OrphanIDs
}

// OrphanStats are an engine's orphan requests (Engine.Orphans).
type OrphanStats struct {
	// Live: requests a generation instance's RequestData opened that no
	// Send adopted yet.
	Live int64
	// Ended: such requests whose session ended with no Send ever adopting
	// them, since Start.
	Ended int64
	// IDs names the first few orphans no Send adopted, live or ended
	// (core.MaxOrphanIDs at most), in the order they came.
	IDs []string
}

// Orphans returns the requests a generation instance asked this engine
// for that no Send adopted, as the tx parent last published them.
func (e *Engine) Orphans() OrphanStats {
	o := &e.env.orphans
	o.mu.Lock()
	ids := append([]string(nil), o.ids...)
	o.mu.Unlock()
	return OrphanStats{Live: o.live.Load(), Ended: o.ended.Load(), IDs: ids}
}

// publish stores the table's orphans for Engine.Orphans (and the
// metrics); the ids are copied only when they changed.
func (t *txTable) publish() {
	if t.pub == nil {
		return
	}
	t.pub.live.Store(int64(t.OrphansLive()))
	t.pub.ended.Store(t.OrphansEnded())
	ids, v := t.OrphanIDs()
	if v == t.pub.v.Load() {
		return // the common case: no lock
	}
	t.pub.mu.Lock()
	// Into the same array: Orphans copies under the lock, and the list
	// changes twice a request when RequestData comes before Send.
	t.pub.ids = append(t.pub.ids[:0], ids...)
	t.pub.mu.Unlock()
	t.pub.v.Store(v)
}
