// Package proc is the demo workload of kvxfer's two roles as separate OS
// processes: a context process that prefills (simulated) and pushes
// chunks, and a generation process that receives and verifies every byte.
// Each runs on a node (package node: control link, CURVE, backend, pool,
// liveness, and with etcd discovery the membership); this package only
// drives requests and checks bytes. `kvxfer ctx`, `kvxfer gen` and `kvxfer demo --processes 2` are
// thin wrappers; the two-process tests re-execute the test binary into
// these roles.
package proc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/cpustat"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// Options configures one role process.
type Options struct {
	// Instance names this process's engine; Peer names the other's.
	Instance, Peer string
	// Bind is this process's ROUTER endpoint; PeerEndpoint the other's.
	Bind, PeerEndpoint string
	// SecretKey is this process's CURVE secret key and PeerPublicKey the
	// peer's public key (Z85); both empty only with Insecure.
	SecretKey, PeerPublicKey string
	Insecure                 bool
	// Identities binds more CURVE keys to the instances (and ranks) they
	// may speak for (zmq.Curve.Identities); the peer's key is bound to the
	// peer already.
	Identities []zmq.Identity

	// Backend is the data plane both processes use: shm (also when empty),
	// ucx, or cudaipc (GPU to GPU on one host: each pool is device memory
	// on GPU Device, filled and checked through CUDA copies). Both must
	// use the same.
	Backend string
	// Device is the CUDA ordinal of this process's GPU (backend cudaipc).
	Device int `json:",omitempty"`

	// Discovery is node.Config.Discovery: "" or "static" (PeerEndpoint and
	// PeerPublicKey name the one peer rank) or "etcd://HOST:PORT": every
	// rank registers there under Cluster, with leases of DiscoveryTTL, and
	// finds the peer instance's ranks (PeerEndpoint and PeerPublicKey are
	// then not needed; a PeerPublicKey given pins a peer of one rank).
	Discovery, Cluster string
	DiscoveryTTL       time.Duration
	// DiscoveryCA, DiscoveryCert, DiscoveryKey, DiscoveryUser and
	// DiscoveryPasswordFile are node.Config's: TLS (etcds://) and user
	// auth to etcd.
	DiscoveryCA, DiscoveryCert, DiscoveryKey, DiscoveryUser, DiscoveryPasswordFile string
	// Parallel and Rank place this process in its instance (default 1×1,
	// rank 0); PeerParallel is the peer instance's parallelism (default
	// 1×1). Other than 1×1 needs etcd discovery (one static endpoint names
	// one rank).
	Parallel     node.Parallel
	Rank         node.Rank
	PeerParallel node.Parallel

	Model string
	// Layout, when set, overrides Model.
	Layout         *kvcache.Layout
	TokensPerBlock int
	PoolBytes      uint64
	// PoolName is the pool's setting as the user gave it ("--pool",
	// "KVXFER_POOL", a file's key and line), named by errors about the
	// pool; empty is "--pool".
	PoolName string
	Workers  int

	Requests, MinTokens, MaxTokens, ChunkTokens int
	Compute                                     time.Duration
	Concurrency                                 int
	Seed                                        uint64
	// LayerParts (ctx): the layer ranges each chunk is handed over in, each
	// as the simulated forward pass computes it, with its own fence and its
	// share of Compute (kvcache.SplitLayers: 0 one per layer, 1 the whole
	// chunk).
	LayerParts int `json:",omitempty"`

	Heartbeat       time.Duration
	HeartbeatMisses int
	Timeout         time.Duration
	// WriterLease (node.Config.WriterLease, the context role): post writes
	// for the peer only while its frames or heartbeats renewed its lease
	// within this long. 0: off.
	WriterLease time.Duration
	// TracePath, when set, records this process's engine to a trace file
	// (kvxfer.Config.TracePath), bounded at TraceMaxBytes (0: the
	// default) and rotated keeping TraceKeep old files (0: none).
	TracePath     string
	TraceMaxBytes int64 `json:",omitempty"`
	TraceKeep     int   `json:",omitempty"`
	// MetricsAddr, when set, serves the engine's Prometheus metrics
	// (kvxfer.Config.MetricsAddr); the bound address is logged.
	MetricsAddr string
	Log         zerolog.Logger `json:"-"`
	// Progress, when set, gets a line "ready <request>" (gen) or "done
	// <request>" (ctx) as each request completes.
	Progress io.Writer `json:"-"`
	// Canary (gen, issue 17): when the context peer is declared down,
	// allocate every free destination block, write a canary into each and
	// hold them until the quarantine is empty (every suspected writer's
	// proof arrived), then check the canaries and free them. Progress
	// lines: "canary <blocks> quarantined <blocks>" once they are written,
	// "released <blocks> corrupt <blocks>" after the check. A write of the
	// stalled writer that landed in a block reused in between would show
	// as a corrupt canary.
	Canary bool
	// ProofWait bounds how long a role whose peer went down waits, before
	// it closes, for the proof that frees the blocks that peer's
	// unanswered requests keep quarantined (awaitProof). 0: as long as
	// the missed heartbeats took (Heartbeat × HeartbeatMisses), at least
	// a second, at most five.
	ProofWait time.Duration `json:",omitempty"`
	// Pause (gen): idle this long before each request's Receive, so that
	// every round trip starts with both processes' threads asleep, as
	// between a lightly loaded serving process's requests (0: back to
	// back).
	Pause time.Duration
}

// Report is what a role prints (one JSON object) when it ends.
type Report struct {
	Role          string `json:"role"`
	Requests      int    `json:"requests"`
	OK            int    `json:"ok"`
	Failed        int    `json:"failed"`
	Bytes         uint64 `json:"bytes"` // the successful requests' received (gen) or sent (ctx) bytes, as the engine reports them
	BytesVerified uint64 `json:"bytes_verified"`
	Mismatches    int    `json:"mismatches"`
	LeakedBlocks  int    `json:"leaked_blocks"`
	// QuarantinedBlocks: destination blocks still quarantined at the end
	// (a writer failed without proof that its writes are over: issue 17);
	// not leaked, never reused.
	QuarantinedBlocks int  `json:"quarantined_blocks"`
	PeerDown          bool `json:"peer_down"`
	// PeerDownMidRun: the peer was declared down before the last request
	// ended (PeerDown also counts a peer that left after the run, as the
	// context role waits for under etcd).
	PeerDownMidRun bool `json:"peer_down_mid_run,omitempty"`
	// PeerClosed: the peer said goodbye as its node closed (a graceful
	// stop, as at the end of its run, or its exit on an error: PeerReason),
	// rather than falling silent or its process dying.
	PeerClosed bool `json:"peer_closed,omitempty"`
	// PeerReason: the peer's goodbye named an error it exits on (the
	// mistake it found: node.Node.CloseBecause), after its rank ("gen/0:
	// …"); such a run fails, naming it.
	PeerReason string `json:"peer_reason,omitempty"`
	// NodeFailed: this process's node failed during the run (it lost its
	// etcd membership: node.Err), which fails its requests and, seen from
	// the peer, looks like the peer going down.
	NodeFailed string `json:"node_failed,omitempty"`
	// SettingsMismatch: (gen) the settings the context process derived
	// its request list from, as it sent them with a request's SUCCESS,
	// when they are not this process's (both sides' flags, named); such a
	// run fails even if every request it made succeeded. Either role: a
	// request the peer planned with another prompt length, and this
	// process's settings. (ctx) The generation process asked for requests
	// no request of this process took (past its --requests), named, as
	// the context role saw them while it waited for that process to leave
	// after its last request (awaitGenLeaves); such a run fails even if
	// every request it made succeeded.
	SettingsMismatch string  `json:"settings_mismatch,omitempty"`
	Seconds          float64 `json:"seconds"`
	// CPUSeconds is the CPU time the process used over those Seconds
	// (user and system, every thread: libzmq's and the copiers' too);
	// 0 where it cannot be read.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	// Chunks and Parts (ctx): the chunks handed over, and their parts
	// (Options.LayerParts per chunk).
	Chunks int `json:"chunks,omitempty"`
	Parts  int `json:"parts,omitempty"`
	// CanaryBlocks, CanaryCorrupt, QuarantinedAtDown (gen, Options.Canary):
	// blocks reused with a canary while the peer was suspected, those
	// whose canary was overwritten, and the most blocks quarantined then.
	CanaryBlocks      int `json:"canary_blocks,omitempty"`
	CanaryCorrupt     int `json:"canary_corrupt,omitempty"`
	QuarantinedAtDown int `json:"quarantined_at_down,omitempty"`
	// RevokedBlocks (gen): destination blocks revoked instead of
	// quarantined (a revoking shm pool), over the run.
	RevokedBlocks int `json:"revoked_blocks,omitempty"`
	// LatencyP50Us and LatencyP99Us (gen): Receive → READY per request.
	LatencyP50Us float64 `json:"latency_p50_us,omitempty"`
	LatencyP99Us float64 `json:"latency_p99_us,omitempty"`
	FirstError   string  `json:"first_error,omitempty"`
	// PeerModel and OwnModel: a request failed because the peer's Hello
	// named another model than this process serves
	// (kvxfer.LayoutMismatchError): each side's model, the first time.
	PeerModel string `json:"peer_model,omitempty"`
	OwnModel  string `json:"own_model,omitempty"`
	// Errors lists the first failures, one line each (request: status:
	// cause), up to maxReportErrors.
	Errors []string `json:"errors,omitempty"`
	// EngineStats are the engine's counters once it closed.
	EngineStats EngineStats `json:"engine_stats"`
}

