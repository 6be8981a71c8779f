package loopback

import (
	"sync"
)

// Network is a set of agents that can reach each other by address. Agents
// of different networks cannot connect. The zero value is not usable; use
// NewNetwork.
type Network struct {
	mu     sync.Mutex
	next   uint64
	agents map[uint64]*Agent
}

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{agents: make(map[uint64]*Agent)}
}

// defaultNetwork is the process-wide network used when no WithNetwork
// option is given.
var defaultNetwork = NewNetwork()

func (n *Network) add(a *Agent) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	a.id = n.next
	n.agents[a.id] = a
}

func (n *Network) remove(a *Agent) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.agents, a.id)
}

func (n *Network) lookup(id uint64) *Agent {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.agents[id]
}
