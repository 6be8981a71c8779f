package kvxfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/metrics"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/trace"
)

// Re-exported so that an embedder needs only this package for the common
// path.
type (
	// Fence says when a chunk's KV is written. For each chunk (or layer
	// part) handed over with it, the request's session calls OnReady(f)
	// once; OnReady must see that f is called exactly once, from any
	// goroutine, when the producer has written the KV (err nil) or failed
	// (err not nil: the request fails with ErrFence).
	//
	// OnReady must return promptly: call f at once when the KV is already
	// written (as actors.FiredFence does), else register f and return,
	// calling it later from another goroutine (cuda.EventFence polls its
	// events on a goroutine of its own). It must not wait for the KV
	// itself (a device synchronize, a channel, a lock held by code that
	// waits on this request): OnReady runs on the request's session
	// goroutine, and while it blocks the session takes nothing else — not
	// its other chunks' fences, not Cancel, not its deadline, not its
	// peer's frames. The
	// request then cannot fail, time out or be cancelled, its source
	// blocks stay pinned and Done does not fire; Engine.Close waits for it
	// until its ctx ends and reports it (ErrUndrained), after which Done
	// may never fire. A panic in OnReady fails the chunk with ErrFence.
	Fence = actors.Fence
	// Outcome is a request's terminal result.
	Outcome = actors.Outcome
	// ManualFence fires when told to.
	ManualFence = actors.ManualFence
)

var (
	defaultLinkOnce sync.Once
	defaultLink     *control.MemLink
)

// DefaultLink is the process-wide in-memory control link used when
// Config.Link is nil: engines started in one process find each other by
// instance and rank.
func DefaultLink() *control.MemLink {
	defaultLinkOnce.Do(func() { defaultLink = control.NewMemLink() })
	return defaultLink
}

// Engine is one running engine rank, made by Start. An Engine Start did
// not return (the zero Engine, a nil *Engine) runs nothing: its methods
// return an error wrapping ErrNotStarted, or their zero result.
type Engine struct {
	ownsRg bool
	cfg    resolved
	inner  *actors.Engine
	agent  rdma.Agent
	ownsAg bool
	region *kvcache.Region
	pools  *actors.Pools
	// memory describes every group's KV memory: Config.Memory, or the
	// pools' own layout.
	memory []*kvcache.KVMemory
	trace  *trace.Writer // Config.TracePath's, closed by Close
	// metrics and their server: nil unless Config.MetricsAddr is set.
	metrics    *metrics.Set
	metricsSrv *metrics.Server
	// proofs counts the writers' proofs taken (WriterProven).
	proofs proofCounters
	// closeOnce runs Close's body once; every Close returns closeErr.
	closeOnce sync.Once
	closeErr  error
}