// EngineStats are an engine's counters (kvxfer.Stats) in a report, each
// named as the C ABI's kvxfer_engine_stats or kvxfer_engine_stats_ext
// names it (include/kvxfer.h says what each counts): pages held
// (quarantined_bytes, revoked_held_blocks, caller_blocks_awaiting_proof,
// dest_block_errors), writes in doubt (ops_in_doubt, closes_unproven,
// frames_silenced), frames refused (frames_rejected, frames_stale,
// frames_shed, cancels_deferred) and bugs the engine survived
// (session_panics, parent_panics, stream_violations). Every field is
// written, zero too.
type EngineStats struct {
	OpsPosted                        int64  `json:"ops_posted"`
	WorkerRestarts                   int64  `json:"worker_restarts"`
	FramesUnsent                     int64  `json:"frames_unsent"`
	FramesRejected                   int64  `json:"frames_rejected"`
	FramesStale                      int64  `json:"frames_stale"`
	FramesShed                       int64  `json:"frames_shed"`
	CancelsDeferred                  int64  `json:"cancels_deferred"`
	SessionPanics                    int64  `json:"session_panics"`
	SessionPanicsPastBudget          int64  `json:"session_panics_past_budget"`
	ParentPanics                     int64  `json:"parent_panics"`
	PinErrors                        int64  `json:"pin_errors"`
	LeasesLapsed                     int64  `json:"leases_lapsed"`
	StreamViolations                 int64  `json:"stream_violations"`
	BlocksRevoked                    int64  `json:"blocks_revoked"`
	RevokedHeldBlocks                int64  `json:"revoked_held_blocks"`
	CallerBlocksAwaitingProof        int64  `json:"caller_blocks_awaiting_proof"`
	DestBlockErrors                  int64  `json:"dest_block_errors"`
	QuarantinedBytes                 uint64 `json:"quarantined_bytes"`
	QuarantineLimitBytes             uint64 `json:"quarantine_limit_bytes"`
	OpsInDoubt                       int64  `json:"ops_in_doubt"`
	ClosesUnproven                   int64  `json:"closes_unproven"`
	FramesSilenced                   int64  `json:"frames_silenced"`
	WaitingForBlocks                 int64  `json:"waiting_for_blocks"`
	OrphanRequests                   int64  `json:"orphan_requests"`
	OrphansEnded                     int64  `json:"orphans_ended"`
	WriteProofsExited                int64  `json:"write_proofs_exited"`
	WriteProofRequestsExited         int64  `json:"write_proof_requests_exited"`
	WriteProofsPidfdExit             int64  `json:"write_proofs_pidfd_exit"`
	WriteProofRequestsPidfdExit      int64  `json:"write_proof_requests_pidfd_exit"`
	WriteProofsDrainedGoodbye        int64  `json:"write_proofs_drained_goodbye"`
	WriteProofRequestsDrainedGoodbye int64  `json:"write_proof_requests_drained_goodbye"`
}

// engineStats is s in a report.
func engineStats(s kvxfer.Stats) EngineStats {
	p := s.WriteProofs
	return EngineStats{OpsPosted: s.OpsPosted, WorkerRestarts: s.WorkerRestarts, FramesUnsent: s.FramesUnsent,
		FramesRejected: s.FramesRejected, FramesStale: s.FramesStale, FramesShed: s.FramesShed,
		CancelsDeferred: s.CancelsDeferred, SessionPanics: s.SessionPanics, SessionPanicsPastBudget: s.SessionPanicsPastBudget,
		ParentPanics: s.ParentPanics, PinErrors: s.PinErrors, LeasesLapsed: s.LeasesLapsed,
		StreamViolations: s.StreamViolations, BlocksRevoked: s.BlocksRevoked, RevokedHeldBlocks: s.RevokedHeldBlocks,
		CallerBlocksAwaitingProof: s.CallerBlocksAwaitingProof, DestBlockErrors: s.DestBlockErrors,
		QuarantinedBytes: s.QuarantinedBytes, QuarantineLimitBytes: s.QuarantineLimitBytes,
		OpsInDoubt: s.OpsInDoubt, ClosesUnproven: s.ClosesUnproven, FramesSilenced: s.FramesSilenced, WaitingForBlocks: int64(s.WaitingForBlocks),
		OrphanRequests: s.OrphanRequests, OrphansEnded: s.OrphansEnded,
		WriteProofsExited: p[kvxfer.ProofExited].Proofs, WriteProofRequestsExited: p[kvxfer.ProofExited].Requests,
		WriteProofsPidfdExit: p[kvxfer.ProofPidfdExit].Proofs, WriteProofRequestsPidfdExit: p[kvxfer.ProofPidfdExit].Requests,
		WriteProofsDrainedGoodbye:        p[kvxfer.ProofDrainedGoodbye].Proofs,
		WriteProofRequestsDrainedGoodbye: p[kvxfer.ProofDrainedGoodbye].Requests}
}

const maxReportErrors = 8

// failed records one failed request in the report.
func (r *Report) failed(err error) {
	r.Failed++
	if r.FirstError == "" {
		r.FirstError = err.Error()
	}
	var lm *kvxfer.LayoutMismatchError
	if r.PeerModel == "" && errors.As(err, &lm) && lm.PeerModel != lm.Model {
		// One model laid out two ways is a setting apart, which the
		// error names itself.
		r.PeerModel, r.OwnModel = lm.PeerModel, lm.Model
	}
	if len(r.Errors) < maxReportErrors {
		r.Errors = append(r.Errors, err.Error())
	}
}

// listSettings are the settings both roles derive the request list from
// (Prompts), as flags. The context role sends them with each request's
// SUCCESS (kvxfer.SendRequest.Payload, after settingsTag) and the
// generation role compares them with its own: a --requests or token-range
// mismatch otherwise shows only as requests that never come, blamed on the
// peer leaving.
func (o Options) listSettings() string {
	return fmt.Sprintf("--requests %d --seed %d --min-tokens %d --max-tokens %d", o.Requests, o.Seed, o.MinTokens, o.MaxTokens)
}

// settingsTag starts the context role's payload (listSettings follows).
const settingsTag = "kvxfer-proc settings: "

// settingsMismatch is the generation role's verdict on a request's
// payload, given its own listSettings (made once, not per request): ""
// when the payload carries them or none (a context side that is not this
// package's), else both sides' settings.
func settingsMismatch(payload []byte, mine string) string {
	theirs, ok := bytes.CutPrefix(payload, []byte(settingsTag))
	if !ok || string(theirs) == mine {
		return ""
	}
	return fmt.Sprintf("the two roles were started with different request lists: the context process runs %s, this one %s (give both the same)",
		theirs, mine)
}

