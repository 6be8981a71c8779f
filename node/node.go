package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// Errors of package node besides ErrConfig.
var (
	// ErrPeerSilent: a peer said nothing (no Hello) before WaitPeers' ctx
	// ended.
	ErrPeerSilent = errors.New("node: peer said nothing")
	// ErrHandshake: the control link's CURVE handshake with a peer failed
	// (a wrong key, one side insecure); waiting will not heal it.
	ErrHandshake = errors.New("node: handshake with peer failed")
	// ErrPeerUnreachable: a peer said Hello, but this node's own
	// connection to it did not come up (WaitPeers): most likely its
	// endpoint here is not the one it listens on, or it went down right
	// after its Hello. This node could send it nothing (no RequestData, no
	// Result), so every request would wait for its deadline.
	ErrPeerUnreachable = errors.New("node: peer unreachable")
	// ErrPeerExited: a peer said goodbye naming an error it exits on
	// (its node closed with CloseBecause): it is not coming back, and
	// WaitPeers names it and returns instead of waiting for a restart.
	ErrPeerExited = errors.New("node: peer exited on an error")
	// ErrUnknownPeer: a request needs a rank that is not among the node's
	// peers, or a peer found through etcd that etcd holds no record of
	// now (Node.Receive).
	ErrUnknownPeer = errors.New("node: not a peer")
	// ErrSendOnly: Node.Receive on a node opened with SendOnly.
	ErrSendOnly = errors.New("node: send-only node cannot receive")
)

// Node is one process's kvxfer rank: its engine, control link, data-plane
// agent and pool memory, wired together.
type Node struct {
	cfg   Config
	log   zerolog.Logger
	eng   *kvxfer.Engine
	link  *zmq.Link // nil on the in-process link
	agent rdma.Agent
	// vouch is link once it is open: a ucx agent links only with agents
	// whose address a peer's Hello on it carries (admit).
	vouch   atomic.Pointer[zmq.Link]
	pool    io.Closer // the pool memory's closer (nil: the engine's own)
	backend string
	peers   []Peer
	// stranger is the last Hello from a sender that is none of peers
	// (static peers only: an insecure link admits any sender), for
	// WaitPeers to name beside a silent peer: the peer runs under
	// another instance name than this node was given for it.
	stranger atomic.Pointer[messages.PeerID]
	// region is the pool memory the node gave the engine (nil: the
	// engine's own): Close marks it closed before the memory can go.
	region *kvcache.Region

	stop  chan struct{} // closed by Close: stops watch
	watch sync.WaitGroup
	// goMu orders a goroutine's start under watch (goWatch) with Close's
	// setting closing: one started later would Add to watch while Close
	// Waits on it.
	goMu      sync.Mutex
	closeOnce sync.Once
	closeErr  error

	// Etcd discovery (nil reg with static discovery).
	reg discovery.Registry
	// injected carries a test's registry events (Apply) to the
	// membership goroutine, which acts on them as on the registry's:
	// on that goroutine, and waking its tending. Never sent on otherwise.
	// membershipDone is closed as that goroutine ends.
	injected       chan injectedEvent
	membershipDone chan struct{}
	pinned         map[messages.PeerID]string // public keys the config pins
	closing        atomic.Bool
	mu             sync.Mutex
	found          map[messages.PeerID]*found // peers etcd reports up
	refused        map[messages.PeerID]string // why a peer's record was refused
	// departed: peers whose record left etcd (not yet back), when and why
	departed map[messages.PeerID]departure
	// pastIncs: per peer, the incarnations whose records left etcd (the
	// latest maxPastIncs), whether or not the peer came back: a Hello of
	// one of them is a departed incarnation's (otherIncarnation).
	pastIncs map[messages.PeerID][]uint64
	// pastOrder: the peers of pastIncs, the one that left etcd longest
	// ago first (at most maxDepartedPeers).
	pastOrder []messages.PeerID
	self      discovery.Record // the record registered
	err       error            // ErrMembershipLost

	// Death proofs (exit.go): pids watches peer processes of this host
	// (on every node with a control link: an exit says the peer is down;
	// a proof only where poolFile is set); watched is
	// the incarnation last watched per peer, under mu; exitMu keeps an
	// exit's report from racing the engine's Close.
	// poolFile is the file backing this node's pool, which a writer's
	// process must map for its exit to be proof (exit.go: tie; zero: no
	// exit is proof here); tieMu
	// guards the watches' tie state, untied counts the watches whose tie
	// is still checked.
	pids     *pidwatch.Watcher
	watched  map[messages.PeerID]*watch
	poolFile pidwatch.File
	tieMu    sync.Mutex
	untied   atomic.Int32
	exitMu   sync.RWMutex
	engDone  bool
	// agents is the agent address each peer's latest Hello named, with
	// its incarnation, under mu: where a drained goodbye of that
	// incarnation goes when the agent takes it (exit.go: writerDrained).
	agents map[messages.PeerID]helloAgent
}

