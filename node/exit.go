package node

import (
	"os"
	"strings"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// exitHow is the proof's name in the requests' errors.
const exitHow = "process exited (pidfd)"

// exitProves reports whether, on backend, a writer process's exit proves
// that none of its writes can land any more (docs/membership.md §4): shm
// (its mappings die with it) and ucx while UCX may carry a same-host
// peer's writes over shared memory or cma (UCX_TLS unset, or naming such
// a transport; UCX picks them over tcp within a host). Over tcp a dead
// writer's bytes may still wait in this side's socket buffers and be
// applied: no proof. The loopback backend has no other process.
func exitProves(backend string) bool {
	switch backend {
	case shm.Backend:
		return true
	case ucx.Backend:
		return ucxSharedMemory(os.Getenv("UCX_TLS"))
	}
	return false
}

// ucxSharedMemory reports whether a UCX_TLS value leaves UCX a
// shared-memory or cma transport for peers of one host.
func ucxSharedMemory(tls string) bool {
	tls = strings.TrimSpace(tls)
	if tls == "" {
		return true
	}
	names := strings.Split(strings.TrimPrefix(tls, "^"), ",")
	shared := map[string]bool{"all": true, "sm": true, "shm": true, "posix": true, "sysv": true, "cma": true, "xpmem": true, "knem": true}
	if strings.HasPrefix(tls, "^") { // an exclusion list
		for _, n := range names {
			if n = strings.TrimSpace(n); n == "sm" || n == "shm" {
				return false
			}
		}
		return true
	}
	for _, n := range names {
		if shared[strings.TrimSpace(n)] {
			return true
		}
	}
	return false
}

// watchExit runs on the link's listener goroutine for each new Hello: if
// the peer serves this node's backend, names a process of this host and
// pid namespace whose start time matches, and this incarnation is not
// watched yet, the node opens a pidfd for it; when it becomes readable
// the engine gets the proof (Engine.WriterExited) for that incarnation.
// A new incarnation is never a proof by itself: its predecessor's pages
// leave quarantine only by that predecessor's own proof.
func (n *Node) watchExit(h *messages.Hello, eng func() *kvxfer.Engine) {
	if n.pids == nil || h.Incarnation == 0 || h.Backend != n.backend {
		return
	}
	peer, inc := h.From, h.Incarnation
	n.mu.Lock()
	if inc <= n.watched[peer] {
		n.mu.Unlock()
		return
	}
	n.watched[peer] = inc
	n.mu.Unlock()
	lg := n.log.With().Str("peer", peer.String()).Uint64("incarnation", inc).Logger()
	if err := n.pids.Watch(h.Process, func() { n.writerExited(peer, inc, eng) }); err != nil {
		lg.Info().Err(err).Msgf("no proof of death from %s's process: pages it may still write wait for its Result or CancelAck", peer)
		return
	}
	lg.Debug().Uint32("pid", h.Process.Pid).Msg("watching the peer's process (pidfd)")
}

// writerExited reports incarnation inc of peer exited: the engine ends
// the quarantine of the requests addressed to it, and, unless a newer
// incarnation said Hello meanwhile, the application hears the peer is
// down.
func (n *Node) writerExited(peer messages.PeerID, inc uint64, eng func() *kvxfer.Engine) {
	n.exitMu.RLock()
	e := eng()
	if e == nil || n.engDone {
		n.exitMu.RUnlock()
		return
	}
	e.WriterExited(peer, inc, exitHow)
	n.exitMu.RUnlock()
	n.log.Warn().Str("peer", peer.String()).Uint64("incarnation", inc).
		Msgf("peer %s exited (pidfd): its requests fail and their pages leave quarantine", peer)
	if h, err := n.link.Hello(peer); err == nil && h.Incarnation > inc {
		return
	}
	if n.cfg.OnPeerDown != nil {
		n.cfg.OnPeerDown(peer.Instance, int(peer.Rank))
	}
}

// closePids stops the pidfd watches.
func (n *Node) closePids() {
	if n.pids != nil {
		n.pids.Close()
	}
}