// Prompts is the request list both roles derive from the seed.
func Prompts(o Options) []int {
	rng := rand.New(rand.NewPCG(o.Seed, 0x70726f63))
	out := make([]int, o.Requests)
	for i := range out {
		out[i] = o.MinTokens + rng.IntN(o.MaxTokens-o.MinTokens+1)
	}
	return out
}

// layout is the layout o names (Layout, else Model's preset); false for
// an unknown model.
func (o Options) layout() (kvcache.Layout, bool) {
	if o.Layout != nil {
		return *o.Layout, true
	}
	l, err := kvcache.Preset(o.Model)
	return l, err == nil
}

// checkLayerParts refuses more layer parts than the model has layers,
// before anything opens. An unknown model is left to the engine to name.
func (o Options) checkLayerParts() error {
	l, ok := o.layout()
	if !ok {
		return nil // the engine names an unknown model
	}
	if o.LayerParts > l.Layers {
		return fmt.Errorf("--layer-parts = %d: %s has %d layers (0: one part per layer, 1: whole chunks)",
			o.LayerParts, l.Name, l.Layers)
	}
	return nil
}

// CheckChunkTokens names a --chunk-tokens below 1, or not a multiple of
// the block size, before anything opens: the context role found the
// latter only at each request's first chunk, after both processes had
// connected, as "kvcache: misaligned chunk", naming neither flag (and gen
// saw its requests cancelled). RunCtx calls it; the generation role takes
// no chunk size, and kvxfer gen calls it only for a --chunk-tokens given.
func (o Options) CheckChunkTokens() error {
	if o.ChunkTokens < 1 {
		return fmt.Errorf("--chunk-tokens = %d: must be ≥ 1", o.ChunkTokens)
	}
	l, ok := o.layout()
	if !ok {
		return nil // the engine names an unknown model
	}
	tpb := l.TokensPerBlock
	if o.TokensPerBlock > 0 {
		tpb = o.TokensPerBlock
	}
	if tpb > 0 && o.ChunkTokens%tpb != 0 {
		return fmt.Errorf("--chunk-tokens = %d: want a multiple of the block size, %d tokens (--tokens-per-block)", o.ChunkTokens, tpb)
	}
	return nil
}

// handedCount counts what the context role handed over.
type handedCount struct{ chunks, parts atomic.Int64 }

// RequestID names request i.
func RequestID(i int) string { return fmt.Sprintf("req-%d", i) }

// MaxRequests bounds Options.Requests, as kvxfer demo bounds its own:
// --requests 100000000 (a few zeros too many) was taken, and a role whose
// peer never came then spent minutes failing every request one by one
// after its --timeout before it exited.
const MaxRequests = 1 << 20

// validate names the first bad demo option and its value (flag names, as
// `kvxfer ctx` and `kvxfer gen` take them).
func (o Options) validate() error {
	switch {
	case o.Requests < 1:
		return fmt.Errorf("--requests = %d: must be ≥ 1", o.Requests)
	case o.Requests > MaxRequests:
		return fmt.Errorf("--requests = %d: at most %d (kvxfer demo's bound: each role derives and reports on every request)", o.Requests, MaxRequests)
	case o.MinTokens < 1:
		return fmt.Errorf("--min-tokens = %d: must be ≥ 1", o.MinTokens)
	case o.MaxTokens < o.MinTokens:
		return fmt.Errorf("--max-tokens = %d: must be ≥ --min-tokens (%d)", o.MaxTokens, o.MinTokens)
	case o.ChunkTokens < 0:
		return fmt.Errorf("--chunk-tokens = %d: must be ≥ 1", o.ChunkTokens)
	case o.Concurrency < 1:
		return fmt.Errorf("--concurrency = %d: must be ≥ 1", o.Concurrency)
	case o.Compute < 0:
		return fmt.Errorf("--compute = %v: must be ≥ 0", o.Compute)
	case o.LayerParts < 0:
		return fmt.Errorf("--layer-parts = %d: must be ≥ 0 (0: one per layer, 1: whole chunks)", o.LayerParts)
	case o.ProofWait < 0:
		return fmt.Errorf("ProofWait = %v: must be ≥ 0 (0: as long as the missed heartbeats take, 1 to 5 s)", o.ProofWait)
	case o.WriterLease < 0:
		return fmt.Errorf("--writer-lease = %v: must be ≥ 0 (0: off)", o.WriterLease)
	case o.WriterLease > 0 && o.WriterLease < 2*o.Heartbeat:
		return fmt.Errorf("--writer-lease = %v: shorter than two --heartbeat intervals (%v), it would lapse between heartbeats of a live peer",
			o.WriterLease, 2*o.Heartbeat)
	}
	switch o.Backend {
	case "", shm.Backend, ucx.Backend, cudaipc.Backend:
	default:
		return fmt.Errorf("--backend = %q: want %s, %s or %s", o.Backend, shm.Backend, ucx.Backend, cudaipc.Backend)
	}
	switch {
	case o.Device < 0:
		return fmt.Errorf("--device = %d: not a CUDA ordinal (0: the first GPU)", o.Device)
	case o.Device != 0 && o.Backend != cudaipc.Backend:
		return fmt.Errorf("--device = %d with --backend = %q: only backend %s runs on a GPU: drop --device, or give --backend %s",
			o.Device, o.Backend, cudaipc.Backend, cudaipc.Backend)
	}
	for _, p := range []struct {
		flag string
		tp   int
	}{{"--tp", o.parallel().TP}, {"--peer-tp", o.peerParallel().TP}, {"--pp", o.parallel().PP}, {"--peer-pp", o.peerParallel().PP}} {
		if p.tp < 1 { // before the check below blames the discovery
			return fmt.Errorf("%s = %d: must be ≥ 1", p.flag, p.tp)
		}
	}
	if o.etcd() {
		if o.Cluster == "" {
			return fmt.Errorf("--discovery = %q needs --cluster", o.Discovery)
		}
		if o.PeerPublicKey != "" && o.peerParallel() != (node.Parallel{TP: 1, PP: 1}) {
			return fmt.Errorf("--peer-key pins one peer rank, but --peer-tp = %d, --peer-pp = %d: the ranks' keys come from etcd", o.peerParallel().TP, o.peerParallel().PP)
		}
		if !o.Insecure && o.SecretKey == "" {
			return fmt.Errorf("CURVE needs a secret key (or --insecure)")
		}
		return nil
	}
	if o.parallel() != (node.Parallel{TP: 1, PP: 1}) || o.peerParallel() != (node.Parallel{TP: 1, PP: 1}) {
		return fmt.Errorf("--tp = %d, --pp = %d, --peer-tp = %d, --peer-pp = %d: more than one rank per instance needs --discovery etcd://HOST:PORT (one --peer-endpoint names one rank)",
			o.parallel().TP, o.parallel().PP, o.peerParallel().TP, o.peerParallel().PP)
	}
	if !o.Insecure && (o.SecretKey == "" || o.PeerPublicKey == "") {
		return fmt.Errorf("CURVE needs a secret key and the peer's public key (or --insecure)")
	}
	return nil
}

func (o Options) etcd() bool { return o.Discovery != "" && o.Discovery != "static" }

func (o Options) parallel() node.Parallel     { return orOne(o.Parallel) }
func (o Options) peerParallel() node.Parallel { return orOne(o.PeerParallel) }

func orOne(p node.Parallel) node.Parallel {
	if p.TP == 0 && p.PP == 0 {
		return node.Parallel{TP: 1, PP: 1}
	}
	return p
}

// ContextParallel is the parallelism a generation role's receives name
// for its context peer: PeerParallel (1×1 when unset), its split of the
// layers over its stages included.
func ContextParallel(o Options) kvcache.Parallel {
	pp := o.peerParallel()
	return kvcache.Parallel{TP: pp.TP, PP: pp.PP, Stages: pp.Stages}
}