// Open starts a node: it sweeps pool files left by killed processes of
// this instance, opens the data-plane agent, allocates pool memory the
// backend can write, opens the control link (CURVE unless Insecure) with
// heartbeats wired to Engine.PeerDown, starts the engine, and logs where it
// listens and which peers it waits for. A peer's Hello is checked as it
// arrives: one serving another model is logged naming both models. On
// error nothing stays open.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, backend: cfg.backend(), peers: slices.Clone(cfg.Peers), stop: make(chan struct{}),
		found: map[messages.PeerID]*found{}, pinned: map[messages.PeerID]string{}, refused: map[messages.PeerID]string{},
		departed: map[messages.PeerID]departure{},
		pastIncs: map[messages.PeerID][]uint64{},
		watched:  map[messages.PeerID]*watch{}, agents: map[messages.PeerID]helloAgent{}}
	n.log = zerolog.Nop()
	if cfg.Logger != nil {
		n.log = *cfg.Logger
	}
	self := cfg.self()
	n.log = n.log.With().Str("node", self.String()).Logger()
	zc, err := cfg.linkConfig()
	if err != nil {
		return nil, err
	}
	if cfg.etcd() && !cfg.Insecure {
		for i, p := range cfg.Peers {
			if p.Endpoint == "" && (p.PublicKey != "" || p.PublicKeyFile != "") {
				if n.pinned[p.id()], err = publicKey(fmt.Sprintf("peers[%d]", i), p.PublicKey, p.PublicKeyFile); err != nil {
					return nil, err
				}
			}
		}
	}
	if removed, err := SweepStale(self.Instance); err != nil {
		n.log.Warn().Err(err).Msg("sweeping stale pool files")
	} else if removed > 0 {
		n.log.Info().Int("files", removed).Msg("removed pool files of dead processes of this instance")
	}
	kc := kvxfer.Config{Instance: self.Instance, Parallel: cfg.Parallel.orOne().kv(), Rank: cfg.Rank.kv(),
		Model: cfg.Model, Layout: cfg.Layout, TokensPerBlock: cfg.TokensPerBlock}
	if cfg.CallerMemory != nil {
		cfg.PoolBytes = cfg.CallerMemory.Region.Len
	}
	if cfg.Memory != nil && cfg.PoolBytes == 0 {
		if _, cfg.PoolBytes, err = cfg.Memory.layout(kc, 0); err != nil {
			return nil, err
		}
	}
	if zc != nil {
		// Before the pool is allocated (seconds for one of many GiB,
		// which the bind would otherwise wait behind): an endpoint another
		// process holds is a mistake to name at once.
		if err := zmq.CheckBindFree(cfg.Bind); err != nil {
			return nil, fmt.Errorf("node: %s: bind: %w", self, err)
		}
	}
	if err := checkMetricsFree(cfg.MetricsAddr); err != nil {
		return nil, err
	}
	var region *kvcache.Region
	var revoker kvcache.Revoker
	if n.agent, region, n.pool, revoker, err = openData(cfg, n.backend, self, n.admit); err != nil {
		return nil, err
	}
	if a, ok := n.agent.(*oneHostAgent); ok && a.caller != nil {
		n.log.Info().Int("allocations", a.callerAllocs).Int("tensor_spans", len(a.callerSpans)).
			Msg("cudaipc: the framework's memory is registered by the CUDA allocations its tensors lie in")
	}
	if revoker != nil {
		n.log.Info().Int64("spare_bytes", spareBytes(cfg)).Msg("pool revokes: blocks of requests failed without proof are reused at once, their old memory held until the proof")
	}
	var memory []*kvcache.KVMemory
	if cfg.CallerMemory != nil {
		memory = cfg.CallerMemory.Memory
	}
	if cfg.Memory != nil {
		if region == nil { // loopback, or a send-only node: host memory
			if region, err = kvcache.NewHostRegion(cfg.PoolBytes); err == nil {
				n.pool = region
			}
		}
		if err == nil {
			memory, _, err = cfg.Memory.layout(kc, region.Len)
		}
		if err != nil {
			n.closeData()
			return nil, err
		}
	}
	var link control.Link
	var engp atomic.Pointer[kvxfer.Engine]
	if zc != nil {
		zc.Logger = n.log
		if cfg.KeyFile != "" && !cfg.Insecure {
			if w := config.SecretKeyExposed(cfg.KeyFile); w != "" {
				n.log.Warn().Msg("key_file: " + w)
			}
		}
		zc.OnPeerDown = func(p messages.PeerID) {
			if e := engp.Load(); e != nil {
				e.PeerDown(p)
			}
			n.log.Warn().Str("peer", p.String()).Msg("peer fell silent: its requests fail")
			if cfg.OnPeerDown != nil {
				cfg.OnPeerDown(p.Instance, int(p.Rank))
			}
		}
		// A peer's graceful Close says goodbye on its link: that
		// incarnation is down at once, as after missed heartbeats (its
		// requests fail, naming the close and the reason it gave;
		// pages wait for a proof as for any Down), without the
		// heartbeat timeout.
		zc.OnPeerGoodbye = func(p messages.PeerID, inc uint64, reason string) {
			why := zmq.ErrPeerClosed.Error()
			if reason != "" {
				why = "exited on an error (its goodbye says: " + reason + ")"
			}
			if e := engp.Load(); e != nil {
				e.PeerIncarnationDown(p, inc, why)
			}
			if l := n.vouch.Load(); l != nil {
				if h, err := l.Hello(p); err == nil && h.Incarnation > inc {
					// A restart said Hello first (the link passes on
					// the goodbye of an incarnation that left the
					// cluster for its reason): the peer is up, as
					// after a predecessor's Down (membership.go) or
					// exit (exit.go), and the application is not told.
					// (vouch, not n.link: this runs on the listener's
					// goroutine, which starts before n.link is set.)
					what := "said goodbye"
					if reason != "" {
						what += " as it exited on an error: " + reason
					}
					n.log.Info().Str("peer", p.String()).Uint64("incarnation", inc).Uint64("successor", h.Incarnation).Str("reason", reason).
						Msgf("incarnation %d of peer %s %s; its requests here fail, but the peer is up (its incarnation %d said Hello since)", inc, p, what, h.Incarnation)
					return
				}
			}
			if reason != "" {
				n.log.Warn().Str("peer", p.String()).Uint64("incarnation", inc).Str("reason", reason).
					Msgf("peer %s said goodbye as it exited on an error: %s; its requests here fail", p, reason)
			} else {
				// A graceful stop, as at the end of every run: what
				// failed here says so itself.
				n.log.Debug().Str("peer", p.String()).Uint64("incarnation", inc).Msg("peer said goodbye (its node closed): requests with it still live here fail")
			}
			if cfg.OnPeerGoodbye != nil {
				cfg.OnPeerGoodbye(p.Instance, int(p.Rank), reason)
			}
			if cfg.OnPeerDown != nil {
				cfg.OnPeerDown(p.Instance, int(p.Rank))
			}
		}
		// A goodbye that says the peer drained every write it started
		// (after the Down above) is proof, as a pidfd exit is: the
		// requests addressed to that incarnation leave quarantine
		// (writerDrained, docs/membership.md).
		zc.OnPeerDrained = func(p messages.PeerID, inc uint64) { n.writerDrained(p, inc, engineSink(&engp)) }
		switch {
		case !exitProves(n.backend):
		case cfg.CallerMemory != nil:
			n.log.Info().Msg("the pool is the framework's memory: no peer process can be tied to it, so no peer's exit counts as proof that its writes are over (pages wait for a Result or CancelAck)")
		default:
			n.watchPools(region)
		}
		if n.pids == nil {
			// No peer's exit can prove its writes over here, but a peer
			// process's exit still says it is down, at once instead of
			// after missed heartbeats (watchExit, writerExited).
			n.pids = pidwatch.New()
		}
		sink := engineSink(&engp)
		oneHost, _ := n.agent.(*oneHostAgent)
		zc.OnHello = func(h *messages.Hello) {
			if oneHost != nil {
				oneHost.noteHello(h)
			}
			n.noteStranger(h.From)
			n.noteAgent(h)
			n.watchExit(h, sink)
		}
		zc.OnFrame = n.onFrame
		zc.OnPeerAlive = func(p messages.PeerID) {
			if e := engp.Load(); e != nil {
				e.PeerAlive(p)
			}
		}
		n.link, err = zmq.New(*zc)
		if err != nil {
			n.closePids()
			n.closeData()
			return nil, fmt.Errorf("node: control link: %w", err)
		}
		n.vouch.Store(n.link)
		link = n.link
	}
	eng, err := kvxfer.Start(ctx, kvxfer.Config{Instance: self.Instance, Parallel: cfg.Parallel.orOne().kv(), Rank: cfg.Rank.kv(),
		Model: cfg.Model, Layout: cfg.Layout, TokensPerBlock: cfg.TokensPerBlock, PoolBytes: cfg.PoolBytes, Region: region, Memory: memory,
		Revoker: revoker, SendOnly: cfg.SendOnly,
		Workers: cfg.Workers, Agent: n.agent, Link: link, TransferTimeout: time.Duration(cfg.TransferTimeout),
		DrainGrace: time.Duration(cfg.DrainGrace), Logger: &n.log, TracePath: cfg.TracePath, MetricsAddr: cfg.MetricsAddr,
		TraceMaxBytes: cfg.TraceMaxBytes, TraceKeep: cfg.TraceKeep,
		WriterLease: time.Duration(cfg.WriterLease)})
	if err != nil {
		if n.link != nil {
			_ = n.link.Close()
		}
		n.closePids()
		n.closeData()
		return nil, fmt.Errorf("node: %s: %w", self, err)
	}
	n.eng = eng
	n.region = region
	engp.Store(eng)
	if a := eng.MetricsAddr(); a != "" {
		n.log.Info().Str("url", "http://"+a+"/metrics").Msg("metrics")
	}
	n.logListening()
	if n.link != nil && len(n.static()) > 0 {
		n.watch.Add(1)
		go n.watchPeers()
	}
	if cfg.etcd() {
		if err := n.register(ctx); err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.DrainGrace)+5*time.Second)
			defer cancel()
			_ = n.Close(cctx)
			return nil, err
		}
	}
	return n, nil
}

