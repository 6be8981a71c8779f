package kvxfer

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("kvxfer: bad config")

// Defaults.
const (
	DefaultWorkers         = 4
	DefaultPoolBytes       = 1 << 30
	DefaultTransferTimeout = 30 * time.Second
	DefaultDrainGrace      = 5 * time.Second
	DefaultBackend         = "loopback"
	DefaultInstance        = "kvxfer"
)

// MaxWorkers bounds Config.Workers (and KVXFER_WORKERS). Each worker is an
// actor with its own control connections and data-plane endpoints to every
// peer it sends to; a count past this is a mistake (a value meant for
// another setting), and Start would spend the process's memory on it
// before any request came.
const MaxWorkers = 1024

// Config configures one engine rank. Zero values take the defaults above.
type Config struct {
	// Instance names the engine instance (all ranks of one serving
	// instance share it).
	Instance string
	// Parallel is the instance's TP × PP (and, when its pipeline stages
	// split the layers otherwise than kvxfer's default, its Stages: see
	// kvcache.Parallel); Rank is this engine's rank in it.
	Parallel kvcache.Parallel
	Rank     kvcache.Rank
	// Model is a preset name (kvcache.Presets); Layout overrides it. A
	// Layout's DTypeBytes must be an element size: 1, 2, 4 or 8.
	Model  string
	Layout *kvcache.Layout
	// TokensPerBlock overrides the layout's block size when > 0.
	TokensPerBlock int
	// PoolBytes is the size of the engine's block pool region. It may
	// hold at most messages.MaxBlocks blocks of each layer group (what a
	// peer takes in a Hello).
	PoolBytes uint64
	// Region, when set, is the pool memory (for example a shared-memory
	// region the shm backend can write into, or memory a serving framework
	// allocated); PoolBytes is then its length.
	Region *kvcache.Region
	// Revoker, when set, is Region's (rdma/shm's RevocableRegion.Revoker):
	// destination blocks of a request that failed without proof that its
	// writers are done are revoked — the view of them moves onto spare
	// memory and they are reusable at once, while the memory a stale
	// writer can still reach stays quarantined until the proof — instead
	// of being quarantined themselves (docs/membership.md §4). It needs
	// Region and a backend whose writers address the region's file (shm).
	Revoker kvcache.Revoker
	// SendOnly marks an engine that only sends (a prefill rank): its pool
	// is registered as a source only (rdma.RegisterSource), so that where
	// the backend can (ucx, loopback) the pool has no key to give, no peer
	// can write into its memory, and its Close owes no proof about its
	// peers' writes — a UCX context engine closes cleanly after a
	// generation peer crashed. Its Hello says messages.FeatureSendOnly
	// (with a placeholder key, which earlier versions take). Receive is
	// refused (ErrSendOnly), as is a Revoker (it revokes blocks peers
	// write into).
	SendOnly bool
	// Workers is the number of sender workers (env KVXFER_WORKERS). The
	// zero value means DefaultWorkers (4); a negative value is an error, and
	// so is KVXFER_WORKERS=0 (an explicit setting below 1), and so is one
	// above MaxWorkers.
	Workers int
	// Backend names the data plane ("loopback"); Agent, when set, is used
	// instead.
	Backend string
	Agent   rdma.Agent
	// Link is the control plane; nil uses the process-wide in-memory link.
	Link control.Link
	// TransferTimeout bounds a request (overridable per request).
	TransferTimeout time.Duration
	// MaxQuarantinedBytes bounds the destination bytes held in quarantine
	// (blocks of requests that failed while a writer had given no proof
	// that its writes are over, DESIGN.md §3): past it new requests wait
	// for destination blocks (until their deadline); quarantined blocks
	// are never freed early. 0: half of PoolBytes (with Memory, half of
	// the bytes its descriptors' blocks hold, which are what a block
	// weighs here too); more than PoolBytes is refused.
	MaxQuarantinedBytes uint64
	// MaxOrphanRequests bounds, per generation instance, the requests
	// whose RequestData reached this context rank before its Send (their
	// sessions wait for Send until TransferTimeout): past it a new
	// request's RequestData is refused at once with FAILED naming the
	// limit, so a peer cannot make this rank hold sessions for requests
	// it never sends. Their RequestData may together name at most
	// MaxOrphanRequests × 16384 destination blocks (actors/core's
	// OrphanBlocksEach), so that the count bounds memory too. 0: 4096;
	// < 0: no bound.
	MaxOrphanRequests int
	// WriterLease, when > 0, fences this engine as a writer: it posts for
	// a generation peer only while it holds a lease on it, renewed for
	// WriterLease by each frame of the peer and by Engine.PeerAlive (wire
	// the control plane's heartbeats to it); a lapsed lease fails the
	// requests to that peer and closes its endpoints. Liveness only: the
	// receiver still quarantines until a proof. 0: off; < 0 is refused.
	WriterLease time.Duration
	// DrainGrace is how long in-doubt writes (a request past its deadline,
	// a worker that crashed) may take to complete before their endpoint is
	// closed to retire them. The endpoint is the worker's to that peer
	// agent, shared by every request the worker sends there: the close
	// also fails the other requests' writes still on it. A backend slower
	// than requests' deadlines wants a longer grace.
	DrainGrace time.Duration
	// Clock is the engine's time: request deadlines and every timer of its
	// actors (default: actors.SystemClock; tests pass an
	// actors.FakeClock to drive deadlines without waiting).
	Clock actors.Clock
	// Logger receives the engine's logs (default: disabled).
	Logger *zerolog.Logger
	// Recorder, when set, receives every message each session steps on.
	Recorder actors.Recorder
	// TracePath, when set, records a replayable trace of every session
	// (package trace, `kvxfer replay`) to this file, which Start creates
	// and Engine.Close flushes and closes. Each engine needs its own file:
	// a path another engine writes (of this process or another) is refused.
	// With Recorder also set, both receive every message. The file is
	// bounded (trace.DefaultMaxBytes, or TraceMaxBytes); when it reaches
	// its bound (without TraceKeep) or a write fails, the engine logs a
	// warning naming the file at once, and later records are dropped
	// (Close reports a write error).
	TracePath string
	// TraceMaxBytes bounds TracePath's file (0: trace.DefaultMaxBytes).
	TraceMaxBytes int64
	// TraceKeep, when > 0, rotates TracePath's file at its bound instead
	// of dropping later records (trace.WithRotate): the full file becomes
	// TracePath.1 (the older ones .2, …), at most TraceKeep of them are
	// kept, and a new TracePath starts, each file replayable on its own.
	// 0: no rotation.
	TraceKeep int
	// MetricsAddr, when set ("127.0.0.1:9464"; port 0 picks a free one),
	// serves the engine's Prometheus metrics (package metrics documents
	// each) over HTTP on /metrics at that address until Close;
	// Engine.MetricsAddr reports the bound address. Empty: no metrics are
	// kept and no server runs.
	MetricsAddr string
	// Memory, when set, is this rank's KV cache as the serving framework
	// lays it out, one descriptor per layer group (kvcache.NHDMemory,
	// HNDMemory, SplitKVMemory, MLAMemory, PoolMemory, or any strided
	// KVMemory), its offsets relative to Region, which must be set and
	// whose length each descriptor's RegionLen must equal. Each descriptor
	// holds exactly this rank's layers of its group and heads, in the
	// layout's head width, element size and tokens per block; a nil entry
	// is allowed only for a group this rank holds no layer of. Block ids are
	// the descriptor's, [0, Blocks): kvxfer's pools then only hand out and
	// track those ids (Engine.Block is nil for such a group; use
	// Engine.BlockTensor). On a generation rank the descriptors travel in
	// the Hello, and context ranks plan into them; on a context rank
	// requests are planned from them. Start copies them: the caller may
	// reuse its descriptors once Start returns. See Memory's doc in kvcache.
	Memory []*kvcache.KVMemory

	workersSet bool
}