// peers are the peer instance's ranks: the one static peer, or with etcd
// every rank of PeerParallel, found there.
func (o Options) peers() []node.Peer {
	key := o.PeerPublicKey
	if o.Insecure {
		key = "" // no CURVE: a node refuses keys it would ignore
	}
	if !o.etcd() {
		return []node.Peer{{Instance: o.Peer, Endpoint: o.PeerEndpoint, PublicKey: key}}
	}
	pp := o.peerParallel()
	var out []node.Peer
	for p := range pp.PP {
		for t := range pp.TP {
			out = append(out, node.Peer{Instance: o.Peer, Parallel: pp, Rank: node.Rank{TP: t, PP: p}, PublicKey: key})
		}
	}
	return out
}

// EtcdOptions are the TLS and auth options the role's node reaches etcd
// with (node.Config.EtcdOptions), for another reader of that etcd.
func (o Options) EtcdOptions() ([]discovery.Option, error) {
	return o.nodeConfig(false, nil).EtcdOptions()
}

// nodeConfig is the node this role runs on (a context role only sends).
func (o Options) nodeConfig(sendOnly bool, down func()) node.Config {
	backend := o.Backend
	if backend == "" {
		backend = shm.Backend
	}
	c := node.Config{Instance: o.Instance, Parallel: o.Parallel, Rank: o.Rank, Model: o.Model, Layout: o.Layout, TokensPerBlock: o.TokensPerBlock,
		PoolBytes: o.PoolBytes, SendOnly: sendOnly, Workers: o.Workers, Backend: backend, Device: o.Device, Bind: o.Bind,
		Peers:    o.peers(),
		Insecure: o.Insecure, SecretKey: o.SecretKey, HeartbeatInterval: node.Duration(o.Heartbeat),
		HeartbeatMisses: o.HeartbeatMisses, TransferTimeout: node.Duration(o.Timeout), DrainGrace: node.Duration(time.Second),
		WriterLease: node.Duration(o.WriterLease),
		MetricsAddr: o.MetricsAddr, TracePath: o.TracePath, TraceMaxBytes: o.TraceMaxBytes, TraceKeep: o.TraceKeep, Logger: &o.Log,
		OnPeerDown: func(instance string, rank int) {
			if instance == o.Peer {
				down()
			}
		},
	}
	if o.Insecure {
		c.SecretKey = "" // as peers: a node refuses keys it would ignore
	}
	if o.etcd() {
		c.Discovery, c.Cluster, c.DiscoveryTTL = o.Discovery, o.Cluster, node.Duration(o.DiscoveryTTL)
		c.DiscoveryCA, c.DiscoveryCert, c.DiscoveryKey = o.DiscoveryCA, o.DiscoveryCert, o.DiscoveryKey
		c.DiscoveryUser, c.DiscoveryPasswordFile = o.DiscoveryUser, o.DiscoveryPasswordFile
	}
	for _, id := range o.Identities {
		c.Identities = append(c.Identities, node.Identity{PublicKey: id.PublicKey, Instance: id.Instance, Ranks: id.Ranks})
	}
	return c
}

// proofWait is Options.ProofWait, or by default as long as the missed
// heartbeats took, at least a second, at most five.
func (o Options) proofWait() time.Duration {
	if o.ProofWait > 0 {
		return o.ProofWait
	}
	return min(max(o.Heartbeat*time.Duration(o.HeartbeatMisses), time.Second), 5*time.Second)
}

// role is one process's node and what the workload watches of it.
type role struct {
	*node.Node
	eng  *kvxfer.Engine
	mem  *poolMem      // the pool's bytes (through CUDA copies on cudaipc)
	down chan struct{} // closed when the peer is declared dead
	log  zerolog.Logger
	// proofWait bounds how long the role waits, once its peer is down,
	// for the proof that frees what that peer's unanswered requests keep
	// quarantined (awaitProof).
	proofWait time.Duration
	// closedBye: the peer said goodbye (node.Config.OnPeerGoodbye);
	// byeReason: the first reason such a goodbye named, after the peer's
	// rank (nil: none). Set before down is closed for that goodbye.
	closedBye atomic.Bool
	byeReason atomic.Pointer[string]
	// mistake is the error this role found in the pairing and fails on
	// (waitPeer's), which its goodbye names (finish).
	mistake error
}

// peerExit says how the peer left, for the errors of the requests it
// ended: "exited on an error (peer_reason)" when its goodbye named one
// (Report.PeerReason names it once, and the run's error leads with it),
// else plain.
func (n *role) peerExit(plain string) string {
	if n.byeReason.Load() != nil {
		return "exited on an error (peer_reason)"
	}
	return plain
}

func open(ctx context.Context, o Options, sendOnly bool) (*role, error) {
	r := &role{down: make(chan struct{}), log: o.Log, proofWait: o.proofWait()}
	// The heap the collector's floor lets grow, resident before the first
	// request rather than faulted in over the first thousands
	// (internal/gcfloor; nothing where no floor is set).
	gcfloor.Warm()
	var once sync.Once
	octx := ctx
	if o.Discovery != "" && o.Discovery != "static" && o.Timeout > 0 {
		// Registering waits while another process's live lease holds
		// this rank's key (a restart waits for its predecessor): the
		// wait is bounded by --timeout, as every other wait of a role.
		var cancel context.CancelFunc
		octx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	c := o.nodeConfig(sendOnly, func() { once.Do(func() { close(r.down) }) })
	c.OnPeerGoodbye = func(instance string, rank int, reason string) {
		if instance != o.Peer {
			return
		}
		r.closedBye.Store(true)
		if reason != "" { // the node logged it
			named := fmt.Sprintf("%s/%d: %s", instance, rank, reason)
			r.byeReason.CompareAndSwap(nil, &named)
		}
	}
	n, err := node.Open(octx, c)
	if err != nil {
		if ctx.Err() == nil && octx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			// --timeout's own deadline, not one inside discovery (an etcd
			// nothing answers at fails at its dial timeout, and says so).
			// Only a key held by a live lease is another process's doing:
			// a --timeout shorter than the dial timeout also ends a dial
			// that failed for its own reason (no TLS, a wrong CA), named
			// in err.
			hint := ""
			if errors.Is(err, discovery.ErrHeld) {
				hint = "; if another process runs as this rank, give this one its own --tp-rank or --instance, or stop that one"
			}
			return nil, fmt.Errorf("instance %s, rank tp%d/pp%d, could not register in etcd cluster %q within --timeout %s: %w%s",
				o.Instance, o.Rank.TP, o.Rank.PP, o.Cluster, o.Timeout, err, hint)
		}
		return nil, err
	}
	r.Node, r.eng = n, n.Engine()
	if r.mem, err = openPoolMem(r.eng); err != nil {
		_ = n.Close(ctx)
		return nil, err
	}
	if err := fitsPool(r.eng, o); err != nil {
		_ = n.Close(ctx)
		_ = r.mem.close()
		return nil, err
	}
	return r, nil
}

// poolName is how the user set the pool: PoolName, or "--pool".
func (o Options) poolName() string {
	if o.PoolName == "" {
		return "--pool"
	}
	return o.PoolName
}

// fitsPool fails, wrapping kvcache.ErrPoolTooSmall and naming the pool and
// --max-tokens, when the longest prompt of o's request list needs more
// blocks in some layer group than this rank's pool holds: each side
// allocates every block of a prompt in every group, so that request
// could only fail, and only once the peer had come.
func fitsPool(e *kvxfer.Engine, o Options) error {
	i, n := 0, 0
	for j, p := range Prompts(o) {
		if p > n {
			i, n = j, p
		}
	}
	l, pools := e.Layout(), e.Pools()
	for g := range pools.Groups() {
		if err := pools.Geometry(g).CheckFits(l.BlocksFor(n)); err != nil {
			return fmt.Errorf("%s is too small for %s (%d tokens of %s, --max-tokens %d), layer group %d: %w: use a larger %s or a smaller --max-tokens",
				o.poolName(), RequestID(i), n, l.Name, o.MaxTokens, g, err, o.poolName())
		}
	}
	return nil
}