// linkConfig is the control link's config, keys read from their files;
// nil for the in-process link.
func (c Config) linkConfig() (*zmq.Config, error) {
	if c.Backend == loopback.Backend && c.Bind == "" {
		return nil, nil
	}
	zc := &zmq.Config{Bind: c.Bind, Peers: map[messages.PeerID]string{}, Insecure: c.Insecure,
		HeartbeatInterval: time.Duration(c.HeartbeatInterval), HeartbeatMisses: c.HeartbeatMisses}
	for _, p := range c.Peers {
		if p.Endpoint != "" { // etcd finds the others
			zc.Peers[p.id()] = p.Endpoint
		}
	}
	if c.Insecure {
		return zc, nil
	}
	secret := c.SecretKey
	if c.KeyFile != "" {
		var err error
		if secret, err = config.ReadSecretKey(c.KeyFile); err != nil {
			return nil, fmt.Errorf("%w: key_file: %w", ErrConfig, err)
		}
	}
	zc.Curve = zmq.Curve{Secret: secret, PeerServerKeys: map[messages.PeerID]string{}}
	own, _ := zmq4.AuthCurvePublic(secret) // a bad secret: the link names it
	for i, p := range c.Peers {
		key, err := publicKey(fmt.Sprintf("peers[%d]", i), p.PublicKey, p.PublicKeyFile)
		if err != nil {
			return nil, err
		}
		if key == "" { // a peer etcd finds, its key not pinned
			continue
		}
		if key == own {
			// Both processes would hold one keypair: each refuses the
			// other's handshake, named only once both are running.
			what := "public_key"
			if p.PublicKeyFile != "" {
				what = "public_key_file " + p.PublicKeyFile
			}
			return nil, fmt.Errorf("%w: peers[%d] (%s): %s is this node's own public key, the one of its secret key: give the peer's public key (each node has its own keypair: kvxfer keygen)",
				ErrConfig, i, p.id(), what)
		}
		zc.Curve.PeerServerKeys[p.id()] = key
		zc.Curve.AllowedPeers = append(zc.Curve.AllowedPeers, key)
	}
	for i, id := range c.Identities {
		key, err := publicKey(fmt.Sprintf("identities[%d]", i), id.PublicKey, id.PublicKeyFile)
		if err != nil {
			return nil, err
		}
		zc.Curve.Identities = append(zc.Curve.Identities, zmq.Identity{PublicKey: key, Instance: id.Instance, Ranks: id.Ranks})
	}
	return zc, nil
}

// publicKey is an inline key or the one in file.
func publicKey(field, inline, file string) (string, error) {
	if file == "" {
		return inline, nil
	}
	k, err := config.ReadPublicKey(file)
	if err != nil {
		return "", fmt.Errorf("%w: %s.public_key_file: %w", ErrConfig, field, err)
	}
	return k, nil
}

// admit is the ucx agent's admission (ucx.WithAdmission): an agent links
// with this node's only if a peer's Hello on the control link carries its
// address. A writer connects to this node's agent only after its Hello
// reached this node's engine (a RequestData waits for it), so every
// writer is admitted; an agent nobody vouched for costs no endpoint.
func (n *Node) admit(addr []byte) bool {
	l := n.vouch.Load()
	return l != nil && l.SaysAgent(addr)
}

