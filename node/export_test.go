package node

import (
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
)

// SetPeerUpHook sets peerUpHook (nil: none).
func SetPeerUpHook(f func(self string, rec discovery.Record)) {
	if f == nil {
		peerUpHook.Store(nil)
		return
	}
	peerUpHook.Store(&f)
}

// SetWaitReachedHook sets waitReachedHook (nil: none).
func SetWaitReachedHook(f func(id messages.PeerID)) {
	if f == nil {
		waitReachedHook.Store(nil)
		return
	}
	waitReachedHook.Store(&f)
}

// PeerState is the node's link's PeerState of peer.
func (n *Node) PeerState(peer messages.PeerID) (zmq.PeerState, error) { return n.link.PeerState(peer) }

// SetThisHost makes the cudaipc agents of nodes opened from now on take
// host for this host's identity (pidwatch.Host), until restore is called.
func SetThisHost(host string) (restore func()) {
	old := thisHost
	thisHost = func() (string, error) { return host, nil }
	return func() { thisHost = old }
}

// CallerAllocations is the number of CUDA allocations the node's cudaipc
// agent registers the framework's memory by (0: none, or another backend).
func (n *Node) CallerAllocations() int {
	if a, ok := n.agent.(*oneHostAgent); ok {
		return a.callerAllocs
	}
	return 0
}

// Apply acts on one registry event as the node's membership goroutine
// does: on that goroutine (which then tends the peers it found, as after
// an event of its registry), or here once it ended or without etcd.
func (n *Node) Apply(ev discovery.Event) {
	if n.injected != nil {
		in := injectedEvent{ev: ev, done: make(chan struct{})}
		select {
		case n.injected <- in:
			<-in.done
			return
		case <-n.membershipDone:
		}
	}
	n.apply(ev)
}

// DepartedHellos counts the Hellos the node's link refused as a removed
// incarnation's (zmq.RejectDeparted).
func (n *Node) DepartedHellos() int64 { return n.link.Stats().Rejected[zmq.RejectDeparted] }

// LinkHello is the node's link's Hello of peer.
func (n *Node) LinkHello(peer messages.PeerID) (*messages.Hello, error) { return n.link.Hello(peer) }

// SetPeerStateHook sets peerStateHook (nil: none).
func SetPeerStateHook(f func(id messages.PeerID, st zmq.PeerState, err error) (zmq.PeerState, error)) {
	if f == nil {
		peerStateHook.Store(nil)
		return
	}
	peerStateHook.Store(&f)
}

// SetAwaitHook sets awaitHook (nil: none).
func SetAwaitHook(f func(what string, id messages.PeerID)) {
	if f == nil {
		awaitHook.Store(nil)
		return
	}
	awaitHook.Store(&f)
}
