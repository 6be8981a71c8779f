package node

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
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
//
// For ucx this reads the configuration, not the transports an endpoint
// uses: UCX 1.13's ucp_ep_query reports only an endpoint's name and
// socket addresses (UCP_EP_ATTR_FIELD_TRANSPORTS came in a later UCX).
// On top of it, an exit counts only for a process tied to this node's
// pool (watch.tied).
//
// cudaipc: no proof. A cudaipc writer does not copy with its own threads:
// it enqueues cuMemcpyDtoDAsync on a stream, and the GPU's copy engines
// run the copy, asynchronously to every thread of the process. A pidfd
// says only that the threads are gone. The CUDA driver API documents what
// a process's exit does to its context's pending work nowhere: neither
// cuCtxDestroy's nor cuIpcOpenMemHandle's documentation says that copies
// queued into an imported allocation are finished or discarded by the
// time the process's exit is visible to another process (teardown of the
// context may still be under way in the driver after the last thread
// exited, and the exporter's allocation stays valid while any importer
// maps it). That is the driver's behaviour, not its contract, and a
// measurement on one GPU and driver would not make it one. So a cudaipc
// writer's exit is not taken as proof: the pages of its failed requests
// stay quarantined until its Result or CancelAck (docs/membership.md §4,
// "cudaipc"). Nor could the node tie a process to its pool as it does on
// shm: device memory is no shared mapping of a file that a writer's
// /proc/<pid>/maps would show.
func exitProves(backend string) bool {
	switch backend {
	case shm.Backend:
		return true
	case ucx.Backend:
		return ucxSharedMemory(os.Getenv("UCX_TLS"))
	}
	return false // cudaipc (above), loopback (no other process)
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

// exitSink is where a proven exit goes: the node's engine.
type exitSink interface {
	WriterProven(peer messages.PeerID, inc uint64, kind kvxfer.ProofKind, how string) (int, error)
	WriterRequests(peer messages.PeerID, inc uint64) (int, error)
	PeerIncarnationDown(peer messages.PeerID, inc uint64, why string)
}

// engineSink returns the engine engp holds, or nil before it starts.
func engineSink(engp *atomic.Pointer[kvxfer.Engine]) func() exitSink {
	return func() exitSink {
		if e := engp.Load(); e != nil {
			return e
		}
		return nil
	}
}

// maxTieMisses is how many successful Results of a peer may arrive while
// the process its Hello names does not map this node's pool before the
// node stops checking (and that process's exit stays no proof).
const maxTieMisses = 4

// watch is one watched incarnation of a peer.
type watch struct {
	peer messages.PeerID
	inc  uint64
	pid  uint32
	proc messages.ProcessID
	// agent is the data-plane agent address the Hello named (the ucx
	// agent's proof goes to it: rdma.ExitProofTaker).
	agent []byte
	// proves: its exit may be proof for the peer's writes (watchExit);
	// else it says only that the peer is down.
	proves bool
	// tied: the process was seen, alive, mapping this node's pool shared
	// and writable; disputed: another peer's Hello names the same
	// process. Its exit is proof for the peer's writes only when tied and
	// not disputed.
	tied     atomic.Bool
	disputed atomic.Bool
	// ended: no exit of the process will be reported from this watch
	// (Watch failed, or writerExited runs). Until then the process may
	// still be the peer's writer, and its Hello still names it.
	ended atomic.Bool
	// earlier are the watches of the peer's earlier incarnations that
	// this one superseded and that had not ended then, under Node.mu:
	// their Hellos still name their processes (a rolling restart's
	// predecessor lives on, mapping the pool), so a peer naming one of
	// them disputes it as it would a current one.
	earlier []*watch
	// forgotten, under Node.mu: the peer's departure was forgotten
	// (notePastLocked) while a process of it could still exit; the watch
	// goes once none can (writerExited).
	forgotten bool
	// Under Node.tieMu: the pidfd's Proc (nil until Watch returned), how
	// many checks after a Result found no mapping, and whether the node
	// stopped checking (tied or given up).
	pidfd  *pidwatch.Proc
	misses int
	done   bool
}

// watchExit runs on the link's listener goroutine for each new Hello: if
// the peer names a process of this host and pid namespace whose start
// time matches, and this incarnation is not watched yet, the node opens a
// pidfd for it, whatever the backend. Where the peer serves this node's
// backend and the node's pool can be tied to a process (watchPools:
// poolFile), the exit is the engine's proof (Engine.WriterProven) for
// that incarnation when it becomes readable — provided the process was
// seen, while alive, mapping this node's pool (tie; checked here and
// after each successful Result of the peer). A peer's word names a
// process, the mapping proves it is one that can write into the pool. A
// new incarnation is never a proof by itself: its predecessor's pages
// leave quarantine only by that predecessor's own proof. Elsewhere (a
// send-only node, another backend) the watch is for liveness only: the
// exit takes that incarnation down at once instead of after missed
// heartbeats (writerExited).
func (n *Node) watchExit(h *messages.Hello, eng func() exitSink) {
	if n.pids == nil || h.Incarnation == 0 {
		return
	}
	// proves: the exit may be proof for the peer's writes (once tied);
	// else it is liveness news only, and nothing is checked.
	proves := n.poolFile != (pidwatch.File{}) && h.Backend == n.backend
	peer, inc := h.From, h.Incarnation
	w := &watch{peer: peer, inc: inc, pid: h.Process.Pid, proc: h.Process, agent: slices.Clone(h.AgentAddr), proves: proves, done: !proves}
	n.mu.Lock()
	old := n.watched[peer]
	if old != nil && inc <= old.inc {
		n.mu.Unlock()
		return
	}
	if old != nil {
		w.earlier = old.pending()
		old.earlier = nil
	}
	n.watched[peer] = w
	for p, cur := range n.watched {
		if !proves || h.Process.IsZero() {
			break
		}
		if p == peer {
			continue
		}
		// Two peers naming one process: at most one says the truth, and
		// the mapping cannot tell which; neither exit is proof. An
		// earlier incarnation still watched names its process too: its
		// exit would be proof for it.
		both := false
		for _, o := range append([]*watch{cur}, cur.earlier...) {
			if o.proves && o.proc == h.Process {
				w.disputed.Store(true)
				o.disputed.Store(true)
				both = true
			}
		}
		if both {
			n.log.Warn().Str("peer", peer.String()).Str("other", p.String()).Uint32("pid", h.Process.Pid).
				Msgf("peers %s and %s both name process %d as theirs: its exit will not count as proof for either", peer, p, h.Process.Pid)
		}
	}
	n.mu.Unlock()
	n.tieMu.Lock()
	if old != nil && !old.done {
		old.done = true
		n.untied.Add(-1)
	}
	if proves {
		n.untied.Add(1)
	}
	n.tieMu.Unlock()
	lg := n.log.With().Str("peer", peer.String()).Uint64("incarnation", inc).Logger()
	pidfd, err := n.pids.Watch(h.Process, func() { n.writerExited(w, eng) })
	if err != nil {
		w.ended.Store(true)
	}
	n.tieMu.Lock()
	w.pidfd = pidfd
	if err != nil && !w.done {
		w.done = true
		n.untied.Add(-1)
	}
	n.tieMu.Unlock()
	switch {
	case err != nil && proves:
		lg.Info().Err(err).Msgf("no proof of death from %s's process: pages it may still write wait for its Result or CancelAck", peer)
		return
	case err != nil:
		lg.Debug().Err(err).Msgf("%s's process is not watched: heartbeats tell when it is down", peer)
		return
	}
	lg.Debug().Uint32("pid", h.Process.Pid).Bool("proof", proves).Msg("watching the peer's process (pidfd)")
	n.tie(w, false)
}

// pending are w and the watches it superseded whose processes' exits may
// still be reported (not ended). Callers hold Node.mu.
func (w *watch) pending() []*watch {
	var out []*watch
	for _, o := range w.earlier {
		if !o.ended.Load() {
			out = append(out, o)
		}
	}
	if !w.ended.Load() {
		out = append(out, w)
	}
	return out
}

// onFrame runs on the link's listener goroutine before a frame is
// delivered: a successful Result with bytes says its writer has written
// into this node's pool, so the process its Hello names, if it is the
// writer, maps the pool now (shm endpoints and UCX rkeys keep their
// mappings until they close). Checked before the Result reaches the
// engine, so that an application that sees the request READY and then
// kills the writer finds it tied. Free once every watch is tied.
func (n *Node) onFrame(f messages.Frame) {
	r, ok := f.(*messages.Result)
	if !ok || r.Status != messages.StatusSuccess || r.Bytes == 0 || n.untied.Load() == 0 {
		return
	}
	n.mu.Lock()
	w := n.watched[r.From]
	n.mu.Unlock()
	if w != nil {
		n.tie(w, true)
	}
}

// tie checks whether w's process maps this node's pool; wrote says the
// peer has written into it (a miss then counts toward maxTieMisses).
func (n *Node) tie(w *watch, wrote bool) {
	n.tieMu.Lock()
	defer n.tieMu.Unlock()
	if w.done || w.pidfd == nil {
		return
	}
	lg := n.log.With().Str("peer", w.peer.String()).Uint64("incarnation", w.inc).Uint32("pid", w.pid).Logger()
	ok, err := w.pidfd.MapsShared(n.poolFile)
	switch {
	case ok:
		w.tied.Store(true)
		lg.Debug().Msgf("the peer's process maps this node's pool (%s): its exit will be proof", n.poolFile)
	case errors.Is(err, pidwatch.ErrExited):
		return // its exit decides
	case err != nil:
		lg.Warn().Err(err).Msgf("cannot tell whether %s's process %d maps this node's pool: its exit will not count as proof", w.peer, w.pid)
	case !wrote:
		return
	default:
		if w.misses++; w.misses < maxTieMisses {
			return
		}
		lg.Warn().Msgf("peer %s wrote into this node's pool, but the process %d its Hello names does not map it (%s): that process's exit will not count as proof that the peer's writes are over", w.peer, w.pid, n.poolFile)
	}
	w.done = true
	n.untied.Add(-1)
}

// deadReclaimer is an agent that can release what writers proven dead
// left counted in its regions (shm.Agent.ReclaimDead).
type deadReclaimer interface{ ReclaimDead() int }

// writerExited reports that the process of w exited. If it was tied to
// this node's pool, the agent gets the proof for the peer's agent (a ucx
// agent keeps the pool mapped while its link to that agent failed
// without proof: rdma.ExitProofTaker) and the engine ends the quarantine
// of the requests addressed to that incarnation. If not, the exit proves
// nothing about the peer's writes: its pages stay quarantined until
// another proof. A tied exit, and the exit of a process watched for
// liveness only (!w.proves: a send-only node's generation peer, a peer
// of another backend), takes that incarnation down at once
// (Engine.PeerIncarnationDown, the path missed heartbeats take, naming
// the exit): the requests with it fail, and this node's own writes to it
// drain before their sources are released, as on any Down; a later
// incarnation's requests go on. Unless a newer incarnation said Hello
// meanwhile, the application then hears the peer is down. An exit that
// could be proof but is not (never tied, or disputed) leaves liveness to
// heartbeats. Logged at warn only when requests of the peer were live or
// quarantined.
func (n *Node) writerExited(w *watch, eng func() exitSink) {
	w.ended.Store(true)
	peer, inc := w.peer, w.inc
	n.mu.Lock()
	if cur := n.watched[peer]; cur != nil && cur.forgotten && len(cur.pending()) == 0 {
		// Its departure was forgotten while this process lived: with its
		// exit, no exit of the peer's processes can come any more.
		delete(n.watched, peer)
	}
	n.mu.Unlock()
	tied := w.tied.Load() && !w.disputed.Load()
	if x, ok := n.agent.(rdma.ExitProofTaker); ok && tied && len(w.agent) > 0 {
		// Before the engine's part, and whether or not the engine still
		// runs: the agent's Close, after the engine's, needs it. Node.Close
		// closes the agent only after the watches' callbacks returned.
		if err := x.PeerExited(w.agent, peer.String(), exitHow); err != nil {
			n.log.Warn().Err(err).Str("peer", peer.String()).Uint64("incarnation", inc).Uint32("pid", w.pid).
				Msgf("peer %s's process %d exited, but its agent did not take the proof: what that agent keeps mapped for it stays", peer, w.pid)
		}
	}
	if a, ok := n.agent.(deadReclaimer); ok {
		// Its writer slots in this node's pool file: a writer that died
		// with batches in flight (or without closing) would otherwise
		// hold one until this node's pool is deregistered, and once the
		// table is full a later writer's death would keep the pool busy.
		if freed := a.ReclaimDead(); freed > 0 {
			n.log.Debug().Int("slots", freed).Msgf("peer %s's process %d exited: writer slots of dead writers freed", peer, w.pid)
		}
	}
	n.exitMu.RLock()
	e := eng()
	if e == nil || n.engDone {
		n.exitMu.RUnlock()
		return
	}
	var reqs int
	var err error
	if tied {
		// First: the requests it proves fail naming the proof.
		reqs, err = e.WriterProven(peer, inc, kvxfer.ProofPidfdExit, exitHow)
	} else {
		reqs, err = e.WriterRequests(peer, inc)
	}
	// down: the exit takes the incarnation down here, at once, as missed
	// heartbeats would later (Engine.PeerIncarnationDown): its death is
	// certain, not suspected. It is no proof that this node's writes to
	// it are over: those drain as on any Down. An exit that could be
	// proof but is not (the process never seen mapping this node's pool,
	// or named by two peers) leaves liveness to heartbeats, as before.
	down := tied || !w.proves
	if down {
		e.PeerIncarnationDown(peer, inc, fmt.Sprintf("exited (its process %d is gone: pidfd)", w.pid))
	}
	n.exitMu.RUnlock()
	lg := n.log.With().Str("peer", peer.String()).Uint64("incarnation", inc).Uint32("pid", w.pid).Int("requests", reqs).Logger()
	switch {
	case errors.Is(err, kvxfer.ErrClosed):
		// This node's engine is closing (its Close began before engDone
		// is set): nothing of it waits for the proof any more.
		lg.Debug().Err(err).Msgf("peer %s's process %d exited as this node's engine closes", peer, w.pid)
	case err != nil:
		lg.Warn().Err(err).Msgf("peer %s's process %d exited; the engine did not answer", peer, w.pid)
	case !down && reqs == 0:
		lg.Info().Msgf("peer %s's process %d exited; no request of it is live here", peer, w.pid)
	case !down:
		lg.Warn().Msgf("peer %s's process %d exited, but it was never seen mapping this node's pool, or another peer names it too: no proof that %s's writes are over; its %d requests here keep their pages quarantined until another proof",
			peer, w.pid, peer, reqs)
	case !tied && reqs == 0:
		lg.Info().Msgf("peer %s's process %d exited: it is down, its requests here fail", peer, w.pid)
	case !tied:
		lg.Warn().Msgf("peer %s's process %d exited: it is down, its requests here fail; its exit is no proof that its writes are over: its %d requests here keep their pages quarantined until another proof",
			peer, w.pid, reqs)
	case reqs == 0:
		lg.Info().Msgf("peer %s exited (pidfd); no request of it was live here", peer)
	default:
		lg.Warn().Msgf("peer %s exited (pidfd): its %d requests here fail and their pages leave quarantine", peer, reqs)
	}
	if !down {
		return
	}
	n.mu.Lock()
	latest := n.watched[peer]
	n.mu.Unlock()
	if latest != nil && latest.inc > inc {
		return // a restart said Hello: the peer is up
	}
	if succeeded(n.link, peer, inc) {
		return
	}
	if n.cfg.OnPeerDown != nil {
		n.cfg.OnPeerDown(peer.Instance, int(peer.Rank))
	}
}

// drainedHow is the drained goodbye's proof, named in the requests' errors.
const drainedHow = "it closed after draining its writes (goodbye)"

// drainProofTaker is an agent that takes a drained goodbye as proof that
// the peer agent's writes into its memory are over (ucx.Agent.PeerDrained).
type drainProofTaker interface {
	PeerDrained(addr []byte, identity, how string) error
}

// helloAgent is the agent address a peer's Hello named, for incarnation inc.
type helloAgent struct {
	inc  uint64
	addr []byte
}

// noteAgent records the agent address h names (the link's listener
// goroutine, for each new Hello) where the node's agent takes drained
// goodbyes; an earlier incarnation's Hello does not replace a later one's.
func (n *Node) noteAgent(h *messages.Hello) {
	if _, ok := n.agent.(drainProofTaker); !ok || h.Incarnation == 0 || len(h.AgentAddr) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.agents[h.From]; ok && old.inc > h.Incarnation {
		return
	}
	n.agents[h.From] = helloAgent{inc: h.Incarnation, addr: slices.Clone(h.AgentAddr)}
}

// writerDrained takes a drained goodbye of incarnation inc of peer (the
// link told it after the goodbye's Down: zmq.Config.OnPeerDrained): its
// node closed after its engine stopped reading frames and drained every
// write it started (kvxfer.Engine.WritesOver), which proves, as its
// process's exit would, that none of its writes can land any more. The
// agent, where it takes the proof (drainProofTaker: the ucx agent), hears
// it first for the agent address that incarnation's Hello named, whether
// or not the engine still runs (as for a pidfd exit): the peer agent's
// writes into this node's memory are over, and what the agent kept for
// a link to it that failed without proof is released. Then the engine
// ends the quarantine of the requests addressed to that incarnation
// (Engine.WriterProven), as for a pidfd exit, unless it is closing
// (engDone). It runs on the link's listener goroutine.
func (n *Node) writerDrained(peer messages.PeerID, inc uint64, eng func() exitSink) {
	if x, ok := n.agent.(drainProofTaker); ok {
		n.mu.Lock()
		ha, known := n.agents[peer]
		n.mu.Unlock()
		if known && ha.inc == inc {
			if err := x.PeerDrained(ha.addr, peer.String(), drainedHow); err != nil {
				n.log.Warn().Err(err).Str("peer", peer.String()).Uint64("incarnation", inc).
					Msgf("peer %s closed after draining its writes, but its agent did not take the proof: what that agent keeps mapped for it stays", peer)
			}
		}
	}
	n.exitMu.RLock()
	e := eng()
	if e == nil || n.engDone {
		n.exitMu.RUnlock()
		return
	}
	reqs, err := e.WriterProven(peer, inc, kvxfer.ProofDrainedGoodbye, drainedHow)
	n.exitMu.RUnlock()
	lg := n.log.With().Str("peer", peer.String()).Uint64("incarnation", inc).Int("requests", reqs).Logger()
	switch {
	case errors.Is(err, kvxfer.ErrClosed):
		lg.Debug().Err(err).Msgf("peer %s closed after draining its writes as this node's engine closes", peer)
	case err != nil:
		lg.Warn().Err(err).Msgf("peer %s closed after draining its writes; the engine did not answer", peer)
	case reqs == 0:
		lg.Info().Msgf("peer %s closed after draining its writes (goodbye); no request of it was live here", peer)
	default:
		lg.Warn().Msgf("peer %s closed after draining its writes (goodbye): its %d requests here fail and their pages leave quarantine", peer, reqs)
	}
}

// watchPools starts the pidfd watches, and makes a peer's exit proof for
// its writes (watchExit), if a writer's process can be tied to this
// node's pool: the pool must be a shared mapping of a file (the
// shm backend's region file; UCX's System V or POSIX segment), which a
// writer's process maps to write into it. Pool memory no other process
// maps (a send-only node's private memory; UCX memory reached only
// through cma) ties no process, and no exit is taken as proof.
func (n *Node) watchPools(region *kvcache.Region) {
	if region == nil {
		n.log.Debug().Msg("no pool peers write into: no peer's exit is proof that its writes are over")
		return
	}
	f, err := pidwatch.BackingFile(region.Base)
	if err != nil {
		n.log.Info().Err(err).Msg("this node's pool is not a shared mapping of a file: no peer process can be tied to it, so no peer's exit will count as proof that its writes are over")
		return
	}
	n.poolFile = f
	n.pids = pidwatch.New()
}

// closePids stops the pidfd watches.
func (n *Node) closePids() {
	if n.pids != nil {
		n.pids.Close()
	}
}

// succeeded reports whether a later incarnation of peer than inc said
// Hello over l (nil: the in-process link, which knows none): the peer is
// up, and a Down, exit or departure of inc is not the application's news.
func succeeded(l *zmq.Link, peer messages.PeerID, inc uint64) bool {
	if l == nil {
		return false
	}
	h, err := l.Hello(peer)
	return err == nil && h.Incarnation > inc
}