// WithEnv applies KVXFER_* environment variables that are set, returning
// an error naming the variable and value when one is invalid (a
// KVXFER_WORKERS that is not an integer in 1..MaxWorkers). An empty
// variable counts as unset, as on the CLI.
func (c Config) WithEnv() (Config, error) {
	if v := os.Getenv("KVXFER_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("%w: KVXFER_WORKERS = %s: not an integer", ErrConfig, quote.String(v))
		}
		if n < 1 || n > MaxWorkers {
			// Start would refuse it as "Workers = n", not saying where
			// it came from.
			return c, fmt.Errorf("%w: KVXFER_WORKERS = %s: want 1..%d", ErrConfig, quote.String(v), MaxWorkers)
		}
		c.Workers = n
		c.workersSet = true
	}
	if v := os.Getenv("KVXFER_BACKEND"); v != "" {
		c.Backend = v
	}
	return c, nil
}

// resolved is a validated config with every default applied.
type resolved struct {
	Config
	layout kvcache.Layout
	shape  kvcache.Shape
	// blocks is the number of blocks of each layer group's pool: PoolBytes
	// holds that many block sets (one block of every group each).
	blocks int
}

// checkInstance refuses an instance name its peers would refuse in every
// frame (longer than messages.MaxInstanceLen), one no frame can carry (not
// valid UTF-8: the codec refuses to encode it), or one no C string or log
// line can carry whole (a control character: NUL, a newline).
func checkInstance(name string) error {
	if why := instanceNameProblem(name); why != "" {
		return fmt.Errorf("%w: Instance %s", ErrConfig, why)
	}
	return nil
}