// RunGen is the generation role: receive every request, verify every byte,
// free, and report.
func RunGen(ctx context.Context, o Options, out io.Writer) (Report, error) {
	rep := Report{Role: "gen", Requests: o.Requests}
	if err := o.validate(); err != nil {
		return rep, err
	}
	n, err := open(ctx, o, false)
	if err != nil {
		return rep, err
	}
	t0, cpu0 := time.Now(), processCPU()
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		rep.failed(err)
		mu.Unlock()
	}
	// Wait (up to the transfer timeout) for the context process's Hello:
	// a peer that is not running, speaks with another key or serves
	// another model is named now, once, instead of by every request at its
	// deadline.
	if err := waitPeer(ctx, n, o); err != nil {
		o.Log.Error().Err(err).Msg("waiting for the context process")
		if ctx.Err() == nil && !errors.Is(err, node.ErrPeerExited) { // the peer's mistake is not ours to tell it
			n.mistake = err
		}
		for i := range Prompts(o) {
			fail(fmt.Errorf("%s: %w", RequestID(i), err))
		}
		return finish(n, rep, t0, cpu0, out)
	}
	o.Log.Info().Int("requests", o.Requests).Msg("peers ready: requests start")
	var inflight atomic.Int64 // Receives not yet done (Options.Canary)
	canaryDone := make(chan struct{})
	if o.Canary {
		go func() {
			defer close(canaryDone)
			select {
			case <-n.down:
			case <-ctx.Done():
				return
			}
			c, q, bad, err := canary(ctx, n, o, &inflight)
			mu.Lock()
			rep.CanaryBlocks, rep.QuarantinedAtDown, rep.CanaryCorrupt = c, q, bad
			rep.RevokedBlocks = int(n.eng.Stats().BlocksRevoked)
			mu.Unlock()
			if err != nil {
				fail(fmt.Errorf("canary: %w", err))
			}
		}()
	} else {
		close(canaryDone)
	}
	sem := make(chan struct{}, o.Concurrency)
	var wg sync.WaitGroup
	l, shape := n.eng.Layout(), n.eng.Shape()
	mine := o.listSettings()
	pool := newWorkers(o.Concurrency)
	end := newLastEnd(o.Requests, n.down)
	var lat []time.Duration
	// Requests are opened in index order on both sides, so both pools
	// are allocated in one global order: the oldest unfinished request
	// always holds blocks on both sides and completes, and a full pool
	// cannot deadlock the pair (a serving router does the same by
	// admitting a request to prefill only once decode can take it).
	for i, pl := range Prompts(o) {
		sem <- struct{}{}
		if closed(n.down) {
			fail(fmt.Errorf("%s: context peer %s", RequestID(i), n.peerExit("is down")))
			end.ended(false)
			<-sem
			continue
		}
		if err := n.Err(); err != nil { // out of the etcd cluster: no request can start
			fail(fmt.Errorf("%s: %w", RequestID(i), err))
			end.ended(false)
			<-sem
			continue
		}
		if o.Pause > 0 {
			sleepCtx(ctx, o.Pause)
		}
		t := time.Now()
		h, err := n.Receive(ctx, kvxfer.ReceiveRequest{ID: RequestID(i), PromptLen: pl, Context: o.Peer,
			ContextParallel: ContextParallel(o)})
		if err != nil {
			fail(err)
			end.ended(false)
			<-sem
			continue
		}
		wg.Add(1)
		inflight.Add(1)
		pool.run(func() {
			defer func() { <-sem; wg.Done() }()
			// As the loop: once the peer is down it is dead for this run.
			// A request opened as it fell (the engine failed those it had)
			// would otherwise wait for its Hello until the timeout.
			res := outcome(h.Done(), h.Cancel, n.down)
			end.ended(res.OK) // its bytes are checked below, the peer's part is over
			inflight.Add(-1)
			d := time.Since(t)
			if hoptrace.On {
				hoptrace.Mark("gen.done", RequestID(i))
			}
			if !res.OK {
				if errors.Is(res.Err, kvxfer.ErrPromptMismatch) {
					// The context process's request list differs: its
					// settings come only with a SUCCESS, which no request
					// of such a run has. Name ours.
					mu.Lock()
					if rep.SettingsMismatch == "" {
						rep.SettingsMismatch = fmt.Sprintf("the two roles were started with different request lists: %s has %d tokens here, another length in the context process, which this one derives from %s (give both the same)",
							RequestID(i), pl, mine)
						o.Log.Error().Msg(rep.SettingsMismatch)
					}
					mu.Unlock()
				}
				fail(outcomeErr(RequestID(i), res, n, "context"))
				return
			}
			if bad := settingsMismatch(res.Payload, mine); bad != "" {
				mu.Lock()
				if rep.SettingsMismatch == "" {
					rep.SettingsMismatch = bad
					o.Log.Error().Msg(bad)
				}
				mu.Unlock()
			}
			var verified, want uint64
			bad := 0
			for g, grp := range l.Groups {
				first, end := kvcache.NeededRange(pl, grp.Window, l.TokensPerBlock, 0)
				geom := n.eng.Pools().Geometry(g)
				// What the prompt needs comes from the layout, not from
				// the outcome: a plan short of blocks would verify every
				// block it has (a review's mutation dropped each
				// prompt's last block, and gen exited 0).
				want += uint64(end-first) * geom.BlockBytes
				if got := len(res.Blocks[g]); got != end-first {
					bad += max(got, end-first) - min(got, end-first)
					o.Log.Error().Str("request", RequestID(i)).Int("group", g).Int("blocks", got).Int("want", end-first).
						Msg("READY with another number of blocks than the prompt needs")
				}
				buf := n.mem.scratch(geom.BlockBytes)
				for bi, id := range res.Blocks[g] {
					if first+bi >= end {
						break // counted above
					}
					b, err := n.mem.get(geom.Offset+uint64(id)*geom.BlockBytes, geom.BlockBytes, buf)
					if err != nil {
						fail(fmt.Errorf("%s: read block %d of group %d: %w", RequestID(i), id, g, err))
						return
					}
					if checkBlock(b, l, shape, i, g, first+bi) {
						verified += uint64(len(b))
					} else {
						bad++
					}
				}
			}
			if res.Bytes != want {
				bad++
				o.Log.Error().Str("request", RequestID(i)).Uint64("bytes", res.Bytes).Uint64("want", want).
					Msg("READY counting other bytes than the prompt's")
			}
			err = n.eng.FreeBlocks(res.Blocks)
			mu.Lock()
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "ready %s\n", RequestID(i))
			}
			lat = append(lat, d)
			rep.OK++
			rep.Bytes += res.Bytes
			rep.BytesVerified += verified
			rep.Mismatches += bad
			mu.Unlock()
			if err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	pool.close()
	rep.PeerDownMidRun = end.downMidRun()
	if err := n.Err(); err != nil {
		rep.NodeFailed = err.Error()
	}
	<-canaryDone
	select {
	case <-n.down:
		rep.PeerDown = true
	default:
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		rep.LatencyP50Us = float64(lat[len(lat)/2].Nanoseconds()) / 1e3
		rep.LatencyP99Us = float64(lat[len(lat)*99/100].Nanoseconds()) / 1e3
	}
	return finish(n, rep, t0, cpu0, out)
}