// Start validates cfg, carves the pool region into one pool per layer
// group, registers it with the data plane and starts the actor tree. A
// nil ctx is refused (ErrConfig).
func Start(ctx context.Context, cfg Config) (_ *Engine, err error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: Start: nil context (pass context.Background())", ErrConfig)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	log := zerolog.Nop()
	if r.Logger != nil {
		log = r.Logger.With().Str("engine", fmt.Sprintf("%s/%d", r.Instance, r.Parallel.Index(r.Rank))).Logger()
	}
	// undo closes, last first, what Start opened when a later step fails.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	e := &Engine{cfg: r}
	e.region = r.Region
	if e.region == nil {
		if e.region, err = kvcache.NewHostRegion(r.PoolBytes); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		e.ownsRg = true
		undo = append(undo, func() { _ = e.region.Close() })
	}
	var pools []*kvcache.Pool
	var geoms []kvcache.PoolGeometry
	if r.Memory != nil {
		// The framework's tensors: memoryPools carves one id-only pool per
		// group over them.
		if pools, geoms, err = memoryPools(r); err != nil {
			return nil, err
		}
	} else {
		var off uint64
		for g := range r.layout.Groups {
			bb, n := r.shape.BlockBytes(r.layout, g), r.blocks
			if bb == 0 { // this rank holds no layer of the group
				bb, n = 1, 1
			}
			p, err := kvcache.NewPool(e.region, off, bb, n)
			if err != nil {
				return nil, fmt.Errorf("%w: group %d pool: %w", ErrConfig, g, err)
			}
			pools = append(pools, p)
			geoms = append(geoms, kvcache.PoolGeometry{Offset: off, BlockBytes: bb, Blocks: n})
			off += bb * uint64(n)
		}
	}
	e.pools = actors.NewPools(pools)
	if r.Memory != nil {
		// Its pools number blocks of one byte: the quarantine's bound
		// and bytes count what the descriptors say a block holds.
		weights := make([]uint64, len(r.Memory))
		for g, m := range r.Memory {
			if m != nil {
				weights[g] = m.BlockBytes()
			}
		}
		e.pools.SetBlockWeights(weights)
	}
	e.pools.SetQuarantineLimit(r.MaxQuarantinedBytes)
	e.memory = engineMemory(r, geoms)
	e.agent = r.Agent
	if e.agent == nil {
		e.agent = loopback.New()
		e.ownsAg = true
		undo = append(undo, func() { _ = e.agent.Close() })
	}
	if r.Revoker != nil && e.agent.Backend() != "shm" {
		// Other backends' writers address the receiver's memory, not the
		// region's file: a remapped offset would land elsewhere.
		return nil, fmt.Errorf("%w: Revoker needs the shm backend (its writers address the region's file), the agent is %q",
			ErrConfig, e.agent.Backend())
	}
	link := r.Link
	if link == nil {
		link = DefaultLink()
	}
	self := messages.PeerID{Instance: r.Instance, Rank: int32(r.Parallel.Index(r.Rank))}
	rec := r.Recorder
	switch {
	case r.TracePath == "" && (r.TraceMaxBytes != 0 || r.TraceKeep != 0):
		return nil, fmt.Errorf("%w: TraceMaxBytes = %d, TraceKeep = %d without a TracePath: set TracePath to trace", ErrConfig, r.TraceMaxBytes, r.TraceKeep)
	case r.TraceMaxBytes < 0:
		return nil, fmt.Errorf("%w: TraceMaxBytes = %d: want 0 (trace.DefaultMaxBytes) or a positive bound", ErrConfig, r.TraceMaxBytes)
	case r.TraceKeep < 0:
		return nil, fmt.Errorf("%w: TraceKeep = %d: want 0 (no rotation) or the number of rotated files to keep", ErrConfig, r.TraceKeep)
	}
	if r.TracePath != "" {
		// Create locks the file first: another engine, of this process or
		// another, writing it is refused (trace.ErrInUse). An earlier
		// engine's trace there is moved aside (FILE.prev-<UTC time>), never
		// truncated: it may be the failed run's.
		path := r.TracePath
		stopped := func(s trace.Stop) {
			log.Warn().Str("trace", path).Msg(s.Error())
		}
		opts := []trace.Option{trace.WithOnStop(stopped), trace.WithRotate(r.TraceKeep)}
		if r.TraceMaxBytes > 0 {
			opts = append(opts, trace.WithMaxBytes(r.TraceMaxBytes))
		}
		if e.trace, err = trace.Create(r.TracePath, opts...); err != nil {
			return nil, fmt.Errorf("%w: TracePath: %w", ErrConfig, quote.In(err, r.TracePath))
		}
		if prev := e.trace.MovedAside(); prev != "" {
			log.Info().Str("trace", path).Str("earlier", prev).Msg("an earlier trace at this path was moved aside")
		}
		if why := e.trace.NotMovedAside(); why != nil {
			log.Warn().Str("trace", path).Err(why).Msg("the earlier trace at this path could not be moved aside, so it was truncated: copy a trace you need before the next run")
		}
		if why := e.trace.NotPruned(); why != nil {
			log.Warn().Str("trace", path).Err(why).Msgf("the earlier runs' traces beside this path past the newest %d could not all be removed", trace.DefaultKeepPrevious)
		}
		undo = append(undo, func() { _ = e.trace.Close() })
		rec = trace.Tee(e.trace, r.Recorder)
	}
	if r.MetricsAddr != "" {
		e.metrics = metrics.New(self.String())
		if err = e.proofs.register(e.metrics); err != nil {
			return nil, fmt.Errorf("kvxfer: %w", err)
		}
		if e.metricsSrv, err = metrics.Serve(r.MetricsAddr, e.metrics.Handler()); err != nil {
			return nil, fmt.Errorf("kvxfer: MetricsAddr: %w", err)
		}
		undo = append(undo, func() { _ = e.metricsSrv.Close(ctx) })
	}
	e.inner, err = actors.StartEngine(actors.EngineConfig{
		Self: self,
		Topology: actors.Topology{Layout: r.layout, LayoutHash: r.layout.Hash(), Parallel: r.Parallel,
			Rank: r.Rank, Pools: geoms, Memory: r.Memory, Plans: actors.NewPlanCache()},
		Workers: r.Workers, Agent: e.agent, Region: e.region, Pools: e.pools, Link: link,
		Timeout: r.TransferTimeout, DrainGrace: r.DrainGrace, Clock: r.Clock, Log: log, Recorder: rec, Metrics: e.metrics,
		WriterLease: r.WriterLease, MaxOrphans: r.MaxOrphanRequests, Revoker: r.Revoker, SendOnly: r.SendOnly,
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// started reports whether Start made e (the zero Engine and a nil
// *Engine hold nothing to act on).
func (e *Engine) started() bool { return e != nil && e.inner != nil }

// errNotStarted is what method of an Engine that Start did not make
// returns.
func errNotStarted(method string) error {
	return fmt.Errorf("%w: Engine.%s on an Engine that Start did not return (a zero or nil Engine)", ErrNotStarted, method)
}

// Layout is the engine's (whole-model) layout (the zero Layout for an
// Engine Start did not return). It is a copy, deep: the caller may change
// it (its Groups, their Layers) without changing the engine's, which
// plans every request.
func (e *Engine) Layout() kvcache.Layout {
	if !e.started() {
		return kvcache.Layout{}
	}
	return e.cfg.layout.Clone()
}

// Shape is what this rank holds of the layout (the zero Shape for an
// Engine Start did not return). It is a copy, deep (Layers too), as
// Layout's.
func (e *Engine) Shape() kvcache.Shape {
	if !e.started() {
		return kvcache.Shape{}
	}
	s := e.cfg.shape
	if s.Layers != nil {
		s.Layers = make([][]int, len(e.cfg.shape.Layers))
		for g, ls := range e.cfg.shape.Layers {
			s.Layers[g] = slices.Clone(ls)
		}
	}
	return s
}

// Pools is the engine's block pools: the serving process allocates source
// blocks from them and frees READY destination blocks into them. Once
// Close has run, Alloc fails with ErrClosed. Nil for an Engine Start did
// not return.
func (e *Engine) Pools() *actors.Pools {
	if !e.started() {
		return nil
	}
	return e.pools
}

// Block is the memory of block id of layer group g in the engine's pool
// region (source blocks to fill, READY destination blocks to read). It
// returns nil for a group or id outside the pool, for every group when
// Config.Memory describes the memory (a block is then one slice per
// (layer, part) tensor: use BlockTensor), and once Close has unmapped the
// pool. A slice taken before Close must not be used after it. Nil for an
// Engine Start did not return.
func (e *Engine) Block(g int, id kvcache.BlockID) []byte {
	if !e.started() || g < 0 || g >= e.pools.Groups() || e.cfg.Memory != nil {
		return nil
	}
	geom := e.pools.Geometry(g)
	if id < 0 || int(id) >= geom.Blocks {
		return nil
	}
	off := geom.Offset + uint64(id)*geom.BlockBytes
	buf := e.region.Bytes() // nil once Close unmapped the pool
	if off+geom.BlockBytes > uint64(len(buf)) {
		return nil
	}
	return buf[off : off+geom.BlockBytes : off+geom.BlockBytes]
}

// Region is the engine's registered pool memory (nil for an Engine Start
// did not return).
func (e *Engine) Region() *kvcache.Region {
	if !e.started() {
		return nil
	}
	return e.region
}

// Hello is what the engine tells its peers about itself (nil for an
// Engine Start did not return). It is a copy, deep: the caller may change
// it without changing what the engine tells its peers.
func (e *Engine) Hello() *messages.Hello {
	if !e.started() {
		return nil
	}
	return cloneHello(e.inner.Hello())
}

// cloneHello copies h and every slice it holds.
func cloneHello(h *messages.Hello) *messages.Hello {
	if h == nil {
		return nil
	}
	c := *h
	c.AgentAddr = bytes.Clone(h.AgentAddr)
	c.Region.Key = bytes.Clone(h.Region.Key)
	c.Pools = slices.Clone(h.Pools)
	if h.Memory != nil {
		c.Memory = make([]messages.KVMemory, len(h.Memory))
		for i, m := range h.Memory {
			m.Layers = slices.Clone(m.Layers)
			m.Base = slices.Clone(m.Base)
			c.Memory[i] = m
		}
	}
	return &c
}

// PeerMapFrom is the peer map from a context instance of parallelism ctx
// to this engine's instance: WritersOf(this rank) are the context ranks a
// Receive from that instance needs. The engine caches it per
// parallelism; each call returns a copy of its own (WritersFrom copies
// only the writers).
func (e *Engine) PeerMapFrom(ctx kvcache.Parallel) (*kvcache.PeerMap, error) {
	if !e.started() {
		return nil, errNotStarted("PeerMapFrom")
	}
	pm, err := e.inner.PeerMapFrom(ctx)
	if err != nil {
		return nil, err
	}
	return pm.Clone(), nil
}

// WritersFrom are the ranks of a context instance of parallelism ctx that
// write to this rank (PeerMapFrom's WritersOf this rank), in a slice of
// the caller's: what a Receive from that instance waits for, without the
// copy of the whole map.
func (e *Engine) WritersFrom(ctx kvcache.Parallel) ([]kvcache.Rank, error) {
	if !e.started() {
		return nil, errNotStarted("WritersFrom")
	}
	pm, err := e.inner.PeerMapFrom(ctx)
	if err != nil {
		return nil, err
	}
	return slices.Clone(pm.WritersOf(e.cfg.Rank)), nil
}

// CheckPeer compares a peer's Hello with this engine: nil when both serve
// the same layout over the same data-plane backend, else an error wrapping
// ErrMismatch that names both models and both layout hashes, or both
// backends (every request between the two would fail with it — a backend
// mismatch as an address the other backend cannot parse). A nil Hello is
// an error wrapping ErrMismatch too.
func (e *Engine) CheckPeer(h *messages.Hello) error {
	if !e.started() {
		return errNotStarted("CheckPeer")
	}
	if h == nil {
		return fmt.Errorf("%w: CheckPeer: no Hello (nil) to compare", ErrMismatch)
	}
	if err := actors.LayoutMismatch(actors.Topology{Layout: e.cfg.layout, LayoutHash: e.cfg.layout.Hash()}, h); err != nil {
		return err
	}
	if mine, theirs := baseBackend(e.agent.Backend()), baseBackend(h.Backend); theirs != "" && mine != theirs {
		return fmt.Errorf("%w: peer %s moves KV over the %q backend, this rank over %q: start both with the same backend",
			ErrMismatch, h.From, messages.TruncateText(h.Backend, 64), mine)
	}
	return nil
}

// baseBackend is a backend's name without the wrappers around it
// ("faulty(shm)" is "shm").
func baseBackend(s string) string {
	for strings.HasSuffix(s, ")") {
		i := strings.IndexByte(s, '(')
		if i < 0 {
			break
		}
		s = s[i+1 : len(s)-1]
	}
	return s
}

// PeerDown tells the engine a peer is suspected dead (the control plane's
// heartbeat callback): its sessions fail and drain, saying it missed its
// heartbeats; destination pages it may still write are quarantined until
// a proof (WriterExited, its CancelAck or Result), never freed on
// suspicion alone. PeerDownBecause says another why. It does nothing on
// an Engine Start did not return.
func (e *Engine) PeerDown(peer messages.PeerID) {
	if !e.started() {
		return
	}
	e.inner.HeartbeatMissed(peer)
	e.inner.PeerDown(peer, "missed its heartbeats")
}

// PeerDownBecause is PeerDown for another suspicion than missed
// heartbeats; why is how the caller knows, as a predicate of the peer
// ("is out of etcd cluster c (lease expired)"), and the failed requests'
// errors name it. It does nothing on an Engine Start did not return.
func (e *Engine) PeerDownBecause(peer messages.PeerID, why string) {
	if e.started() {
		e.inner.PeerDown(peer, why)
	}
}

// PeerIncarnationDown is PeerDownBecause for incarnation inc of peer
// alone (0: any), as a registry's Down names it: the requests addressed
// to that incarnation, or to an earlier one, fail and drain; those
// addressed to a later one go on (a restarted peer whose Hello came before
// the Down of the incarnation it replaced), and new requests from the
// peer fail only while no later incarnation of it said Hello. It does
// nothing on an Engine Start did not return.
func (e *Engine) PeerIncarnationDown(peer messages.PeerID, inc uint64, why string) {
	if e.started() {
		e.inner.PeerIncarnationDown(peer, inc, why)
	}
}

// PeerAlive tells the engine that peer is alive now (its heartbeat
// arrived): it renews this writer's lease on it (Config.WriterLease), and
// when peer was declared down (PeerDown) and the link hears it again, the
// requests that suspected it send it their Cancel again at once, so that
// its answer releases their quarantined blocks. It does nothing on an
// Engine Start did not return.
func (e *Engine) PeerAlive(peer messages.PeerID) {
	if e.started() {
		e.inner.PeerAlive(peer)
	}
}

// WriterExited tells the engine that incarnation inc of writer peer is
// gone as its backend defines death (docs/membership.md §4): proof that
// ends the quarantine of the requests addressed to it. It returns how many
// requests addressed to that incarnation were live or quarantined here (0:
// the exit touched nothing, as at the end of a normal run), or an error
// when the engine did not answer (closed). The proof counts as
// ProofExited (Stats.WriteProofs); WriterProven takes another kind.
func (e *Engine) WriterExited(peer messages.PeerID, inc uint64, how string) (int, error) {
	return e.writerProven("WriterExited", peer, inc, ProofExited, how)
}

// writerQueryErr names method, the peer and the incarnation it was asked
// about in err (the actors name their internal message).
func writerQueryErr(method string, peer messages.PeerID, inc uint64, err error) error {
	return fmt.Errorf("kvxfer: %s(%s, incarnation %d): %w", method,
		messages.TruncateText(peer.String(), 2*messages.MaxInstanceLen), inc, err)
}

// WriterRequests is how many requests addressed to incarnation inc of
// writer peer are live or quarantined here (inc 0: any incarnation). It
// changes nothing.
func (e *Engine) WriterRequests(peer messages.PeerID, inc uint64) (int, error) {
	if !e.started() {
		return 0, errNotStarted("WriterRequests")
	}
	n, err := e.inner.WriterRequests(peer, inc)
	if err != nil {
		return n, writerQueryErr("WriterRequests", peer, inc, err)
	}
	return n, nil
}

// Stats are an engine's event counts since Start (monotonic).
type Stats struct {
	// OpsPosted: batches of writes handed to the backend.
	OpsPosted int64
	// WorkerRestarts: sender workers restarted after a panic.
	WorkerRestarts int64
	// FramesUnsent: control frames the control plane refused (the peer
	// not connected, its queue full, gone), and RequestData held back
	// while the control plane knew no Hello of its writer.
	FramesUnsent int64
	// FramesRejected: control frames refused on arrival (invalid, from a
	// peer that is not the request's, unresolvable, past an instance's
	// orphan limit); a stale one is counted in FramesStale instead. The
	// same frames as kvxfer_frames_rejected_total's reasons invalid,
	// not_writer, unresolved, not_bound and orphan_limit together.
	FramesRejected int64
	// FramesStale: control frames that came too late to act on, dropped
	// or answered FAILED: for a request finished or never started here
	// (or, while the engine closes, one no Send here took), sent by an
	// earlier incarnation of their peer than one already heard or
	// addressed to an earlier incarnation of this engine, or ignored by
	// a live request's session (a duplicate, another epoch or incarnation,
	// after its writer answered). The same frames as the metric
	// kvxfer_frames_rejected_total{reason="stale"}.
	FramesStale int64
	// FramesShed: RequestData and Cancel frames refused because their
	// peer had too many frames in flight inside the engine.
	FramesShed int64
	// CancelsDeferred: Cancel frames left unanswered for now because every
	// cancel tombstone slot of their instance (or of the engine's
	// instances) was younger than 30 s; their sender re-sends them, and
	// one is answered once a slot ages. The same frames as
	// kvxfer_frames_rejected_total{reason="tombstones_full"}.
	CancelsDeferred int64
	// SessionPanics: sessions restarted after a panic (each failed).
	SessionPanics int64
	// SessionPanicsPastBudget: session panics after the session's restart
	// budget was spent (it was resumed to drain, not restarted).
	SessionPanicsPastBudget int64
	// ParentPanics: panics of the engine's top-level actors (the tx and rx
	// parents, the senders) and of its listener routing a control frame.
	// Each failed the engine: it refuses new requests (ErrEngineFailed),
	// its live ones drain and end as usual.
	ParentPanics int64
	// PinErrors: source pins (and unpins) the pool refused.
	PinErrors int64
	// LeasesLapsed: writer leases on peers that lapsed (Config.WriterLease).
	LeasesLapsed int64
	// StreamViolations: peer-stream actors that disagreed with their
	// session's step (always a bug; the stream held its terminal frame).
	StreamViolations int64
	// BlocksRevoked: destination blocks revoked (Config.Revoker) instead of
	// quarantined.
	BlocksRevoked int64
	// RevokedHeldBlocks: revoked blocks whose old memory (the only memory
	// a stale writer can reach) is still held, waiting for its proof (or
	// kept by a Revoker whose release failed, DestBlockErrors).
	RevokedHeldBlocks int64
	// CallerBlocksAwaitingProof: the caller's own destination blocks
	// (ReceiveRequest.Blocks) whose request failed while a writer had
	// given no proof that its writes are over, now: not Released yet, and
	// not counted in QuarantinedBytes (kvxfer's pool does not hold them).
	// The metric kvxfer_caller_blocks_awaiting_proof.
	CallerBlocksAwaitingProof int64
	// DestBlockErrors: quarantines, releases and frees of a finished
	// request's destination blocks that the pool refused (always a bug,
	// logged at error level), and releases of revoked memory the Revoker
	// failed. The blocks stay held as they were, counted as quarantined
	// or in use by the pool, and are never freed.
	DestBlockErrors int64
	// QuarantinedBytes: destination bytes in quarantine now (their
	// request failed while a writer had given no proof that its writes
	// are over); QuarantineLimitBytes is the bound in force.
	QuarantinedBytes, QuarantineLimitBytes uint64
	// OpsInDoubt: ops (batches of writes) of live requests in doubt now:
	// their sender worker crashed, their endpoint was cut or their
	// request's deadline passed while they were on the wire, and no
	// endpoint close settled them yet. A close that proves them over
	// retires them; an unproven one (ClosesUnproven) that proves their
	// sources released takes them out too, one that proves nothing leaves
	// them in doubt for good, their requests keeping their source pages.
	// The same count as the metric kvxfer_ops_in_doubt, kept whether
	// metrics are on or not.
	OpsInDoubt int64
	// ClosesUnproven: data-plane endpoint closes that could not prove the
	// writes on them over (a peer alive but not progressing past the
	// backend's close timeout, or lost by the backend with writes on the
	// wire): their ops stay in doubt for good, and their requests send no
	// terminal frame (the peer fails them at its deadline and quarantines
	// its pages). Their requests keep their source pages, unless the
	// backend proved it reads none of them any more
	// (rdma.ErrSourcesReleased, as UCX's forced close does): then they
	// release them and Done comes.
	ClosesUnproven int64
	// FramesSilenced: Cancel and RequestData frames left unanswered for
	// good because writes of their request to their sender were cut
	// without proof (above): any answer would tell that peer they are
	// over.
	FramesSilenced int64
	// WaitingForBlocks: receive requests waiting now for destination
	// blocks (the pools had too few free when they came; they start, in
	// order, as blocks are freed, or fail at their deadline).
	WaitingForBlocks int
	// OrphanRequests: requests a generation instance's RequestData asked
	// this (context) engine for that no Send adopted yet, now (bounded per
	// instance by Config.MaxOrphanRequests). A Send normally adopts them
	// within moments.
	OrphanRequests int64
	// OrphansEnded: such requests that ended with no Send ever adopting
	// them (their deadline passed, the generation side cancelled them, the
	// engine closed): a peer asked for requests this side never sent.
	// Engine.OrphanIDs names the first few.
	OrphansEnded int64
	// WriteProofs, by ProofKind (WriteProofs[ProofDrainedGoodbye]): the
	// proofs that every write of one writer incarnation is over that the
	// engine took (WriterExited, WriterProven), and the requests they
	// concerned (kvxfer_write_proofs_total and
	// kvxfer_write_proof_requests_total). A proof that concerned no
	// request counts as a proof; one the engine refused or did not answer
	// (closed) counts nothing.
	WriteProofs [NumProofKinds]ProofCount
}

// OrphanIDs names the first few requests (at most 4) that a generation
// instance asked this engine for and no Send adopted, live or ended
// (Stats.OrphanRequests, Stats.OrphansEnded), in the order they came; nil
// when none (and for an Engine Start did not return). A request Send
// adopts leaves the list.
func (e *Engine) OrphanIDs() []string {
	if !e.started() {
		return nil
	}
	ids := e.inner.Orphans().IDs
	if len(ids) == 0 {
		return nil
	}
	return ids
}

// Stats returns a snapshot of the engine's counters (all zero for an
// Engine Start did not return).
func (e *Engine) Stats() Stats {
	if !e.started() {
		return Stats{}
	}
	c := e.inner.Stats()
	st := Stats{OpsPosted: c.OpsPosted.Load(), WorkerRestarts: c.WorkerRestarts.Load(), FramesUnsent: c.FramesUnsent.Load(),
		FramesRejected: c.FramesRejected.Load(), FramesStale: c.FramesStale.Load(), FramesShed: c.FramesShed.Load(),
		CancelsDeferred: c.CancelsDeferred.Load(), SessionPanics: c.SessionPanics.Load(),
		SessionPanicsPastBudget: c.SessionPanicsPastBudget.Load(), ParentPanics: c.ParentPanics.Load(),
		PinErrors: c.PinErrors.Load(), LeasesLapsed: c.LeasesLapsed.Load(),
		StreamViolations: c.StreamViolations.Load(), BlocksRevoked: c.BlocksRevoked.Load(),
		RevokedHeldBlocks: c.RevokedHeld.Load(), CallerBlocksAwaitingProof: c.CallerAwaitingProof.Load(), DestBlockErrors: c.DestBlockErrors.Load(), ClosesUnproven: c.ClosesUnproven.Load(),
		FramesSilenced: c.FramesSilenced.Load(), OpsInDoubt: c.OpsInDoubt.Load(),
		QuarantinedBytes: e.pools.QuarantinedBytes(), QuarantineLimitBytes: e.pools.QuarantineLimit(),
		WaitingForBlocks: e.inner.WaitingForBlocks()}
	o := e.inner.Orphans()
	st.OrphanRequests, st.OrphansEnded = o.Live, o.Ended
	st.WriteProofs = e.proofs.snapshot()
	return st
}

// Metrics is the engine's Prometheus metric set (package metrics), nil
// when Config.MetricsAddr is empty. Its Registry can be gathered into an
// embedder's own exposition as well. Nil for an Engine Start did not
// return.
func (e *Engine) Metrics() *metrics.Set {
	if !e.started() {
		return nil
	}
	return e.metrics
}

// MetricsAddr is the address the metrics server is bound to (Config.MetricsAddr
// with its port resolved), or "" when metrics are off (and for an Engine
// Start did not return).
func (e *Engine) MetricsAddr() string {
	if !e.started() || e.metricsSrv == nil {
		return ""
	}
	return e.metricsSrv.Addr()
}

// maxPromptLen is the longest prompt a request may have: RequestData
// carries the prompt length in 32 bits, and a longer one would reach the
// other side cut.
const maxPromptLen = math.MaxInt32

// SendRequest describes the context side of a request.
type SendRequest struct {
	ID string
	// PromptLen is the prompt's length in tokens, 1..math.MaxInt32 (the
	// wire carries it in 32 bits).
	PromptLen int
	// Timeout overrides Config.TransferTimeout when > 0 (0 keeps it; a
	// negative one is refused with ErrBadRequest).
	Timeout time.Duration
	// Payload is returned to the generation side with SUCCESS (first
	// token, draft tokens); at most messages.MaxPayload bytes. One known
	// only when prefill ends is given with TxHandle.SetPayload instead.
	// When several context ranks write a generation rank, its READY
	// carries the first one's payload (in context rank order) that is not
	// empty, whatever order their Results arrive in.
	Payload []byte
	// Generation, when set, names the generation instance the request is
	// for (a disaggregated router knows it): RequestData for the request
	// from any other instance is refused and cannot touch it. Empty: the
	// first RequestData that validates binds the request to its instance.
	// A name no engine can have (one Start refuses as Config.Instance), or
	// this engine's own instance, is refused with ErrBadRequest.
	Generation string
	// GenerationParallel, when set (TP > 0), is the generation instance's
	// parallelism: a rank that writes to none of its ranks (MLA with a
	// context TP larger than the generation TP) ends DONE at once, holding
	// nothing, instead of waiting for a RequestData that never comes. The
	// zero value is "not known"; one that is neither that nor a
	// parallelism fitting the layout is refused with ErrBadRequest.
	GenerationParallel kvcache.Parallel
}

// TxHandle is the context side's handle on one request, returned by
// Engine.Send. One Send did not return (nil, the zero TxHandle) refuses
// Chunk, SetPayload and Err with ErrNotStarted, its Cancel does nothing
// and its Done delivers a FAILED outcome wrapping ErrNotStarted.
type TxHandle struct {
	inner *actors.TxHandle
	e     *Engine
	req   SendRequest
	tpb   int
	mu    sync.Mutex
	order kvcache.ChunkOrder // the chunks and layer parts taken (under mu)
	// named holds, per layer group, the source blocks the chunks taken so
	// far named for their resident global blocks, a bit per pool block
	// (under mu): chunks do not overlap, so a later chunk naming one of
	// them names it for another global block, and is refused. Made at the
	// first chunk that is not the last (a one-chunk request needs none).
	named [][]uint64
	// idSlab and runSlab are what the chunks' copies of their source runs
	// are cut from (under mu): an allocation per few hundred ids, not one
	// per chunk (TxHandle.copyRuns).
	idSlab  []kvcache.BlockID
	runSlab []kvcache.BlockRun
	// payload is SetPayload's, until the last chunk carries it (under mu;
	// nil: none pending).
	payload []byte
}

// Send opens the context side of a request, typically when prefill starts.
// A ctx already done opens nothing: the error wraps ctx.Err() and names
// the request (a nil ctx is refused with ErrBadRequest). Cancelling ctx
// later cancels the request (as TxHandle.Cancel); its deadline, when earlier than the request's timeout,
// bounds the request, which then
// ends as at its timeout (FAILED, ErrTimeout), not cancelled. A timeout
// after every generation rank's SUCCESS Result was handed over, as a
// Cancel then, is too late: the request ends DONE once those Results left
// (FAILED if one did not). Done fires after every pin is released: then
// the caller may free the source blocks.
// A request that its generation instance cancelled before Send is refused
// with ErrPeerCancelled: that instance freed its blocks, and prefill may
// stop.
func (e *Engine) Send(ctx context.Context, req SendRequest) (*TxHandle, error) {
	if !e.started() {
		return nil, errNotStarted("Send")
	}
	if req.ID == "" || len(req.ID) > messages.MaxRequestIDLen { // before any message quotes it
		return nil, fmt.Errorf("%w: request id length %d, want 1..%d", actors.ErrBadRequest, len(req.ID), messages.MaxRequestIDLen)
	}
	if !utf8.ValidString(req.ID) {
		return nil, fmt.Errorf("%w: request id %q is not valid UTF-8 (frames between nodes carry it as a UTF-8 string)", actors.ErrBadRequest, req.ID)
	}
	if ctx == nil {
		return nil, nilContext("send", req.ID)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kvxfer: send %s: %w", req.ID, err)
	}
	if req.PromptLen < 1 {
		return nil, fmt.Errorf("%w: request %q prompt length %d", actors.ErrBadRequest, req.ID, req.PromptLen)
	}
	if req.PromptLen > maxPromptLen {
		return nil, fmt.Errorf("%w: request %q prompt length %d, at most %d", actors.ErrBadRequest, req.ID, req.PromptLen, maxPromptLen)
	}
	if why := instanceNameProblem(req.Generation); why != "" {
		// No engine has that name: every RequestData would be refused,
		// and the request would wait out its timeout pinning its chunks.
		return nil, fmt.Errorf("%w: request %s: Generation %s", actors.ErrBadRequest, req.ID, why)
	}
	if self := e.inner.Hello().From; req.Generation != "" && req.Generation == self.Instance {
		// As Receive's: no engine receives from its own instance, so no
		// RequestData would come, and the request would pin its chunks
		// until its timeout.
		return nil, fmt.Errorf("%w: request %s: Generation %q is this engine itself (%s, Config.Instance): a request sends to another instance's generation engine; name that one",
			actors.ErrBadRequest, req.ID, req.Generation, self)
	}
	if err := checkTimeout(req.ID, req.Timeout); err != nil {
		return nil, err
	}
	if gp := req.GenerationParallel; gp != (kvcache.Parallel{}) && gp.TP < 1 {
		// (TP > 0 is "set", and the peer map refuses a bad PP or a TP
		// that does not fit the layout.)
		return nil, fmt.Errorf("%w: request %s: GenerationParallel %v: give TP and PP (each ≥ 1), or neither when not known",
			actors.ErrBadRequest, req.ID, gp)
	}
	deadline := e.requestDeadline(ctx, req.Timeout)
	h, err := e.inner.Send(actors.TxRequest{ID: req.ID, PromptLen: req.PromptLen, Deadline: deadline, Payload: req.Payload,
		Generation: req.Generation, GenerationParallel: req.GenerationParallel})
	if err != nil {
		return nil, err
	}
	tpb := e.cfg.layout.TokensPerBlock
	tx := &TxHandle{inner: h, e: e, req: req, tpb: tpb, order: kvcache.NewChunkOrder(req.PromptLen, tpb, e.cfg.layout.Layers)}
	if ctx.Done() != nil { // a context that can never be cancelled needs no watcher (no allocation per request)
		h.AfterFinish(watchCtx(ctx, tx.Cancel))
	}
	return tx, nil
}

// nilContext is Send's and Receive's refusal of a nil ctx (ctx.Err would
// panic), naming the request.
func nilContext(op, id string) error {
	return fmt.Errorf("%w: %s %s: nil context (pass context.Background())", ErrBadRequest, op, id)
}

// checkTimeout refuses a request's negative Timeout: time left computed
// past its end, which "no override" (the whole TransferTimeout) would
// turn into the longest wait instead of none.
func checkTimeout(id string, t time.Duration) error {
	if t < 0 {
		return fmt.Errorf("%w: request %s: Timeout %v is negative (0: Config.TransferTimeout)", ErrBadRequest, id, t)
	}
	return nil
}

// requestDeadline is when a request of timeout t (≤ 0: TransferTimeout)
// bounded by ctx too must end, on the engine's clock: ctx's deadline
// counts by the time left to it (its wall-clock instant means nothing to
// an injected clock).
func (e *Engine) requestDeadline(ctx context.Context, t time.Duration) time.Time {
	if t <= 0 {
		t = e.cfg.TransferTimeout
	}
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d); left < t {
			t = left
		}
	}
	return e.cfg.Clock.Now().Add(t)
}

// watchCtx cancels a request when ctx is cancelled before the request
// ends; it returns the watcher's stop. ctx's deadline is the request's own
// already (requestDeadline), which ends it as timed out, not cancelled: at
// that deadline the watcher does nothing.
func watchCtx(ctx context.Context, cancel func()) func() bool {
	return context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
}

// Chunk hands over one prefill chunk: tokens [c.Start, c.End) whose KV sits
// in src (per layer group, the source blocks of global block indices
// src[g].First…). fence fires when the KV is written; nil means it is.
// Its OnReady must not block (see Fence): a blocking one stalls the
// request, which can then neither end nor be cancelled.
// A misaligned or out-of-order chunk, or one whose source blocks do not
// cover what it holds of a layer group, are not allocated or name one
// block for two global blocks (in the chunk, or one an earlier chunk named
// for another), or whose fence is a nil pointer (a *ManualFence never
// set), is rejected with an error naming the chunk and the blocks; nothing
// is pinned and the request goes on (the caller may hand a corrected
// chunk). A chunk taken has its source blocks pinned by the time Chunk
// returns: the pool refuses to free them until Done. Only the blocks of
// the chunk's own global blocks are checked and pinned: src may name more
// (a request's whole block table, a run from before block 0), and the
// rest stays the caller's. Chunk copies src: the caller may reuse its
// slices once it returns.
//
// A chunk may also leave in layer parts (c.Layers: global layers [Lo, Hi)
// of Of, the model's layer count), each with its own fence, as the forward
// pass writes them: the parts of one chunk come in layer order, each
// starting where the one before ended, the first at layer 0, all with the
// same chunk and the same source blocks; the part that reaches layer Of
// completes the chunk, and no other chunk is taken before it. A part out of
// that order is rejected like a misaligned chunk, naming the layers. The
// order is kvcache.ChunkOrder's; an out-of-order chunk wraps ErrBadChunk.
//
// Once the request's outcome is decided (it failed, timed out or was
// cancelled, here or by the peer), Chunk returns an error wrapping
// ErrRequestFailed and the outcome's cause, so that prefill can stop
// computing; Done still fires only after the drain.
func (h *TxHandle) Chunk(c kvcache.Chunk, src []kvcache.BlockRun, fence Fence) error {
	if !h.valid() {
		return errNoHandle("TxHandle.Chunk")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.Err(); err != nil {
		return fmt.Errorf("%v not taken: %w", c, err)
	}
	if err := h.order.Check(c, src); err != nil {
		// Misaligned, out of order, or a bad layer part: kvcache's error
		// (ErrBadChunk or ErrChunkOrder) under the engine's sentinel.
		return fmt.Errorf("%w: request %s: %w", actors.ErrBadChunk, h.req.ID, err)
	}
	if isNilPointer(fence) {
		return fmt.Errorf("%w: request %s %v: fence is a nil %T (pass a nil Fence for KV already written)", actors.ErrBadChunk, h.req.ID, c, fence)
	}
	inPart := h.order.InPart() // a later part's sources are its first part's
	if !inPart {
		if err := h.checkSources(c, src); err != nil {
			return fmt.Errorf("request %s %v: %w", h.req.ID, c, err)
		}
	}
	// The session reads the runs long after Chunk returns (plan, unpin):
	// it gets its own copy, so that the caller may reuse its buffers (a
	// copy of a chunk's block table is a few hundred bytes). The copy holds
	// only the blocks the chunk reads (Chunk.Clip): those are all it pins,
	// so that a run wider than the chunk (a whole block table) holds no
	// block of another chunk's, or of another request's, until Done.
	given := src
	src = h.copyRuns(c, src)
	var payload []byte
	if c.Last {
		payload = h.payload
	}
	// The source blocks are pinned before Chunk returns: from then on the
	// pool refuses to free them until Done. A refusal hands nothing over
	// and changes nothing here: the caller may hand a corrected chunk.
	if err := h.inner.ChunkPayload(c, src, fence, payload); err != nil {
		if derr := h.Err(); derr != nil {
			// The outcome was decided while the chunk was on its way in
			// (its session had finished): as any chunk after it.
			return fmt.Errorf("%v not taken: %w", c, derr)
		}
		return err
	}
	if c.Last {
		h.payload = nil
	}
	if !inPart {
		h.name(c, src)
	}
	h.order.Took(c, given) // (a later part's sources are compared with what the caller gave)
	return nil
}

// SetPayload sets the payload the generation side gets with SUCCESS
// (SendRequest.Payload's, replaced), for what is known only when prefill
// ends — the first token, a framework's per-request metadata. Call it
// before the last chunk, or before its last layer part: the next of them
// carries it. It copies p; at most messages.MaxPayload bytes. Refused with
// ErrBadRequest once the last chunk was handed over, and once the
// request's outcome is decided (ErrRequestFailed, as Chunk).
func (h *TxHandle) SetPayload(p []byte) error {
	if !h.valid() {
		return errNoHandle("TxHandle.SetPayload")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.Err(); err != nil {
		return fmt.Errorf("payload not set: %w", err)
	}
	if len(p) > messages.MaxPayload {
		return fmt.Errorf("%w: request %s: payload of %d bytes, at most %d", actors.ErrBadRequest, h.req.ID, len(p), messages.MaxPayload)
	}
	if h.order.Done() { // (a part of the last chunk still to come carries it)
		return fmt.Errorf("%w: request %s: its last chunk was handed over (its payload leaves with it): set the payload before it", actors.ErrBadRequest, h.req.ID)
	}
	h.payload = append(make([]byte, 0, len(p)), p...)
	return nil
}

// isNilPointer reports whether f holds a nil pointer (a *ManualFence never
// set): a Fence that is not nil but whose OnReady cannot run.
func isNilPointer(f Fence) bool {
	if f == nil {
		return false
	}
	v := reflect.ValueOf(f)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// copyRuns copies the part of runs chunk c reads (Chunk.Clip) into the
// handle's slabs: the
// session keeps a chunk's runs until the request ends, and a copy per
// chunk of its own (one or two small objects, kept as long) cost the
// chunk path ~6 % in BenchmarkChunkOverhead; cut from slabs, ~1 %.
func (h *TxHandle) copyRuns(c kvcache.Chunk, runs []kvcache.BlockRun) []kvcache.BlockRun {
	n := 0
	for _, r := range runs {
		n += len(c.Clip(h.tpb, r).IDs)
	}
	// Each new slab twice the last, up to 4,096 ids and 512 runs: a
	// one-chunk request allocates about what it copies.
	if cap(h.idSlab)-len(h.idSlab) < n {
		h.idSlab = make([]kvcache.BlockID, 0, max(n, min(2*cap(h.idSlab), 4096), 16))
	}
	if cap(h.runSlab)-len(h.runSlab) < len(runs) {
		h.runSlab = make([]kvcache.BlockRun, 0, max(len(runs), min(2*cap(h.runSlab), 512), 2))
	}
	start := len(h.runSlab)
	for _, r := range runs {
		r = c.Clip(h.tpb, r)
		at := len(h.idSlab)
		h.idSlab = append(h.idSlab, r.IDs...)
		h.runSlab = append(h.runSlab, kvcache.BlockRun{First: r.First, IDs: h.idSlab[at:len(h.idSlab):len(h.idSlab)]})
	}
	return h.runSlab[start:len(h.runSlab):len(h.runSlab)]
}

// residentBlocks is the part [lo, hi) of chunk c's global blocks that
// group g keeps resident (a sliding-window group only the window's
// suffix): the blocks the chunk's writes read.
func (h *TxHandle) residentBlocks(c kvcache.Chunk, g int) (lo, hi int) {
	rFirst, rEnd := kvcache.ResidentRange(h.req.PromptLen, h.e.cfg.layout.Groups[g].Window, h.tpb)
	return max(c.FirstBlock, rFirst), min(c.FirstBlock+(c.End-c.Start+h.tpb-1)/h.tpb, rEnd)
}

// name records the source blocks chunk c names for its resident global
// blocks (checkSources checked them against the earlier chunks'), unless
// c is the request's last chunk and none came before: nothing will be
// checked against them.
func (h *TxHandle) name(c kvcache.Chunk, src []kvcache.BlockRun) {
	if c.Last && h.named == nil {
		return
	}
	shape := h.e.cfg.shape
	for g := range src {
		if len(shape.Layers[g]) == 0 {
			continue
		}
		lo, hi := h.residentBlocks(c, g)
		if lo >= hi {
			continue
		}
		if h.named == nil {
			h.named = make([][]uint64, len(h.e.cfg.layout.Groups))
		}
		if h.named[g] == nil {
			h.named[g] = make([]uint64, (h.e.pools.Geometry(g).Blocks+63)/64)
		}
		run, bits := src[g], h.named[g]
		for b := lo; b < hi; b++ {
			if id := uint(run.IDs[b-run.First]); id < uint(len(bits))*64 {
				bits[id/64] |= 1 << (id % 64)
			}
		}
	}
}

// checkSources refuses a chunk whose source blocks cannot be pinned: for
// every layer group this rank holds, src must cover the chunk's blocks that
// the group keeps resident (a sliding-window group keeps only the window's
// suffix), and every block it names for the chunk's own global blocks
// (Chunk.Clip: src may name more, which are neither checked nor pinned)
// must be allocated in the engine's pool, each for one global block only,
// in this chunk and across the request's chunks (a block named twice would
// hold one of them while READY claims both).
func (h *TxHandle) checkSources(c kvcache.Chunk, src []kvcache.BlockRun) error {
	l, shape := h.e.cfg.layout, h.e.cfg.shape
	if len(src) > len(l.Groups) {
		return fmt.Errorf("%w: %d source runs for %d layer groups", actors.ErrBadChunk, len(src), len(l.Groups))
	}
	for g := range l.Groups {
		var run kvcache.BlockRun
		if g < len(src) {
			run = src[g]
		}
		if len(shape.Layers[g]) > 0 {
			lo, hi := h.residentBlocks(c, g)
			if lo < hi && (run.First > lo || run.End() < hi) {
				return fmt.Errorf("%w: group %d needs source blocks of global blocks [%d,%d), the chunk names [%d,%d)",
					kvcache.ErrMissingSource, g, lo, hi, run.First, run.End())
			}
			// A block an earlier chunk named (for another global block:
			// chunks do not overlap) would hold one of them while READY
			// claims both.
			if g < len(h.named) {
				bits := h.named[g]
				for b := lo; b < hi && bits != nil; b++ {
					id := run.IDs[b-run.First]
					if u := uint(id); u < uint(len(bits))*64 && bits[u/64]&(1<<(u%64)) != 0 {
						return fmt.Errorf("%w: group %d names source block %d for global block %d; an earlier chunk named it for another",
							actors.ErrBadChunk, g, id, b)
					}
				}
			}
		}
		if read := c.Clip(h.tpb, run); len(read.IDs) > 0 {
			if i, j, ok := repeatedID(read.IDs); ok {
				return fmt.Errorf("%w: group %d names source block %d for global blocks %d and %d",
					actors.ErrBadChunk, g, read.IDs[j], read.First+i, read.First+j)
			}
			if err := h.e.pools.Held(g, read.IDs); err != nil {
				return fmt.Errorf("%w: %w", actors.ErrPin, err)
			}
		}
	}
	return nil
}

// repeatedID finds an id that ids names twice: at i and then at j. A run
// is short (a chunk's blocks): up to 64 ids are compared pairwise, which
// allocates nothing; a longer run is checked with a map.
func repeatedID(ids []kvcache.BlockID) (i, j int, ok bool) {
	if len(ids) <= 64 {
		for b := 1; b < len(ids); b++ {
			for a := range b {
				if ids[a] == ids[b] {
					return a, b, true
				}
			}
		}
		return 0, 0, false
	}
	seen := make(map[kvcache.BlockID]int, len(ids))
	for b, id := range ids {
		if a, dup := seen[id]; dup {
			return a, b, true
		}
		seen[id] = b
	}
	return 0, 0, false
}

// Err returns nil while the request is live, and once its outcome is
// decided an error wrapping ErrRequestFailed and the cause (before Done,
// which waits for the drain): a cheap check for prefill to stop early. A
// request that ended DONE has no error. A handle Send did not return has
// ErrNotStarted.
func (h *TxHandle) Err() error {
	if !h.valid() {
		return errNoHandle("TxHandle.Err")
	}
	if d := h.inner.Decided(); d != nil && d.Err != nil {
		return fmt.Errorf("%w: request %s is %s: %w", ErrRequestFailed, h.req.ID, d.Status, d.Err)
	}
	return nil
}

// Cancel cancels the request. Done still fires only after the pins drop.
// A Cancel after every generation rank's SUCCESS Result was handed over
// is too late: the peers end READY on it, and the request ends DONE once
// those Results left (FAILED if one did not).
func (h *TxHandle) Cancel() {
	if h.valid() {
		h.inner.Cancel()
	}
}

// Done delivers the outcome once, after the session released every pin.
// It never fires for a request Engine.Close reported undrained
// (ErrUndrained): its pins are never released.
func (h *TxHandle) Done() <-chan Outcome {
	if !h.valid() {
		return failedOutcome("TxHandle.Done")
	}
	return h.inner.Done()
}

// valid reports whether Send made h.
func (h *TxHandle) valid() bool { return h != nil && h.inner != nil }

// errNoHandle is what method of a handle that Send or Receive did not
// return returns.
func errNoHandle(method string) error {
	return fmt.Errorf("%w: %s on a handle that Send or Receive did not return (a nil or zero handle)", ErrNotStarted, method)
}

// failedOutcome is the Done of a handle that Send or Receive did not
// return: a FAILED outcome wrapping ErrNotStarted, delivered at once (a
// nil channel would block its reader for good).
func failedOutcome(method string) <-chan Outcome {
	ch := make(chan Outcome, 1)
	ch <- Outcome{Status: StatusFailed, Err: errNoHandle(method)}
	close(ch)
	return ch
}

// closedChan is Released and Finished of a handle that Receive did not
// return: nothing to wait for.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// ReceiveRequest describes the generation side of a request.
type ReceiveRequest struct {
	ID string
	// PromptLen is the prompt's length in tokens, 1..math.MaxInt32 (the
	// wire carries it in 32 bits).
	PromptLen int
	// Context names the context instance (required) and its parallelism
	// (zero: 1 × 1). A name no engine can have (one Start refuses as
	// Config.Instance), this engine's own instance (KV moves between
	// instances), or a parallelism that does not fit the layout, is
	// refused with ErrBadRequest.
	Context         string
	ContextParallel kvcache.Parallel
	// PrefixHitBlocks[g]: leading blocks of group g already held.
	PrefixHitBlocks []int
	// Blocks, when set, are the destination blocks the serving framework
	// allocated itself, per layer group: for group g, the blocks of the
	// global block range kvcache.NeededRange(PromptLen, window of g,
	// tokens per block, PrefixHitBlocks[g]), in order (none for a group
	// this rank holds no layer of). kvxfer then neither allocates nor frees
	// them: READY hands them back, and after a failure RxHandle.Released
	// says when no write can touch them any more; until then another
	// Receive naming one of them is refused (kvcache.ErrBlockReceiving),
	// and kvxfer's own allocator does not hand out those that are free in
	// its pool (a framework that allocates elsewhere): they are reserved
	// until then. Receive copies the ids: the caller may reuse its slices
	// once it returns. A framework that allocates blocks itself should
	// not also let kvxfer allocate from the same pool (nil Blocks): once
	// READY hands its blocks back, kvxfer cannot know which of them it
	// still uses.
	// Nil: kvxfer allocates from its pool (waiting while it is full).
	Blocks [][]kvcache.BlockID
	// Timeout overrides Config.TransferTimeout when > 0 (0 keeps it; a
	// negative one is refused with ErrBadRequest).
	Timeout time.Duration
}

// RxHandle is the generation side's handle on one request, returned by
// Engine.Receive. One Receive did not return (nil, the zero RxHandle)
// holds no blocks: its Cancel does nothing, Released and Finished are
// closed, and its Done delivers a FAILED outcome wrapping ErrNotStarted.
type RxHandle struct {
	inner *actors.RxHandle
}

// Receive opens the generation side of a request. A ctx already done opens
// nothing: the error wraps ctx.Err() and names the request (a nil ctx is
// refused with ErrBadRequest). Cancelling ctx
// later cancels the request (as RxHandle.Cancel); its deadline, when
// earlier than the request's timeout, bounds it, and the request then ends TIMED_OUT
// (ErrTimeout), not cancelled.
//
// The READY contract: Outcome.Blocks[g] are the destination blocks of
// layer group g for the global block range NeededRange(PromptLen, the
// group's window, tokens per block, PrefixHitBlocks[g]) — the group's
// resident blocks (a sliding-window group holds only the window's suffix)
// past the prefix hits, in order — and every byte of each was written by
// the context side, exactly as many as this rank planned. From READY on
// the caller owns them: kvxfer never writes them again.
//
// Destination blocks come from req.Blocks (the framework's), or else from
// the engine's pool (waiting while it is full, until the deadline; a
// request larger than the pool fails at once with kvcache.ErrPoolTooSmall),
// and then READY's blocks are freed with Engine.FreeBlocks. Done delivers
// the outcome as soon as it is decided; after a failure the blocks are
// released only once every writer is quiescent (RxHandle.Released): kvxfer
// frees its own then, and the framework may reuse its own then, never
// before.
func (e *Engine) Receive(ctx context.Context, req ReceiveRequest) (*RxHandle, error) {
	if !e.started() {
		return nil, errNotStarted("Receive")
	}
	if req.ID == "" || len(req.ID) > messages.MaxRequestIDLen { // before any error quotes it
		return nil, fmt.Errorf("%w: request id length %d, want 1..%d", ErrBadRequest, len(req.ID), messages.MaxRequestIDLen)
	}
	if !utf8.ValidString(req.ID) {
		return nil, fmt.Errorf("%w: request id %q is not valid UTF-8 (frames between nodes carry it as a UTF-8 string)", ErrBadRequest, req.ID)
	}
	if ctx == nil {
		return nil, nilContext("receive", req.ID)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kvxfer: receive %s: %w", req.ID, err)
	}
	if e.cfg.SendOnly {
		return nil, fmt.Errorf("%w: request %s: engine %s was started with SendOnly (its pool is registered as a source only)",
			ErrSendOnly, req.ID, e.inner.Hello().From)
	}
	if req.Context == "" {
		// No writer to ask: the request could only wait out its timeout.
		return nil, fmt.Errorf("%w: request %s: Context is empty: name the context instance whose ranks write its KV",
			ErrBadRequest, req.ID)
	}
	if why := instanceNameProblem(req.Context); why != "" {
		// No engine has that name (Start refuses it): the RequestData
		// could reach no writer, and the request would wait out its
		// timeout holding its destination blocks.
		return nil, fmt.Errorf("%w: request %s: Context %s", ErrBadRequest, req.ID, why)
	}
	if self := e.inner.Hello().From; req.Context == self.Instance {
		// KV moves between instances: no rank of this one sends to it
		// (its RequestData would reach no writer), and the request would
		// wait out its timeout holding its destination blocks.
		return nil, fmt.Errorf("%w: request %s: Context %q is this engine itself (%s, Config.Instance): a request receives from another instance's context engine; name that one",
			ErrBadRequest, req.ID, req.Context, self)
	}
	if req.PromptLen > maxPromptLen {
		return nil, fmt.Errorf("%w: request %s prompt length %d, at most %d", ErrBadRequest, req.ID, req.PromptLen, maxPromptLen)
	}
	if err := checkTimeout(req.ID, req.Timeout); err != nil {
		return nil, err
	}
	deadline := e.requestDeadline(ctx, req.Timeout)
	cp := req.ContextParallel
	if cp == (kvcache.Parallel{}) {
		cp = kvcache.Parallel{TP: 1, PP: 1}
	}
	cp = cp.Normal(e.cfg.layout.Layers) // as the context's Hello says it
	// A parallelism that does not fit the layout (or this instance's) has
	// no peer map: refused here, naming it, rather than failing the
	// request once it has queued for blocks. (PeerMapFrom is cached: one
	// lookup per Receive.)
	if _, err := e.inner.PeerMapFrom(cp); err != nil {
		return nil, fmt.Errorf("%w: request %s: ContextParallel %v: %w", ErrBadRequest, req.ID, req.ContextParallel, err)
	}
	h, err := e.inner.Receive(actors.RxRequest{ID: req.ID, PromptLen: req.PromptLen, Context: req.Context,
		ContextParallel: cp, PrefixHitBlocks: req.PrefixHitBlocks, Blocks: req.Blocks, Deadline: deadline})
	if err != nil {
		return nil, err
	}
	rx := &RxHandle{inner: h}
	if ctx.Done() != nil {
		h.AfterFinish(watchCtx(ctx, rx.Cancel))
	}
	return rx, nil
}

// Cancel cancels the request.
func (h *RxHandle) Cancel() {
	if h.valid() {
		h.inner.Cancel()
	}
}

// valid reports whether Receive made h.
func (h *RxHandle) valid() bool { return h != nil && h.inner != nil }

// Released is closed once no write of the request can touch its
// destination blocks: at READY, or after a failure once every writer is
// quiescent (a Result, a CancelAck, its death, or a RequestData that never
// left). Blocks the framework passed in req.Blocks may be reused from then
// on, and never before.
func (h *RxHandle) Released() <-chan struct{} {
	if !h.valid() {
		return closedChan
	}
	return h.inner.Released()
}

// Done delivers the outcome once.
func (h *RxHandle) Done() <-chan Outcome {
	if !h.valid() {
		return failedOutcome("RxHandle.Done")
	}
	return h.inner.Done()
}

// Finished is closed once the outcome has been delivered on Done, without
// taking it: for a watcher beside the goroutine that receives from Done.
func (h *RxHandle) Finished() <-chan struct{} {
	if !h.valid() {
		return closedChan
	}
	return h.inner.Finished()
}

// FreeBlocks frees destination blocks handed over by a READY outcome, all
// or nothing. A block a live request owns (not yet READY, or the caller's
// own passed in ReceiveRequest.Blocks and not yet Released) is refused
// with an error wrapping kvcache.ErrBlockReceiving, and nothing is freed.
func (e *Engine) FreeBlocks(blocks [][]kvcache.BlockID) error {
	if !e.started() {
		return errNotStarted("FreeBlocks")
	}
	return e.pools.Free(blocks)
}

// Close cancels live requests, waits for every session to drain and release
// its pages (or ctx to end), then stops the engine. It reports the requests
// that could not drain by ctx's end; their pages stay pinned, and their
// handles' Done never fires (no session is left to release the pins, even
// once a late fence fires). It does not
// wait for a proof that may never come — a receive whose writers were all
// suspected (missed heartbeats, and not heard since; an exit) and never
// proved their writes over — but reports such a request too
// (ErrUndrained, "quarantined"): its blocks stay quarantined and, as after
// any error, the engine's own pool stays mapped and memory the caller gave
// it must stay allocated. Stopping the engine waits, past ctx's end, for
// every data-plane endpoint close already running to return (logged every
// 10 s with its peer): until then a write through it may still land. An
// engine with nothing live closes cleanly even with ctx already ended.
// Close runs once: a later or concurrent call waits for it and returns
// its error. A
// nil ctx is refused (ErrBadRequest) and closes nothing: a later Close
// with a ctx still runs.
func (e *Engine) Close(ctx context.Context) error {
	if !e.started() {
		return errNotStarted("Close")
	}
	if ctx == nil {
		// Refused before the once: a panic inside it would leave every
		// later Close returning nil with the engine still running.
		return fmt.Errorf("%w: Engine.Close: nil context (pass context.Background() to wait for the drain)", ErrBadRequest)
	}
	e.closeOnce.Do(func() { e.closeErr = e.close(ctx) })
	return e.closeErr
}

// WritesOver reports whether Close has returned having drained every
// write this engine ever started, with none in doubt: each was completed,
// never submitted, or proven over, and from Close on the engine read no
// frame that could start another. It is the proof a graceful stop may
// give its peers (node.Node.Close says it in its goodbye: a drained
// goodbye, docs/membership.md): this incarnation writes no more. It is
// about the context side only: Close may return nil with it false (a
// write cut by a close that proved its sources released, not its writes
// over, leaves no session undrained), and fail with it true (a receive
// abandoned with blocks quarantined). False until Close has drained, and on
// an Engine Start did not return.
func (e *Engine) WritesOver() bool { return e.started() && e.inner.WritesOver() }

func (e *Engine) close(ctx context.Context) error {
	err := e.inner.Close(ctx)
	// No allocation after Close: the pool may be unmapped below, or by
	// the region's owner (a node) after this returns.
	e.pools.Close()
	if e.metricsSrv != nil {
		// Scrapes may watch the drain until here.
		if merr := e.metricsSrv.Close(ctx); merr != nil && err == nil {
			err = fmt.Errorf("kvxfer: metrics server: %w", merr)
		}
	}
	if e.trace != nil {
		// Every session has stopped: the trace is complete.
		if terr := e.trace.Close(); terr != nil && err == nil {
			err = fmt.Errorf("trace %s: %w", e.cfg.TracePath, terr)
		}
	}
	// A sender worker Close gave up on may still be inside a backend
	// call: the agent stays open under it (leaked, as the memory).
	if e.ownsAg && !errors.Is(err, actors.ErrWorkerStuck) {
		if cerr := e.agent.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	// Unmap the pool only when every session drained: with pages still
	// pinned or writes in doubt the memory stays mapped (leaked, not
	// reused) rather than risk a late write into freed memory.
	if e.ownsRg && err == nil {
		err = e.region.Close()
	}
	return err
}