// instanceNameProblem says what is wrong with an instance name that no
// engine can have (checkInstance), quoting it (its first quote.Max bytes
// when longer), or "" when nothing is.
func instanceNameProblem(name string) string {
	if len(name) > messages.MaxInstanceLen {
		return fmt.Sprintf("%q… is %d bytes, at most %d", messages.TruncateText(name, quote.Max), len(name), messages.MaxInstanceLen)
	}
	if !utf8.ValidString(name) {
		return fmt.Sprintf("%q is not valid UTF-8", name)
	}
	for _, c := range name {
		if c < 0x20 || c == 0x7f {
			return fmt.Sprintf("%s holds control character %U", quote.String(name), c)
		}
	}
	return ""
}

func (c Config) resolve() (resolved, error) {
	r := resolved{Config: c}
	if c.Memory != nil {
		r.Memory = cloneMemory(c.Memory)
	}
	if r.Instance == "" {
		r.Instance = DefaultInstance
	}
	if err := checkInstance(r.Instance); err != nil {
		return r, err
	}
	if r.Parallel.TP == 0 && r.Parallel.PP == 0 {
		r.Parallel = kvcache.Parallel{TP: 1, PP: 1}
	}
	if r.Workers == 0 && !r.workersSet {
		r.Workers = DefaultWorkers
	}
	if r.Workers < 1 {
		return r, fmt.Errorf("%w: Workers = %d, must be ≥ 1", ErrConfig, r.Workers)
	}
	if r.Workers > MaxWorkers {
		return r, fmt.Errorf("%w: Workers = %d, at most %d (MaxWorkers)", ErrConfig, r.Workers, MaxWorkers)
	}
	if r.Revoker != nil && r.Region == nil {
		return r, fmt.Errorf("%w: Revoker is set without Region: it revokes the region's blocks", ErrConfig)
	}
	if r.Revoker != nil && r.SendOnly {
		return r, fmt.Errorf("%w: Revoker is set with SendOnly: it revokes blocks that peers write into, and no peer writes into a send-only engine", ErrConfig)
	}
	if r.Revoker != nil && r.Memory != nil {
		return r, fmt.Errorf("%w: Revoker is set with Memory: a block of framework memory is no one range of the region to revoke", ErrConfig)
	}
	if r.Region != nil {
		if r.PoolBytes != 0 && r.PoolBytes != r.Region.Len {
			return r, fmt.Errorf("%w: PoolBytes = %d but Region is %d bytes", ErrConfig, r.PoolBytes, r.Region.Len)
		}
		r.PoolBytes = r.Region.Len
	}
	if r.PoolBytes == 0 {
		r.PoolBytes = DefaultPoolBytes
	}
	if r.MaxQuarantinedBytes > r.PoolBytes {
		// More than the pool can hold: a unit slip, most likely (a
		// count of blocks or MiB meant), and no bound at all as given.
		return r, fmt.Errorf("%w: MaxQuarantinedBytes = %d is more than PoolBytes = %d: at most the whole pool can be quarantined (0: half of it)",
			ErrConfig, r.MaxQuarantinedBytes, r.PoolBytes)
	}
	if r.TransferTimeout == 0 {
		r.TransferTimeout = DefaultTransferTimeout
	}
	if r.TransferTimeout < 0 {
		return r, fmt.Errorf("%w: TransferTimeout = %v, must be > 0", ErrConfig, r.TransferTimeout)
	}
	if r.DrainGrace == 0 {
		r.DrainGrace = DefaultDrainGrace
	}
	if r.DrainGrace < 0 {
		return r, fmt.Errorf("%w: DrainGrace = %v, must be > 0", ErrConfig, r.DrainGrace)
	}
	if r.WriterLease < 0 {
		return r, fmt.Errorf("%w: WriterLease = %v, must be ≥ 0 (0: off)", ErrConfig, r.WriterLease)
	}
	if r.Backend == "" {
		r.Backend = DefaultBackend
	}
	if r.Clock == nil {
		r.Clock = actors.SystemClock{}
	}
	if r.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(r.MetricsAddr); err != nil {
			return r, fmt.Errorf("%w: MetricsAddr = %s: %w", ErrConfig, quote.String(r.MetricsAddr), quote.In(err, r.MetricsAddr))
		}
	}
	if r.Agent == nil && r.Backend != "loopback" {
		return r, fmt.Errorf("%w: Backend = %s: unknown in-process backend (known: loopback; pass Agent for others)", ErrConfig, quote.String(r.Backend))
	}
	switch {
	case r.Layout != nil:
		r.layout = r.Layout.Clone()
	case r.Model != "":
		l, err := kvcache.Preset(r.Model)
		if err != nil {
			return r, fmt.Errorf("%w: Model: %w", ErrConfig, err)
		}
		r.layout = l
	default:
		return r, fmt.Errorf("%w: neither Model nor Layout set", ErrConfig)
	}
	if r.TokensPerBlock < 0 {
		return r, fmt.Errorf("%w: TokensPerBlock = %d, must be > 0 (0: the layout's)", ErrConfig, r.TokensPerBlock)
	}
	if r.TokensPerBlock > 0 {
		r.layout = r.layout.WithTokensPerBlock(r.TokensPerBlock)
	}
	if err := r.layout.Validate(); err != nil {
		return r, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := checkDTypeBytes(r.layout); err != nil {
		return r, err
	}
	if err := r.Parallel.Validate(r.layout); err != nil {
		return r, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	// Stages that spell out the default split are the default: peers
	// compare parallelisms, and a Hello's must equal its RequestData's.
	r.Parallel = r.Parallel.Normal(r.layout.Layers)
	if !r.Parallel.Contains(r.Rank) {
		return r, fmt.Errorf("%w: Rank %v outside %v", ErrConfig, r.Rank, r.Parallel)
	}
	shape, err := r.layout.Shape(r.Parallel, r.Rank)
	if err != nil {
		return r, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	r.shape = shape
	if r.Memory != nil {
		return r, r.checkMemory()
	}
	// A group this rank holds no layer of (a pipeline stage without it)
	// gets a placeholder pool of one 1-byte block, after the others
	// (Start): its byte comes out of PoolBytes first.
	var perSet, empty uint64
	for g := range r.layout.Groups {
		bb := shape.BlockBytes(r.layout, g)
		perSet += bb
		if bb == 0 {
			empty++
		}
	}
	if perSet == 0 || r.PoolBytes < empty || (r.PoolBytes-empty)/perSet < 1 {
		return r, fmt.Errorf("%w: PoolBytes = %d holds no block (one block per group is %d bytes)", ErrConfig, r.PoolBytes, perSet)
	}
	// A host pool (no Region given) past what Start's NewHostRegion maps
	// is refused as that would refuse it (ErrBadRegion), before its block
	// count is weighed: the length is the mistake, and callers (the demo)
	// name their pool's setting on ErrBadRegion.
	if r.Region == nil && r.PoolBytes > kvcache.MaxHostRegion {
		return r, fmt.Errorf("%w: %w: region length %d: more than %d bytes", ErrConfig, kvcache.ErrBadRegion, r.PoolBytes, uint64(kvcache.MaxHostRegion))
	}
	// Each group's pool goes in the Hello, whose peers refuse a pool of
	// more than messages.MaxBlocks blocks (and so does its encoder: a
	// wire link would fail at Listen with no word of PoolBytes).
	if n := (r.PoolBytes - empty) / perSet; n > messages.MaxBlocks {
		return r, &TooManyBlocksError{PoolBytes: r.PoolBytes, Blocks: n, SetBytes: perSet}
	}
	r.blocks = int((r.PoolBytes - empty) / perSet)
	return r, nil
}

// dtypeBytesAccepted are the element sizes a layout's DTypeBytes may
// take: fp8/int8, fp16/bf16, fp32 and fp64. Any other (3, 6, 16) is no
// KV dtype, typically a byte count mistaken for it (a head's bytes, a
// tensor's), and its blocks would be laid out at a size no framework's
// tensors have.
var dtypeBytesAccepted = []int{1, 2, 4, 8}

// checkDTypeBytes refuses a layout whose DTypeBytes is not one of
// dtypeBytesAccepted, naming the value and the accepted set.
func checkDTypeBytes(l kvcache.Layout) error {
	if slices.Contains(dtypeBytesAccepted, l.DTypeBytes) {
		return nil
	}
	return fmt.Errorf("%w: layout %s: DTypeBytes = %d is no element size: want one of %v (fp8/int8 1, fp16/bf16 2, fp32 4, fp64 8)",
		ErrConfig, quote.String(l.Name), l.DTypeBytes, dtypeBytesAccepted)
}