// RunCtx is the context role: prefill every request (simulated compute,
// pattern-filled KV), hand each chunk over with a fence as it completes,
// and report. If the generation peer goes down, outstanding requests are
// cancelled (they can no longer complete). After its last request it
// waits, at most the transfer timeout, for the generation peer to leave
// (awaitGenLeaves), and names in Report.SettingsMismatch the requests
// that peer asked for past this role's list, if any came.
func RunCtx(ctx context.Context, o Options, out io.Writer) (Report, error) {
	rep := Report{Role: "ctx", Requests: o.Requests}
	if err := o.validate(); err != nil {
		return rep, err
	}
	if err := o.checkLayerParts(); err != nil {
		return rep, err
	}
	if err := o.CheckChunkTokens(); err != nil { // the generation role takes no chunk size
		return rep, err
	}
	n, err := open(ctx, o, true)
	if err != nil {
		return rep, err
	}
	t0, cpu0 := time.Now(), processCPU()
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		rep.failed(err)
		mu.Unlock()
	}
	// Wait for the generation process's Hello, as RunGen waits for ours:
	// a peer that is not running, refuses our key, runs insecure or
	// serves another model is named now, once, instead of by every
	// request at its deadline. The peer may start a little later: the
	// wait is the transfer timeout.
	if err := waitPeer(ctx, n, o); err != nil {
		o.Log.Error().Err(err).Msg("waiting for the generation process")
		if errors.Is(err, kvxfer.ErrMismatch) {
			awaitPeerLeaves(ctx, n, o)
		}
		if ctx.Err() == nil && !errors.Is(err, node.ErrPeerExited) { // the peer's mistake is not ours to tell it
			n.mistake = err
		}
		for i := range Prompts(o) {
			fail(fmt.Errorf("%s: %w", RequestID(i), err))
		}
		return finish(n, rep, t0, cpu0, out)
	}
	o.Log.Info().Int("requests", o.Requests).Msg("peers ready: requests start")
	l, shape := n.eng.Layout(), n.eng.Shape() // copies: once, not per request
	sem := make(chan struct{}, o.Concurrency)
	var wg sync.WaitGroup
	var handed handedCount
	settings := []byte(settingsTag + o.listSettings())
	pool := newWorkers(o.Concurrency)
	end := newLastEnd(o.Requests, n.down)
	for i, pl := range Prompts(o) {
		sem <- struct{}{}
		if closed(n.down) { // as RunGen: the rest fail at once, not one by one
			fail(fmt.Errorf("%s: generation peer %s", RequestID(i), n.peerExit("is down")))
			end.ended(false)
			<-sem
			continue
		}
		if err := n.Err(); err != nil { // as RunGen
			fail(fmt.Errorf("%s: %w", RequestID(i), err))
			end.ended(false)
			<-sem
			continue
		}
		// Source blocks in index order (see RunGen).
		counts := make([]int, len(l.Groups))
		for g := range counts {
			if len(shape.Layers[g]) > 0 {
				counts[g] = l.BlocksFor(pl)
			}
		}
		src, err := n.eng.Pools().AllocWait(ctx, counts)
		if err != nil {
			fail(err)
			end.ended(false)
			<-sem
			continue
		}
		wg.Add(1)
		pool.run(func() {
			defer func() { <-sem; wg.Done() }()
			sent, err := ctxRequest(ctx, o, n, l, shape, i, pl, src, settings, &handed)
			end.ended(err == nil)
			if err != nil {
				if errors.Is(err, kvxfer.ErrPromptMismatch) {
					// As RunGen: the generation process planned another
					// length, so its request list differs. Name ours.
					mu.Lock()
					if rep.SettingsMismatch == "" {
						rep.SettingsMismatch = fmt.Sprintf("the two roles were started with different request lists: %s has %d tokens here, another length in the generation process, which this one derives from %s (give both the same)",
							RequestID(i), pl, o.listSettings())
						o.Log.Error().Msg(rep.SettingsMismatch)
					}
					mu.Unlock()
				}
				fail(err)
				return
			}
			mu.Lock()
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "done %s\n", RequestID(i))
			}
			rep.OK++
			rep.Bytes += sent
			mu.Unlock()
		})
	}
	wg.Wait()
	pool.close()
	rep.PeerDownMidRun = end.downMidRun()
	if err := n.Err(); err != nil {
		rep.NodeFailed = err.Error()
	}
	rep.Chunks, rep.Parts = int(handed.chunks.Load()), int(handed.parts.Load())
	if !closed(n.down) && ctx.Err() == nil {
		if cause := awaitGenLeaves(ctx, n, o); cause != "" {
			o.Log.Error().Msg(cause)
			mu.Lock()
			if rep.SettingsMismatch == "" {
				rep.SettingsMismatch = cause
			}
			mu.Unlock()
		}
	}
	select {
	case <-n.down:
		rep.PeerDown = true
	default:
	}
	return finish(n, rep, t0, cpu0, out)
}

// orphanPoll is how often awaitGenLeaves looks at the engine's orphans
// (no event says one came).
const orphanPoll = 5 * time.Millisecond

// awaitGenLeaves holds the context role's node open, once its last
// request ended, until the generation side leaves (its goodbye, or its
// down: missed heartbeats, or under etcd its departure), at most the
// transfer timeout (a generation side that says nothing more cannot hold
// this role longer), or until ctx ends. Under etcd the generation side's
// last request may still wait for another context rank, and this rank's
// departure would fail it (a Down fails every request with the rank). In
// either mode a generation process given more --requests asks for
// requests past this one's: their RequestData wait here for a Send that
// never comes (orphans, kvxfer.Stats.OrphanRequests), and the generation
// side would say goodbye only once they timed out. The first one seen
// ends the wait at once; the cause names it, and this role's run fails.
// It returns "" when the generation side left (or the wait ended) with
// no orphan seen.
func awaitGenLeaves(ctx context.Context, n *role, o Options) string {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = kvxfer.DefaultTransferTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	tick := time.NewTicker(orphanPoll)
	defer tick.Stop()
	st := n.eng.Stats()
	base := st.OrphanRequests + st.OrphansEnded
	for {
		if cause := orphanCause(n.eng, o, base); cause != "" {
			return cause
		}
		select {
		case <-n.down:
			return orphanCause(n.eng, o, base) // what came before its goodbye
		case <-ctx.Done():
			return ""
		case <-t.C:
			o.Log.Warn().Msgf("the generation side did not leave within %v; leaving", timeout)
			return ""
		case <-tick.C:
		}
	}
}

// orphanCause names the requests the generation side asked this context
// engine for past this role's request list (kvxfer.Stats.OrphanRequests
// and OrphansEnded, kvxfer.Engine.OrphanIDs), or "" when none is known.
// base is the orphans' count (live and ended) when the wait began, once
// every request of this role was sent.
func orphanCause(e *kvxfer.Engine, o Options, base int64) string {
	st := e.Stats()
	return orphanText(e.OrphanIDs(), st.OrphanRequests+st.OrphansEnded, base, o.Requests)
}

// orphanText is orphanCause's text: ids are the first few orphans named,
// total the orphans counted so far, base those counted when the wait
// began, requests this role's request list. An orphan of this role's own
// list is no mismatch: its RequestData came before this role's Send and
// ended first (the generation side's deadline passed, it cancelled), and
// that request's own failure says so. So the cause is a named orphan past
// the list, or an orphan that came once every request of the list was
// sent (one of the list would have found its Send: only one past it can
// be an orphan then). Orphans of the list alone, before the wait, are no
// cause: with the list's first few filling the names, one past it that
// ended before the wait is not seen (the run then ends as before).
func orphanText(ids []string, total, base int64, requests int) string {
	if total == 0 {
		return ""
	}
	mine := make(map[string]bool, requests)
	for i := range requests {
		mine[RequestID(i)] = true
	}
	var past []string
	for _, id := range ids {
		if !mine[id] {
			past = append(past, id)
		}
	}
	more := func(named string, n int64) string {
		if n > 1 {
			return fmt.Sprintf("%s (and %d more)", named, n-1)
		}
		return named
	}
	switch {
	case len(past) > 0:
		return fmt.Sprintf("the generation process asked for %s, past this process's --requests %d; give both roles the same --requests",
			more(past[0], max(int64(len(past)), total-base)), requests)
	case total > base:
		return fmt.Sprintf("the generation process asked for %s after this process sent every request of its --requests %d; give both roles the same request list",
			more("a request", total-base), requests)
	}
	return ""
}

// lastEnd tells whether the peer was declared down before the run's last
// request ended (Report.PeerDownMidRun): each request's end calls ended,
// and the last one reads what the ends saw. A peer that leaves once every
// request ended (the context process exits while the generation process
// still checks the last request's bytes) is not down mid-run. A request
// that succeeded ended before the peer's down, however late its role
// looks at it (a down fails the requests it finds live; a peer's goodbye
// as it closes comes within moments of its last request's success); one
// that failed is taken to have ended after the down when the down is
// known as the role sees the failure.
type lastEnd struct {
	left     atomic.Int64
	down     <-chan struct{}
	lateFail atomic.Bool // a request failed with the peer known down
	midRun   atomic.Bool
}

func newLastEnd(requests int, down <-chan struct{}) *lastEnd {
	e := &lastEnd{down: down}
	e.left.Store(int64(requests))
	return e
}