// openData opens the backend's agent and pool memory the backend can
// write: a shared-memory file (shm), memory UCX allocated (ucx), or none
// (loopback: the engine allocates host memory).
func openData(c Config, backend string, self messages.PeerID, admit func([]byte) bool) (rdma.Agent, *kvcache.Region, io.Closer, kvcache.Revoker, error) {
	size := c.PoolBytes
	if size == 0 {
		size = kvxfer.DefaultPoolBytes
	}
	// A ucx agent links only with agents a peer vouched for, and tells its
	// peers' writers whom it serves (this rank), which they check against
	// the peer whose Hello named its address; a cudaipc agent states the
	// same in its agent file (cudaipc.WithIdentity, in openCUDA and
	// callerAgent).
	uopts := []ucx.Option{ucx.WithAdmission(admit), ucx.WithIdentity(self.String())}
	switch {
	case c.CallerMemory != nil:
		a, err := callerAgent(c, backend, self, uopts)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		return a, c.CallerMemory.Region, nil, nil, nil
	case backend == cudaipc.Backend: // device memory, also for a send-only node: cudaipc moves nothing else
		a, region, pool, err := openCUDA(c, size, self.String())
		if err != nil {
			return nil, nil, nil, nil, err
		}
		return a, region, pool, nil, nil
	case backend == loopback.Backend:
		return loopback.New(), nil, nil, nil, nil
	case c.SendOnly: // the engine allocates private memory
		if backend == ucx.Backend {
			a, err := ucx.New(uopts...)
			if err != nil {
				return nil, nil, nil, nil, fmt.Errorf("node: backend ucx: %w (backend \"shm\" runs without UCX)", err)
			}
			return a, nil, nil, nil, nil
		}
		return shm.New(), nil, nil, nil, nil
	case backend == ucx.Backend:
		a, err := ucx.New(uopts...)
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("node: backend ucx: %w (backend \"shm\" runs without UCX)", err)
		}
		region, closer, err := a.Alloc(size)
		if err != nil {
			_ = a.Close()
			return nil, nil, nil, nil, fmt.Errorf("node: pool_bytes = %d: %w", size, err)
		}
		return a, region, closer, nil, nil
	default:
		a := shm.New()
		if block := c.revokeBlock(size); spareBytes(c) >= int64(block) && c.Memory == nil {
			spare := spareBytes(c)
			rr, err := shm.NewRevocableRegion(size, shm.RevocableOptions{Name: regionName(self, os.Getpid()),
				Block: block, Spare: uint64(spare) / block * block})
			if err != nil {
				_ = a.Close()
				return nil, nil, nil, nil, fmt.Errorf("node: pool_bytes = %d, revoke_spare_bytes = %d: %w", size, spare, err)
			}
			return a, rr.Region(), rr, rr.Revoker(), nil
		}
		region, closer, err := shm.NewRegion(regionName(self, os.Getpid()), size)
		if err != nil {
			_ = a.Close()
			return nil, nil, nil, nil, fmt.Errorf("node: pool_bytes = %d: %w", size, err)
		}
		return a, region, closer, nil, nil
	}
}

// spareBytes is the revocation reserve c asks for, in whole pages (0: the
// pool does not revoke).
func spareBytes(c Config) int64 {
	page := int64(os.Getpagesize())
	size := int64(c.PoolBytes)
	if size == 0 {
		size = int64(kvxfer.DefaultPoolBytes)
	}
	if c.RevokeSpareBytes < 0 || c.SendOnly || c.Memory != nil || c.CallerMemory != nil || size%page != 0 {
		return 0
	}
	spare := c.RevokeSpareBytes
	if spare == 0 {
		spare = size / 8
	}
	return spare / page * page
}

// closeData closes the agent, then the pool memory (which the agent no
// longer has registered) when the agent's close proved no write will land
// in it.
func (n *Node) closeData() error {
	err := n.agent.Close()
	if n.pool == nil {
		return err
	}
	if err != nil {
		// The agent could not prove that no write will land in the pool
		// any more (rdma.ErrCloseUnproven: another agent's batch still
		// copying into it, a batch cut on the wire): the pool stays
		// mapped, leaked rather than freed under a late write.
		return errors.Join(err, n.keepPool())
	}
	return n.pool.Close()
}

// keepPool leaves the pool mapped for the process's life, but its name
// goes: peers that mapped it keep their mapping, and no file is left in
// /dev/shm once this process exits.
func (n *Node) keepPool() error {
	if u, ok := n.pool.(interface{ Unlink() error }); ok {
		return u.Unlink()
	}
	return nil
}

// logListening says where this node listens and which peers it waits for.
func (n *Node) logListening() {
	where := "the in-process link"
	if n.link != nil {
		where = n.link.Endpoint()
	}
	var waits []string
	for _, p := range n.peers {
		if p.Endpoint == "" {
			waits = append(waits, p.id().String()+" through etcd cluster "+n.cfg.Cluster)
			continue
		}
		waits = append(waits, p.id().String()+" at "+p.Endpoint)
	}
	msg := "listening on " + where
	if len(waits) > 0 {
		msg += ", waiting for " + strings.Join(waits, ", ")
	}
	n.log.Info().Str("backend", n.backend).Msg(msg)
}

