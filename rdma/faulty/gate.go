package faulty

import "sync"

// Gate holds the completions of Slow batches until a test opens it. Safe for
// concurrent use.
type Gate struct {
	mu      sync.Mutex
	open    bool
	waiters []func()
}

// NewGate returns a closed gate.
func NewGate() *Gate { return &Gate{} }

// Open releases every held completion, and every later one at once. The
// releases run on Open's caller; each only queues its batch's Done for the
// endpoint's delivery goroutine.
func (g *Gate) Open() {
	g.mu.Lock()
	g.open = true
	w := g.waiters
	g.waiters = nil
	g.mu.Unlock()
	for _, f := range w {
		f()
	}
}

// Held is the number of completions waiting at the gate.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiters)
}

// wait runs f when the gate is open: now, or on Open.
func (g *Gate) wait(f func()) {
	g.mu.Lock()
	if !g.open {
		g.waiters = append(g.waiters, f)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	f()
}