// ended notes one request's end (its outcome, or its failure to start);
// ok: it succeeded.
func (e *lastEnd) ended(ok bool) {
	if !ok && closed(e.down) {
		e.lateFail.Store(true) // before the count: the last end reads it
	}
	if e.left.Add(-1) == 0 {
		e.midRun.Store(e.lateFail.Load())
	}
}

// downMidRun is whether the peer was down before the last request ended;
// with requests that never ended, whether it is down now.
func (e *lastEnd) downMidRun() bool {
	if e.left.Load() > 0 {
		return closed(e.down)
	}
	return e.midRun.Load()
}

// workers runs the jobs handed to it on n long-lived goroutines, as a
// serving process's threads call the engine: a goroutine per request
// starts on a fresh 2 KiB stack and grows it on every request (stack
// copies took ~2.5 % of each side's Go CPU in the control round trip's
// profile). The roles bound their jobs with a semaphore of n, so run
// waits at most for a worker to come back from the job that released it.
type workers struct {
	jobs chan func()
	done sync.WaitGroup
}

func newWorkers(n int) *workers {
	w := &workers{jobs: make(chan func())}
	for range n {
		w.done.Go(func() {
			for f := range w.jobs {
				f()
			}
		})
	}
	return w
}

func (w *workers) run(f func()) { w.jobs <- f }

// close stops the workers once each has returned from its job.
func (w *workers) close() {
	close(w.jobs)
	w.done.Wait()
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// ctxRequest sends request i and returns the bytes its send reports
// (kvxfer.Outcome.Bytes) when it succeeded.
func ctxRequest(ctx context.Context, o Options, n *role, l kvcache.Layout, shape kvcache.Shape, i, pl int, src [][]kvcache.BlockID, settings []byte, handed *handedCount) (uint64, error) {
	tx, err := n.eng.Send(ctx, kvxfer.SendRequest{ID: RequestID(i), PromptLen: pl, Payload: settings})
	if err != nil {
		_ = n.eng.Pools().Free(src)
		return 0, err
	}
	chunks, err := kvcache.Chunks(pl, o.ChunkTokens, l.TokensPerBlock)
	if err != nil {
		tx.Cancel()
		<-tx.Done()
		_ = n.eng.Pools().Free(src)
		return 0, err
	}
	parts := kvcache.SplitLayers(l.Layers, o.LayerParts)
	bufs := make([][]byte, len(l.Groups)) // a device pool's blocks go through these
	for g := range bufs {
		bufs[g] = n.mem.scratch(n.eng.Pools().Geometry(g).BlockBytes)
	}
	var fillTook time.Duration // the last part's fill: its compute ends with it
chunks:
	for _, c := range chunks {
		// Part by part, as a forward pass computes it: hand the part
		// over, spend its share of the compute, write its layers' KV at
		// its end, fire its fence. Written first, the right bytes were
		// there long before the fence, and an engine that read a part
		// early passed the check (a review's mutation).
		t := time.Now()
		b0, b1 := c.Blocks(l.TokensPerBlock)
		runs := c.Runs(l.TokensPerBlock, src)
		for pi, part := range parts {
			pc := c
			pc.Layers = part
			f := &kvxfer.ManualFence{}
			if err := tx.Chunk(pc, runs, f); err != nil {
				f.Fire(err)
				break chunks
			}
			handed.parts.Add(1)
			if part.Final() {
				handed.chunks.Add(1)
			}
			if rest := o.Compute*time.Duration(pi+1)/time.Duration(len(parts)) - fillTook - time.Since(t); rest > 0 {
				sleepCtx(ctx, rest) // simulated prefill compute: a signal's drain does not wait it out
			}
			fillAt := time.Now()
			if err := fillChunk(n.mem, n.eng.Pools(), bufs, l, shape, src, i, b0, b1, part); err != nil {
				f.Fire(err)
				break chunks
			}
			fillTook = time.Since(fillAt)
			f.Fire(nil)
		}
		select {
		case <-n.down:
			tx.Cancel()
		default:
		}
	}
	res := outcome(tx.Done(), tx.Cancel, n.down)
	// Done fires only after every pin dropped: the source blocks are ours.
	if err := n.eng.Pools().Free(src); err != nil {
		return 0, err
	}
	if !res.OK {
		return 0, outcomeErr(RequestID(i), res, n, "generation")
	}
	return res.Bytes, nil
}

// fillChunk writes request i's pattern for layers part into blocks b0..b1
// of its source blocks src (a device pool's through bufs: read, filled,
// written back, so that the other parts' bytes stay).
func fillChunk(m *poolMem, pools *actors.Pools, bufs [][]byte, l kvcache.Layout, shape kvcache.Shape, src [][]kvcache.BlockID, i, b0, b1 int, part kvcache.LayerPart) error {
	for g := range l.Groups {
		if len(src[g]) == 0 {
			continue
		}
		geom := pools.Geometry(g)
		for b := b0; b < b1; b++ {
			off := geom.Offset + uint64(src[g][b])*geom.BlockBytes
			blk, err := m.get(off, geom.BlockBytes, bufs[g])
			if err != nil {
				return fmt.Errorf("%s: read source block %d of group %d: %w", RequestID(i), src[g][b], g, err)
			}
			fillBlock(blk, l, shape, i, g, b, part)
			if err := m.put(off, blk); err != nil {
				return fmt.Errorf("%s: write source block %d of group %d: %w", RequestID(i), src[g][b], g, err)
			}
		}
	}
	return nil
}

// canaryByte is the canary written into block id of group g.
func canaryByte(g int, id kvcache.BlockID, i int) byte { return byte(0xA5 ^ g*31 ^ int(id)*7 ^ i) }

// canary is Options.Canary once the peer is declared down: every free
// destination block is allocated and filled with a canary, held until the
// quarantine is empty (at most the transfer timeout), then checked and
// freed. It returns the canary blocks, the most blocks quarantined while it
// started, and the canaries found overwritten.
func canary(ctx context.Context, n *role, o Options, inflight *atomic.Int64) (blocks, quarantined, corrupt int, err error) {
	pools := n.eng.Pools()
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = kvxfer.DefaultTransferTimeout
	}
	deadline := time.Now().Add(timeout)
	// The requests in flight fail on the suspicion first (their blocks go
	// to quarantine as they are decided).
	for inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	// Blocks in quarantine, and revoked blocks whose old memory waits for
	// its proof (a revoking shm pool hands them back at once: the canaries
	// below then take them, and a stale writer's late writes must not show).
	held := func() int { return pools.Quarantined() + int(n.eng.Stats().RevokedHeldBlocks) }
	quarantined = held()
	var taken [][][]kvcache.BlockID
	counts := make([]int, pools.Groups())
	for g := range counts {
		counts[g] = 1
	}
	limit := pools.QuarantineLimit()  // the bound in force (a configured one, or the default's value)
	pools.SetQuarantineLimit(1 << 62) // the canaries take every free block, whatever is quarantined
	for {
		b, aerr := pools.Alloc(counts)
		if aerr != nil {
			break
		}
		taken = append(taken, b)
		for g, ids := range b {
			geom := pools.Geometry(g)
			for _, id := range ids {
				off := geom.Offset + uint64(id)*geom.BlockBytes
				blk, gerr := n.mem.get(off, geom.BlockBytes, n.mem.scratch(geom.BlockBytes))
				if gerr == nil {
					for i := range blk {
						blk[i] = canaryByte(g, id, i)
					}
					gerr = n.mem.put(off, blk)
				}
				if gerr != nil && err == nil {
					err = fmt.Errorf("write a canary into block %d of group %d: %w", id, g, gerr)
				}
				blocks++
			}
		}
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "canary %d quarantined %d\n", blocks, quarantined)
	}
	for {
		q := held()
		quarantined = max(quarantined, q) // the peak: proofs come only after the resume
		if q == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			err = fmt.Errorf("%d blocks still quarantined or revoked %v after the peer was declared down", held(), timeout)
			break
		}
		time.Sleep(5 * time.Millisecond) // poll with a deadline
	}
	for _, b := range taken {
		for g, ids := range b {
			geom := pools.Geometry(g)
			for _, id := range ids {
				off := geom.Offset + uint64(id)*geom.BlockBytes
				blk, gerr := n.mem.get(off, geom.BlockBytes, n.mem.scratch(geom.BlockBytes))
				if gerr != nil {
					if err == nil {
						err = fmt.Errorf("read the canary of block %d of group %d: %w", id, g, gerr)
					}
					continue
				}
				for i := range blk {
					if blk[i] != canaryByte(g, id, i) {
						corrupt++
						break
					}
				}
			}
		}
		if ferr := pools.Free(b); ferr != nil && err == nil {
			err = ferr
		}
	}
	pools.SetQuarantineLimit(limit)
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "released %d corrupt %d\n", blocks, corrupt)
	}
	return blocks, quarantined, corrupt, err
}