// watchPeers logs, once per peer, when its Hello arrives: that it is
// there, or that it serves another model (naming both) or runs as another
// parallelism or rank than the config gives it (naming both), so that a
// deployment mistake shows at startup rather than as failed requests.
func (n *Node) watchPeers() {
	defer n.watch.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	left := make(map[messages.PeerID]Peer, len(n.peers))
	for _, p := range n.static() {
		left[p.id()] = p
	}
	otherVersion := map[messages.PeerID]bool{}
	for len(left) > 0 {
		for id, p := range left {
			h, err := n.link.Hello(id)
			var pv *zmq.PeerVersionError
			if errors.As(err, &pv) && !otherVersion[id] {
				otherVersion[id] = true
				n.log.Error().Str("peer", id.String()).Uint32("version", pv.Version).Uint32("our_version", messages.Version).
					Msgf("peer speaks %v: every request with it will fail until both sides run one version", pv)
			}
			if err != nil {
				continue
			}
			delete(left, id)
			if err := n.eng.CheckPeer(h); err != nil {
				n.log.Error().Err(err).Str("peer", id.String()).Msg(n.incompatible(h))
			} else if err := checkPeerPlace(p, h, n.eng.Layout().Layers); err != nil {
				n.log.Error().Err(err).Str("peer", id.String()).Msg("peer runs another parallelism or rank than this node's config gives it: every request with it will fail")
			} else {
				n.log.Info().Str("peer", id.String()).Str("model", h.Model).Msg("peer said Hello")
			}
		}
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

// checkPeer compares peer p's Hello h with this node: the engine's
// CheckPeer (layout, backend), then p's place (checkPeerPlace).
func (n *Node) checkPeer(p Peer, h *messages.Hello) error {
	if err := n.eng.CheckPeer(h); err != nil {
		return err
	}
	return checkPeerPlace(p, h, n.eng.Layout().Layers)
}

// incompatible is the log line for a peer whose Hello h the engine's
// CheckPeer refused, saying what differs (the error says it in full): the
// model, the layout of the same model, or the backend.
func (n *Node) incompatible(h *messages.Hello) string {
	mine, what := n.eng.Hello(), ""
	switch {
	case h.LayoutHash != mine.LayoutHash && h.Model != mine.Model:
		what = " (it serves another model)"
	case h.LayoutHash != mine.LayoutHash:
		what = " (it lays out the same model differently)"
	case h.Backend != mine.Backend:
		what = " (it moves KV over another backend)"
	}
	return "peer is incompatible" + what + ": every request with it will fail"
}

// checkPeerPlace compares the parallelism and rank a peer's Hello says it
// runs as with those this node's config gives it (a peer's parallelism
// defaults to 1×1): an error wrapping kvxfer.ErrMismatch names the peer
// and both, since every request with it would be planned for another head
// and layer split and fail only at its deadline or its Result. A Hello
// without a parallelism (a peer that predates it) is not checked.
func checkPeerPlace(p Peer, h *messages.Hello, layers int) error {
	want := p.Parallel.orOne().kv().Normal(layers)
	got := kvcache.Parallel{TP: int(h.Parallel.TP), PP: int(h.Parallel.PP), Stages: h.Parallel.Stages}
	// Both normalized: a peer that spells the default split out runs as
	// one that leaves it to the default.
	if h.Parallel == (messages.Parallel{}) ||
		got.Normal(layers) == want && h.TP == int32(p.Rank.TP) && h.PP == int32(p.Rank.PP) {
		return nil
	}
	return fmt.Errorf("%w: peer %s runs as rank tp%d/pp%d of %v, this node's config gives it rank tp%d/pp%d of %v: "+
		"make the peer's \"parallel\" and \"rank\" here what it runs as (or start it as configured here)",
		kvxfer.ErrMismatch, h.From, h.TP, h.PP, got, p.Rank.TP, p.Rank.PP, want)
}

// static are the peers given with an endpoint (the others etcd finds).
func (n *Node) static() []Peer {
	var out []Peer
	for _, p := range n.peers {
		if p.Endpoint != "" {
			out = append(out, p)
		}
	}
	return out
}

// Engine is the node's engine: Send, Receive, Pools, Block, Stats.
func (n *Node) Engine() *kvxfer.Engine { return n.eng }

// Endpoint is the control endpoint the node listens on (a tcp port 0
// resolved); empty on the in-process link.
func (n *Node) Endpoint() string {
	if n.link == nil {
		return ""
	}
	return n.link.Endpoint()
}

// PublicKey is the node's CURVE public key (Z85); empty when insecure or
// on the in-process link.
func (n *Node) PublicKey() string {
	if n.link == nil {
		return ""
	}
	return n.link.PublicKey()
}

// Backend is the data plane in use ("ucx", "shm", "cudaipc" or
// "loopback").
func (n *Node) Backend() string { return n.backend }

// WaitPeers waits until every configured peer said Hello (one etcd found:
// the incarnation etcd holds; a Hello of another incarnation is named
// while the wait goes on) and checks that
// each serves this node's layout as the parallelism and rank the config
// gives it. It returns early, naming the peer, when a handshake failed (a
// wrong key, one side insecure: ErrHandshake), a peer serves another
// model (an error naming both models), runs as another parallelism or
// rank (an error wrapping kvxfer.ErrMismatch naming both) or its frames
// are of another control protocol version (an error wrapping
// kvxfer.ErrMismatch and messages.ErrVersion); when ctx ends
// first, an error wrapping ErrPeerSilent names the silent peers.
//
// A peer that said Hello while this node's own connection to it is still
// not up after 3 heartbeat intervals is named at once (ErrPeerUnreachable),
// and so is one that said Hello and went down before that connection came
// up (it exited, or fell silent, at its start); one that said goodbye as
// it closed is waited for again, its next Hello judged afresh, unless its
// goodbye named an error it exits on (ErrPeerExited, naming it).
// A peer still silent after 3 heartbeat intervals is named in a warning,
// with what the link knows of it (nothing accepts connections at its
// endpoint; or our connection to it is up and it has not connected back),
// while the wait goes on: a peer may be started after this one, but a user
// who forgot it hears so in seconds, not at the deadline.
//
// Once Close has begun, WaitPeers returns at once (and a wait under way
// returns) an error wrapping kvxfer.ErrClosed.
func (n *Node) WaitPeers(ctx context.Context) error {
	if n.closing.Load() {
		return n.closedErr()
	}
	if n.link == nil || len(n.peers) == 0 {
		return nil
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	start, hinted, hintAfter := time.Now(), false, waitHintBeats*n.heartbeat()
	hintedStranger := false // the hint named a Hello from a sender that is no peer
	// spoke: when WaitPeers first saw each peer's Hello while its own
	// connection to it was not up; reached: the peers that connection was
	// up to at some point of this wait (a drop after that is a peer
	// restarting, not a wrong endpoint, and is waited out).
	// For a peer found through etcd both are of the incarnation in inc,
	// and start afresh at another (a restart): the new incarnation is
	// judged as a first one is, its Hello and its endpoint its own.
	spoke := map[messages.PeerID]time.Time{}
	reached := map[messages.PeerID]bool{}
	inc := map[messages.PeerID]uint64{}
	refused := n.link.Refused() // handshakes our listener refused before this wait
	for {
		if err := n.Err(); err != nil {
			return err
		}
		var silent []string
		unexplained := false      // a silent peer the link knows nothing more of
		told := map[string]bool{} // instances notRegisteredHint named as absent
		for _, p := range n.peers {
			id := p.id()
			endpoint := p.Endpoint
			if endpoint == "" {
				var ok bool
				if endpoint, ok = n.foundEndpoint(id); !ok {
					if why := n.whyRefused(id); why != "" {
						return fmt.Errorf("%w: %s: its record in etcd cluster %s was refused: %s", ErrHandshake, id, n.cfg.Cluster, why)
					}
					d, gone := n.departure(id)
					_, heard := spoke[id]
					if gone && !d.at.Before(start) && !heard && !reached[id] && time.Since(d.at) >= hintAfter {
						// It registered in this wait, left before it said
						// Hello, and has not come back for the hint's
						// wait (a restart's new incarnation would have):
						// news to give now, not a silence to wait out.
						// (A peer that said Hello and restarts is waited
						// out, as a connection that dropped.)
						return fmt.Errorf("%w: %s registered in etcd cluster %s, then left it (%s) %v ago before it said Hello to this node, and has not come back: see its log",
							ErrPeerUnreachable, id, n.cfg.Cluster, d.reason, time.Since(d.at).Round(time.Millisecond))
					}
					if gone {
						silent = append(silent, fmt.Sprintf("%s (left etcd cluster %s %v ago: %s)", id, n.cfg.Cluster, time.Since(d.at).Round(time.Second), d.reason))
						continue
					}
					silent = append(silent, id.String()+" (not registered in etcd cluster "+n.cfg.Cluster+")"+n.notRegisteredHint(p, told))
					continue
				}
				if r, ok := n.member(id); ok && r.Incarnation != inc[id] {
					delete(spoke, id)
					delete(reached, id)
					inc[id] = r.Incarnation
				}
			}
			h, err := n.link.Hello(id)
			if r, ok := n.member(id); ok && err == nil {
				if other := n.otherIncarnation(id, h, r); other != nil {
					// Not the Hello of the incarnation etcd holds: that
					// one has not spoken yet.
					silent = append(silent, id.String()+" at "+endpoint+": "+other.Error())
					continue
				}
			}
			if err == nil {
				if err := n.checkPeer(p, h); err != nil {
					n.awaitOurHello(ctx, id)
					return n.closedAfter(fmt.Errorf("node: %s at %s: %w", id, endpoint, err))
				}
				// It reaches us; we must reach it too, or nothing of ours
				// gets to it. A peer that speaks is up and listening, so
				// a connection of ours still down after the hint's wait
				// dials the wrong place.
				st, err := n.peerState(id)
				if err != nil || st.Conn == zmq.ConnUp {
					reached[id] = true
					if h := waitReachedHook.Load(); h != nil {
						(*h)(id)
					}
					continue
				}
				if reached[id] {
					silent = append(silent, id.String()+" at "+endpoint+": our connection to it dropped ("+st.String()+")")
					continue
				}
				heard, ok := spoke[id]
				if !ok {
					heard = time.Now()
					spoke[id] = heard
				}
				if waited := time.Since(heard); waited >= hintAfter {
					return fmt.Errorf("%w: %s said Hello, but this node's connection to it at %s is still not up %v after that (%s): is that the endpoint it listens on?",
						ErrPeerUnreachable, id, endpoint, waited.Round(time.Millisecond), st)
				}
				silent = append(silent, id.String()+" at "+endpoint+": it said Hello, but our connection to it is "+st.String())
				continue
			}
			if pv := (*zmq.PeerVersionError)(nil); errors.As(err, &pv) {
				return fmt.Errorf("%w: node: %s at %s speaks %w", kvxfer.ErrMismatch, id, endpoint, pv)
			}
			if claimed, ok := n.link.MisnamedHello(id, start); ok {
				return fmt.Errorf("%w: %s at %s: a Hello came with the CURVE key given for %s, but it names itself %s: is %q the instance name (and rank) that peer runs as?",
					ErrHandshake, id, endpoint, id, claimed, id.Instance)
			}
			if _, heard := spoke[id]; heard && !reached[id] && !errors.Is(err, zmq.ErrPeerClosed) {
				// (An etcd peer that restarted before this node reached
				// it, its Down and new Up between two looks of this wait,
				// is not here: spoke is its new incarnation's. Nor is one
				// that closed gracefully, saying goodbye, which may be
				// restarting: it is waited for, as one that never came.)
				// Its Hello is gone: the link declared it down after it
				// spoke (it exited, or fell silent, at its start).
				return fmt.Errorf("%w: %s at %s said Hello, then went down before this node could reach it: see its log",
					ErrPeerUnreachable, id, endpoint)
			}
			if why := n.link.ClosedReason(id); why != "" && errors.Is(err, zmq.ErrPeerClosed) {
				// It closed naming the error it exits on: not a restart
				// to wait for.
				return fmt.Errorf("%w: %s at %s: %s", ErrPeerExited, id, endpoint, why)
			}
			if errors.Is(err, zmq.ErrPeerClosed) {
				// A peer at a fixed endpoint whose Hello was refused on
				// its side may have closed before this look read it (a
				// model or backend mismatch found there first): its last
				// Hello is judged as a live one would be, so that the
				// mismatch is named now, not the silence at the deadline.
				// (An etcd peer's successor may be starting, fixed.)
				if h, ok := n.link.ClosedHello(id); ok && p.Endpoint != "" {
					if err := n.checkPeer(p, h); err != nil {
						return fmt.Errorf("node: %s at %s (it has closed since it said Hello): %w", id, endpoint, err)
					}
				}
				// It closed on purpose; its next start (a restart) is
				// judged afresh, as a new incarnation found through
				// etcd is: its Hello, and our connection after it.
				delete(spoke, id)
				delete(reached, id)
				silent = append(silent, id.String()+" at "+endpoint+": it said goodbye as it closed, and has not said Hello again")
				continue
			}
			// A refused handshake with a peer etcd found is most likely
			// the race the membership goroutine redials for.
			st, err := n.peerState(id)
			if err == nil && st.Conn == zmq.ConnHandshakeFailed && p.Endpoint != "" {
				n.awaitOurRefusals(ctx, id, refused)
				// The wait may have brought a reason that names the
				// mistake (a mechanism mismatch) where the first look saw
				// only a hang-up.
				if later, err := n.peerState(id); err == nil {
					st = moreSpecific(st, later)
				}
				return n.closedAfter(fmt.Errorf("%w: %s at %s: %w", ErrHandshake, id, endpoint, st.Err()))
			}
			who := id.String() + " at " + endpoint
			why := n.silentWhy(st, err)
			if from := n.stranger.Load(); from != nil && p.Endpoint != "" {
				// First: the likelier mistake, which silentWhy cannot see.
				hint := fmt.Sprintf("a Hello came from %s, which is not a peer of this engine: is %q the instance name (and rank) that peer runs as?", *from, id.Instance)
				if why != "" {
					hint += " Or: " + why
				}
				why = hint
			}
			if why != "" {
				who += ": " + why
			} else {
				unexplained = true
			}
			silent = append(silent, who)
		}
		if len(silent) == 0 {
			return nil
		}
		// A Hello from a sender that is no peer (noteStranger), come
		// after the hint, is news the hint is said once more for.
		stranger := n.stranger.Load() != nil
		if time.Since(start) >= hintAfter && (!hinted || stranger && !hintedStranger) {
			after := hintAfter
			if hinted {
				after = time.Since(start).Round(100 * time.Millisecond)
			}
			hinted, hintedStranger = true, stranger
			dl, left := "until the deadline", time.Duration(1<<63-1)
			if d, ok := ctx.Deadline(); ok {
				left = time.Until(d)
				dl = "up to " + left.Round(time.Second).String() + " more"
			}
			if left >= n.heartbeat() { // else the error says it in a moment
				n.log.Warn().Strs("peers", silent).Msgf("still waiting for a Hello after %v (%s): %s", after, dl, strings.Join(silent, "; "))
			}
		}
		select {
		case <-n.stop:
			return n.closedErr()
		case <-ctx.Done():
			ask := ""
			if unexplained {
				ask = ": is it running, and do both sides use the same CURVE keys (or both insecure)?"
			}
			return fmt.Errorf("%w (%v): %s%s%s",
				ErrPeerSilent, context.Cause(ctx), strings.Join(silent, "; "), ask, n.unnamedVersion())
		case <-t.C:
		}
	}
}

// checkMetricsFree refuses, before the pool is allocated, a metrics
// address the engine could not listen on now (a port another socket
// holds, an address not of this host): ErrConfig naming metrics_addr.
// "" and port 0 pass; the engine's listen remains the authority.
func checkMetricsFree(addr string) error {
	if addr == "" {
		return nil
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "0" {
		return nil // Validate names a malformed one
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return bad("metrics_addr", addr, "%v", err)
	}
	return ln.Close()
}

// closedAfter is err, a mistake WaitPeers found, as WaitPeers returns it
// after awaitOurHello or awaitOurRefusals: wrapping kvxfer.ErrClosed too
// (closedErr) when Close began meanwhile and ended the wait.
func (n *Node) closedAfter(err error) error {
	if n.closing.Load() {
		return fmt.Errorf("%w; it had found: %w", n.closedErr(), err)
	}
	return err
}

// closedErr is WaitPeers' error once Close has begun: no peer can say
// Hello to a closed node.
func (n *Node) closedErr() error {
	return fmt.Errorf("%w: node %s: WaitPeers after Close: it waits for no peer any more", kvxfer.ErrClosed, n.cfg.self())
}

// awaitOurHello returns once this node's connection to peer is up (its
// Hello then leaves, and Close lets it: closeLinger), or the peer is gone
// (it said goodbye, or the link declared it down: its Hello is gone, and
// nobody is left to tell), at most waitHintBeats heartbeat intervals or
// until ctx ends or Close begins. WaitPeers calls it before it returns a mismatch it
// found in the peer's Hello: a caller that closes on that error would
// otherwise often leave before its own Hello reached the peer (its
// connection can come up after the peer's), and the peer, told nothing,
// would wait out its whole deadline and then blame a silent peer instead
// of naming the mismatch too.
func (n *Node) awaitOurHello(ctx context.Context, peer messages.PeerID) {
	if h := awaitHook.Load(); h != nil {
		(*h)("hello", peer)
	}
	bound := time.NewTimer(waitHintBeats * n.heartbeat())
	defer bound.Stop()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if st, err := n.peerState(peer); err != nil || st.Conn == zmq.ConnUp {
			return
		}
		if _, err := n.link.Hello(peer); err != nil {
			return
		}
		select {
		case <-n.stop:
			return
		case <-ctx.Done():
			return
		case <-bound.C:
			return
		case <-t.C:
		}
	}
}

// awaitOurRefusals, before WaitPeers returns a failed handshake (and the
// process, as the kvxfer command does, exits), lets the peer learn of it
// too: when the mistake is the peer's (its own key is not the one we hold
// for it), its only news is our refusal of its handshakes, which stops
// with our listener. It waits until the link refused a handshake after
// WaitPeers began (it had refused from before), or the link names a
// security mechanism mismatch with peer and a handshake has failed at
// our listener, for at most waitHintBeats heartbeat intervals, or until
// ctx ends or Close begins. On a mechanism mismatch no refusal can come
// (the peer's handshakes with our listener fail at the greeting, before
// any key is judged; an insecure link has no ZAP handler at all): the
// peer learns of the mismatch only on its own dial, which must reach our
// listener before it closes. Its dials retry at up to a second apart,
// and ours may have found the mismatch first: a process that exited then
// left the peer to wait out its deadline and blame a peer that is not
// running. So the wait goes on until a handshake has failed at our
// listener (zmq.Link.FailedHandshakes, counted since the link listens: a
// failed handshake stays in the dialer's PeerState, so one before this
// wait counts too; a dialer of the other mechanism is most likely the
// peer). Until the link names the mismatch (libzmq often reports only a
// hang-up), the wait gives it the time to, for WaitPeers' error.
func (n *Node) awaitOurRefusals(ctx context.Context, peer messages.PeerID, from int64) {
	if h := awaitHook.Load(); h != nil {
		(*h)("refusals", peer)
	}
	bound := time.NewTimer(waitHintBeats * n.heartbeat())
	defer bound.Stop()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for n.link.Refused() <= from {
		if st, err := n.peerState(peer); err == nil && mechanismMismatch(st) && n.link.FailedHandshakes() > 0 {
			return
		}
		select {
		case <-n.stop:
			return
		case <-ctx.Done():
			return
		case <-bound.C:
			return
		case <-t.C:
		}
	}
}

// peerState is the link's PeerState of peer, as WaitPeers reads it
// (peerStateHook, in tests, may stand for the link's).
func (n *Node) peerState(peer messages.PeerID) (zmq.PeerState, error) {
	st, err := n.link.PeerState(peer)
	if h := peerStateHook.Load(); h != nil {
		return (*h)(peer, st, err)
	}
	return st, err
}

// moreSpecific is the failed handshake's state WaitPeers reports of a
// peer it first saw as first and, after awaitOurRefusals, as later: later
// (the connection's latest word), unless first names the mistake and
// later does not. Against a peer of the other security mechanism libzmq
// reports, attempt by attempt, either the mismatch or only that the peer
// hung up; the link holds a named reason against hang-ups for a while
// (control/zmq's namedHold), but a wait longer than that hold may see a
// hang-up again.
func moreSpecific(first, later zmq.PeerState) zmq.PeerState {
	if later.Conn != zmq.ConnHandshakeFailed {
		return first // it moved on (a new socket, fixed): the failure seen stays
	}
	if namesMistake(first) && !namesMistake(later) {
		return first
	}
	return later
}

// mechanismMismatch reports whether the link names a failed handshake a
// security mechanism mismatch (one side insecure, the other CURVE). It
// decides by the state's Cause, not by its Reason's words (a hang-up's
// reason names the mismatch among its possible causes).
func mechanismMismatch(st zmq.PeerState) bool {
	return st.Conn == zmq.ConnHandshakeFailed && st.Cause == zmq.CauseMechanismMismatch
}

// namesMistake reports whether a failed handshake's cause names its
// mistake (a security mechanism mismatch, a cryptographic error, our key
// refused, another protocol error) rather than only that what listens
// hung up or did not answer, which several mistakes share.
func namesMistake(st zmq.PeerState) bool {
	return st.Conn == zmq.ConnHandshakeFailed && st.Cause.NamesMistake()
}

// noteStranger keeps a Hello's sender that is none of the node's static
// peers (one with an endpoint) for WaitPeers' hint. Peers found through
// etcd are not judged: any rank of the cluster may say Hello.
func (n *Node) noteStranger(from messages.PeerID) {
	static := false
	for _, p := range n.peers {
		if p.id() == from {
			return
		}
		static = static || p.Endpoint != ""
	}
	if static {
		n.stranger.Store(&from)
	}
}

// waitHintBeats is how many heartbeat intervals WaitPeers waits for a
// peer's Hello before it names the silent peers in a warning (and goes on
// waiting): 3 s by default.
const waitHintBeats = 3

// silentWhy is what the link's connection to a silent peer says about
// the silence (st and err from Link.PeerState), or "" when nothing more
// than the silence is known.
func (n *Node) silentWhy(st zmq.PeerState, err error) string {
	switch {
	case err != nil:
		return ""
	case (st.Conn == zmq.ConnConnecting || st.Conn == zmq.ConnDown) && st.Reason != "":
		return st.Reason
	case st.Conn == zmq.ConnUp:
		return "our connection to it is up, but it has not connected back to this engine at " + n.link.Endpoint() +
			": is that its peer endpoint, and is this engine's public key among its peer keys?"
	}
	return ""
}

// unnamedVersion says, for a silence, that frames of another control
// protocol version came on a connection without a CURVE key (insecure),
// whose peer the link cannot name; "" when none did.
func (n *Node) unnamedVersion() string {
	if v := n.link.OtherVersionUnnamed(); v != 0 {
		return fmt.Sprintf(" Frames of control protocol version %d (this engine speaks %d) came on an insecure connection: does a peer run a build of another version?",
			v, messages.Version)
	}
	return ""
}

// Close closes the engine (cancelling live requests and waiting, up to
// ctx's end, for every session to drain), then the control link, the
// agent and the pool memory. When a session could not drain, the pool
// memory stays mapped (a late write must not land in freed memory) and the
// error says which; over Config.CallerMemory the framework's memory is
// never freed by the node, and after such an error it must never be freed
// by the framework either. The link's goodbye to the peers says that this
// incarnation's writes are over (a drained goodbye, proof for them) only
// when the engine's Close drained every write it started
// (kvxfer.Engine.WritesOver). Close is idempotent.
func (n *Node) Close(ctx context.Context) error { return n.CloseBecause(ctx, nil) }

// CloseBecause is Close for a node that closes because of cause, an error
// its owner found and exits on (a mistake: another peer than the one
// expected said Hello, the two sides' settings differ): the goodbye it
// says to its peers names cause (zmq.Link.SetGoodbyeReason: its text,
// made to fit messages.MaxGoodbyeReasonLen bytes), so that they fail
// naming it at once (Config.OnPeerGoodbye) instead of taking the close
// for a restart; to reach a peer it heard from whose connection is not
// up yet (the mistake found at startup), the close waits for it at most
// 1 to 2 s (not for a peer never heard from, one that never started).
// A nil cause is Close's goodbye, which gives no reason.
// Only the first Close or CloseBecause closes the node.
func (n *Node) CloseBecause(ctx context.Context, cause error) error {
	n.closeOnce.Do(func() {
		n.goMu.Lock()
		n.closing.Store(true)
		n.goMu.Unlock()
		var regErr error
		if n.reg != nil { // first, so that peers see "left"
			regErr = n.reg.Close()
		}
		close(n.stop)
		n.watch.Wait()
		if n.link != nil && cause != nil {
			// Before the engine closes the link's listener, which stops
			// its heartbeats: the link then keeps the connections not up
			// yet, and its Close waits (bounded) for them to come up and
			// carry the goodbye naming cause.
			n.link.SetGoodbyeReason(cause.Error())
		}
		// The pidfd watches stay on while the engine drains: a writer's
		// exit is the proof that releases its quarantined pages.
		engErr := n.eng.Close(ctx)
		err := engErr
		n.exitMu.Lock()
		n.engDone = true
		n.exitMu.Unlock()
		if n.link != nil {
			if n.eng.WritesOver() {
				// The engine read its last frame and every write it
				// started is over: the goodbye may say so (a drained
				// goodbye, proof for the peers that this incarnation
				// writes no more). Else it proves nothing.
				n.link.MarkDrained()
			}
			err = errors.Join(err, n.link.Close())
		}
		n.closePids()
		if f := n.cfg.BeforeMemoryGoes; f != nil {
			// The embedder's callbacks under way may read the blocks of
			// the requests they report: they end before the memory goes.
			f(ctx, engErr)
		}
		if n.region != nil {
			// Before the agent closes (a ucx agent frees the memory it
			// allocated) and the pool's closer unmaps it: Engine.Block
			// and BlockTensor return nil from here on, never a slice of
			// memory that is going.
			n.region.MarkClosed()
		}
		if err == nil {
			err = n.closeData()
		} else {
			// The pool stays mapped: an agent that allocated it (ucx)
			// must not unmap it as it closes.
			if k, ok := n.agent.(interface{ KeepMemory() }); ok {
				k.KeepMemory()
			}
			if !errors.Is(err, kvxfer.ErrWorkerStuck) {
				// (A sender worker the engine gave up on may still be
				// inside a backend call: the agent stays open under it.)
				err = errors.Join(err, n.agent.Close())
			}
			err = errors.Join(err, n.keepPool())
		}
		n.closeErr = errors.Join(regErr, err)
	})
	return n.closeErr
}