// processCPU is the process's CPU time so far; 0 where it cannot be read.
func processCPU() time.Duration {
	d, err := cpustat.ProcessCPU()
	if err != nil {
		return 0
	}
	return d
}

// waitPeer waits for the peer's Hello, with the transfer timeout as
// deadline, and checks it serves the same layout.
func waitPeer(ctx context.Context, n *role, o Options) error {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = kvxfer.DefaultTransferTimeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("no Hello within %v", timeout))
	defer cancel()
	return handshakeHint(n.WaitPeers(ctx), o, n.PublicKey())
}

// handshakeHint adds to a failed wait for the peer (err) what the user
// should compare: with CURVE and a static peer, a wrong key is the
// likeliest cause of a failed handshake, so both keys this side holds
// (own, its public key, and the peer's) are named, to compare with the
// two .pub files; but a handshake the link saw fail on a security
// mechanism mismatch is one side running --insecure, not the keys.
func handshakeHint(err error, o Options, own string) error {
	if !errors.Is(err, node.ErrHandshake) {
		return err
	}
	if zmq.CauseOf(err) == zmq.CauseMechanismMismatch {
		// Naming the keys sent the user comparing key files that were
		// right.
		return fmt.Errorf("%w (give both roles --insecure, or neither)", err)
	}
	if !o.Insecure && o.PeerPublicKey != "" && o.PeerEndpoint != "" {
		return fmt.Errorf("%w (this engine's public key is %s…, the one it holds for %s is %s…: each side's --peer-key must be the other's PREFIX.pub)",
			err, keyPrefix(own), o.Peer, keyPrefix(o.PeerPublicKey))
	}
	return err
}

// keyPrefix is the first 8 characters of a Z85 public key, as the link's
// logs name a key.
func keyPrefix(k string) string {
	if len(k) > 8 {
		return k[:8]
	}
	return k
}

// awaitPeerLeaves holds the context role's node open after the generation
// peer's Hello showed a mismatch (another model, another protocol version)
// until that peer is down, at most the transfer timeout: our own Hello may
// not have reached it yet (our connection to it can come up after its
// connection to us), and once it has, it fails naming the mismatch too
// and leaves, instead of waiting for a Hello from a context role that
// closed. (RunGen leaves at once: one side must wait for the other.)
func awaitPeerLeaves(ctx context.Context, n *role, o Options) {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = kvxfer.DefaultTransferTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-n.down:
	case <-ctx.Done():
	case <-t.C:
	}
}

// outcome is a request's outcome (done), cancelling it once the peer is
// declared down: its Done then fires when no write is left.
func outcome(done <-chan kvxfer.Outcome, cancel func(), down <-chan struct{}) kvxfer.Outcome {
	select {
	case res := <-done:
		return res
	case <-down:
		cancel()
		return <-done
	}
}

// onlyNotWithdrawn reports whether err is nothing but the registry's
// failure to withdraw its record (discovery.ErrNotWithdrawn), alone or
// joined with nils.
func onlyNotWithdrawn(err error) bool {
	if err == nil || !errors.Is(err, discovery.ErrNotWithdrawn) {
		return false
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return true
	}
	for _, e := range j.Unwrap() {
		if !onlyNotWithdrawn(e) {
			return false
		}
	}
	return true
}

// awaitProof waits, at most proofWait, for the blocks quarantined when
// the peer went down to be released. A peer that closed gracefully says
// goodbye and is down at once, before its process has exited; the pages
// of the requests it never answered stay quarantined until the proof of
// its exit (a pidfd on its process, same host) comes a moment later, and
// closing the engine first would cut that proof off (the blocks would be
// reported quarantined at the end). Missed heartbeats used to give the
// proof that time; the wait gives it back, no longer than they took (at
// least a second, at most five). A peer whose exit cannot be proven from
// here leaves them quarantined: the report says so. Options.ProofWait
// sets the bound instead.
func (n *role) awaitProof() {
	pools := n.eng.Pools()
	if pools.Quarantined() == 0 {
		return
	}
	deadline := time.Now().Add(n.proofWait)
	for pools.Quarantined() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // a gauge to poll: no event says a quarantine ended
	}
	if q := pools.Quarantined(); q > 0 {
		n.log.Warn().Int("blocks", q).Dur("waited", n.proofWait).
			Msg("the peer is down and no proof that its writes are over came: its requests' blocks stay quarantined")
	}
}

// closed reports whether c is closed (it is never sent on).
// outcomeErr is a failed request's error in the report. One cancelled
// once its peer was down says so: the role cancels its live requests
// then (outcome), and the engine's own word for that is only "actors:
// cancelled", which named no cause; one whose peer's goodbye named an
// error says so (peerExit). It wraps the engine's error (for
// errors.Is: kvxfer.ErrPromptMismatch).
func outcomeErr(id string, res kvxfer.Outcome, n *role, peer string) error {
	verb := "%w"
	if res.Err == nil {
		verb = "%v" // "<nil>", as ever
	}
	if res.Status == kvxfer.StatusCancelled && closed(n.down) {
		return fmt.Errorf("%s: %s after the %s peer %s: "+verb, id, res.Status, peer, n.peerExit("went down"), res.Err)
	}
	return fmt.Errorf("%s: %s: "+verb, id, res.Status, res.Err)
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func finish(n *role, rep Report, t0 time.Time, cpu0 time.Duration, out io.Writer) (Report, error) {
	rep.Seconds = time.Since(t0).Seconds()
	if cpu := processCPU(); cpu0 > 0 && cpu > cpu0 {
		rep.CPUSeconds = (cpu - cpu0).Seconds()
	}
	if err := hoptrace.Dump(); err != nil {
		fmt.Fprintln(os.Stderr, "hoptrace:", err)
	}
	if closed(n.down) {
		n.awaitProof()
	}
	// A failed request's handle fires at its logical outcome; its pages
	// are released when its writers are quiescent. Close waits for every
	// session to drain, so what is still used after it is a leak. A run
	// that ends on a mistake it found says it in its goodbye, for the
	// peer to name it and leave at once instead of waiting for this
	// process to come back.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cause error
	switch {
	case rep.SettingsMismatch != "":
		cause = errors.New(rep.SettingsMismatch)
	case n.mistake != nil:
		cause = n.mistake
	}
	err := n.CloseBecause(ctx, cause)
	if merr := n.mem.close(); merr != nil {
		err = errors.Join(err, merr)
	}
	if onlyNotWithdrawn(err) {
		// etcd went at the end: the record expires with its lease, and
		// the run's own outcome stands.
		n.log.Warn().Err(err).Msg("closing: the etcd record was not withdrawn; it expires with its lease")
		err = nil
	}
	// The node tells the engine before it calls OnPeerDown, so requests
	// may all have failed before down was closed; Close has waited for the
	// link's goroutines (and so for the callback).
	select {
	case <-n.down:
		rep.PeerDown = true
	default:
	}
	rep.PeerClosed = n.closedBye.Load()
	if r := n.byeReason.Load(); r != nil {
		rep.PeerReason = *r
	}
	rep.LeakedBlocks = n.eng.Pools().Used()
	rep.QuarantinedBlocks = n.eng.Pools().Quarantined()
	rep.EngineStats = engineStats(n.eng.Stats())
	if out != nil {
		b, _ := json.Marshal(rep)
		fmt.Fprintln(out, string(b))
	}
	return rep, err
}
