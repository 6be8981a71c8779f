package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// ErrConfig is wrapped by every configuration error; the message names the
// field (by its JSON name) and the value that was wrong.
var ErrConfig = errors.New("node: bad config")

// MinHeartbeatInterval and MinHeartbeatMisses are the least
// Config.HeartbeatInterval and Config.HeartbeatMisses accepted. A peer is
// declared down after Misses intervals without a beat; the link's
// heartbeat and listener goroutines wait at least 1 ms per turn, and on a
// loaded two-core machine a live peer's beats at a 2 ms interval (3
// misses) already came late enough to be declared down, while 10 ms did
// not. With 1 miss, a live peer is declared down whenever its next beat
// comes a moment after one interval, which is about every other beat.
const (
	MinHeartbeatInterval = 10 * time.Millisecond
	MinHeartbeatMisses   = 2
)

// BackendAuto picks the data plane: ucx when this binary has it (UCX then
// chooses shared memory, RDMA or TCP), else shm.
const BackendAuto = "auto"

// Config is everything Open needs. It is a plain struct so that it can come
// from JSON (ParseConfig; field names in snake_case) as well as from Go.
// Zero values take the defaults documented on each field.
type Config struct {
	// Instance names this serving instance (every rank of it shares the
	// name). Default "kvxfer".
	Instance string `json:"instance"`
	// Parallel is the instance's tensor × pipeline parallelism (default
	// 1×1) and Rank this process's rank in it. Peers see this node as
	// rank Parallel.Index(Rank) of Instance.
	Parallel Parallel `json:"parallel"`
	Rank     Rank     `json:"rank"`

	// Model is a layout preset (kvcache.Presets: "Llama-3.1-8B", …);
	// Layout, a Go-only field, overrides it. TokensPerBlock overrides the
	// layout's block size when > 0.
	Model          string          `json:"model"`
	Layout         *kvcache.Layout `json:"-"`
	TokensPerBlock int             `json:"tokens_per_block"`
	// PoolBytes sizes the block pool, allocated from the backend so that
	// peers can write into it (default kvxfer.DefaultPoolBytes, 1 GiB).
	PoolBytes uint64 `json:"pool_bytes"`
	// Memory, when set, lays the framework's KV tensors out inside the pool
	// (Memory's doc); block ids are then the framework's.
	Memory *Memory `json:"memory"`
	// CallerMemory, a Go-only field, is memory the framework already
	// allocated: the node then has no pool of its own, and peers write
	// into the framework's tensors (CallerMemory's doc: which backends
	// can, and the close contract). Refused with Memory and with a
	// pool_bytes other than its region's length. Capi's kvxfer_node_open
	// fills it from "memory" given with tensor addresses.
	CallerMemory *CallerMemory `json:"-"`
	// SendOnly marks a rank that only sends (a prefill rank): its pool is
	// private memory rather than memory peers can write (no /dev/shm file
	// with shm; device memory still on cudaipc, which moves nothing else),
	// and Node.Receive refuses at once.
	SendOnly bool `json:"send_only"`
	// RevokeSpareBytes is the spare reserve of an shm pool that revokes
	// (docs/membership.md §4): destination blocks of a request that failed
	// while a writer gave no proof that its writes are over are moved onto
	// spare memory and reused at once, their old memory held here until
	// the proof, instead of being quarantined. 0: an eighth of pool_bytes;
	// < 0: off (plain quarantine). Only for the shm backend, a pool without
	// memory, and a pool_bytes that is a multiple of the page size; the
	// unit of revocation is the layer groups' common block size (else the
	// page), and the reserve is rounded down to it.
	RevokeSpareBytes int64 `json:"revoke_spare_bytes"`
	// Workers is the number of sender workers (default 4).
	Workers int `json:"workers"`

	// Backend is the data plane: "auto" (the default), "ucx", "shm",
	// "cudaipc" (GPU to GPU between processes of one host, through CUDA
	// IPC handles; never chosen by "auto"), or "loopback" (peers in this
	// same process only).
	//
	// On cudaipc the node's pool is pool_bytes of device memory on GPU
	// Device, which peers of this host write with their GPUs' copy
	// engines; Open fails with an error wrapping cuda.ErrNoDevice on a
	// host without a GPU or CUDA driver. CallerMemory must then be device
	// memory of that GPU; memory and revoke_spare_bytes > 0 are refused
	// (the CPU cannot address the pool, and CUDA IPC mappings cannot be
	// withdrawn); a peer of another host fails its requests with
	// ErrOtherHost; and no writer's exit is taken as proof that its
	// copies are over (exitProves).
	Backend string `json:"backend"`
	// Device is the CUDA ordinal of this node's GPU on backend cudaipc
	// (default 0). Refused when negative, past the devices the driver
	// reports (at Open), or nonzero with another backend.
	Device int `json:"device"`

	// Bind is this node's control endpoint ("tcp://10.0.0.1:5600",
	// "ipc:///run/kvxfer/gen0.sock"; tcp port 0 picks a free port, see
	// Node.Endpoint). Required unless Backend is "loopback", where an empty
	// Bind uses the in-process control link.
	Bind string `json:"bind"`
	// Peers are the other ranks this node talks to (static membership).
	// With etcd discovery a peer may be given without endpoint and keys
	// (instance, parallel and rank only): it is a rank WaitPeers waits
	// for, found through etcd; a public key given pins it (a record in
	// etcd with another key is refused and logged).
	Peers []Peer `json:"peers"`

	// Discovery is the membership registry: "static" (the default: Peers
	// as given) or "etcd://HOST:PORT[,HOST:PORT]" ("etcds://…" over TLS,
	// below): this node registers its record (control endpoint, CURVE
	// public key, backend, agent address, layout hash, parallelism, a new
	// incarnation) under a lease and learns its peers from the cluster's
	// prefix (docs/membership.md).
	Discovery string `json:"discovery"`
	// Cluster names the etcd cluster prefix (/kvxfer/<cluster>/…);
	// required with etcd discovery, refused without it.
	Cluster string `json:"cluster"`
	// DiscoveryTTL is the etcd lease TTL (default "5s"; whole seconds,
	// rounded up): how long a rank that stopped renewing (killed, paused,
	// cut off from etcd) stays a member. Etcd discovery only.
	DiscoveryTTL Duration `json:"discovery_ttl"`
	// DiscoveryCA, DiscoveryCert and DiscoveryKey are PEM files for TLS
	// to etcd (discovery = "etcds://HOST:PORT"): the CA that signed
	// etcd's server certificate (default: the system's roots), and this
	// rank's client certificate and its key for an etcd that asks for
	// one (--client-cert-auth; both or neither). Refused with a
	// plaintext etcd:// URL.
	DiscoveryCA   string `json:"discovery_ca"`
	DiscoveryCert string `json:"discovery_cert"`
	DiscoveryKey  string `json:"discovery_key"`
	// DiscoveryUser logs in to etcd's user auth with the password in
	// DiscoveryPasswordFile (its first line): a file, so that the
	// password is in no command line or configuration. The user needs
	// read and write on /kvxfer/<cluster>/. Etcd discovery only.
	DiscoveryUser         string `json:"discovery_user"`
	DiscoveryPasswordFile string `json:"discovery_password_file"`
	// OnMembership, when set, is called with every registry event (Up,
	// Down, Rejected, Lost) after the node acted on it, from the node's
	// membership goroutine. It must not block. Etcd discovery only.
	OnMembership func(discovery.Event) `json:"-"`

	// Insecure turns CURVE off: no authentication, no encryption. Local
	// demos only. Keys given with it (KeyFile, SecretKey, a peer's key,
	// Identities) are refused: they would be ignored.
	Insecure bool `json:"insecure"`
	// KeyFile is this node's CURVE secret key file (`kvxfer keygen`);
	// SecretKey the same key inline (Z85). Exactly one unless Insecure.
	KeyFile   string `json:"key_file"`
	SecretKey string `json:"secret_key"`
	// Identities bind more CURVE client keys to the instance (and ranks)
	// they may speak for; each peer's key is bound to that peer already.
	Identities []Identity `json:"identities"`

	// HeartbeatInterval (default "1s") and HeartbeatMisses (default 3):
	// a peer silent for Misses intervals is down, and every request with
	// it fails and drains (Engine.PeerDown).
	// The interval is at least MinHeartbeatInterval, Misses at least
	// MinHeartbeatMisses: below, a live peer is declared down.
	HeartbeatInterval Duration `json:"heartbeat_interval"`
	HeartbeatMisses   int      `json:"heartbeat_misses"`
	// TransferTimeout bounds a request (default 30s); DrainGrace is how
	// long in-doubt writes may take before their endpoint is closed
	// (default 5s).
	TransferTimeout Duration `json:"transfer_timeout"`
	DrainGrace      Duration `json:"drain_grace"`
	// WriterLease (kvxfer.Config.WriterLease): when > 0, this node posts
	// writes for a peer only while the peer's frames or heartbeats
	// renewed its lease within WriterLease (the link reports each peer
	// alive at most once per heartbeat interval: give several intervals;
	// less than two is refused, as it would lapse between a live peer's
	// heartbeats). Liveness, not proof (docs/membership.md §3). Default
	// off.
	WriterLease Duration `json:"writer_lease"`

	// MetricsAddr serves Prometheus metrics ("127.0.0.1:9464"); TracePath
	// records a replayable trace. Both optional.
	MetricsAddr string `json:"metrics_addr"`
	TracePath   string `json:"trace_path"`
	// TraceMaxBytes and TraceKeep bound and rotate TracePath's file
	// (kvxfer.Config.TraceMaxBytes, TraceKeep: 0 bytes is the default
	// bound, 1 GiB; keep 0 stops recording at the bound, N > 0 rotates
	// it, keeping N earlier files PATH.1 ... PATH.N).
	TraceMaxBytes int64 `json:"trace_max_bytes"`
	TraceKeep     int   `json:"trace_keep"`

	// Logger receives the node's and the engine's logs (default: none).
	Logger *zerolog.Logger `json:"-"`
	// OnPeerDown, when set, is called after the engine learned that a peer
	// fell silent, or said goodbye as it closed, or that its process
	// exited (a pidfd, on one host: docs/membership.md §4); instance and
	// rank index as in Peer. It may be called more than once for one
	// death, and must not block.
	OnPeerDown func(instance string, rank int) `json:"-"`
	// OnPeerGoodbye, when set, is called when a peer said goodbye as its
	// node closed, before OnPeerDown for it: reason is why it closed, as
	// its goodbye said (it exits on an error it found, Node.CloseBecause,
	// and is not coming back: its owner may stop waiting for it), "" when
	// it gave none (a graceful stop, a restart, an older peer). Neither
	// is called for the goodbye of an incarnation whose successor said
	// Hello first (a restart under etcd): the peer is up. It must not
	// block.
	OnPeerGoodbye func(instance string, rank int, reason string) `json:"-"`
	// BeforeMemoryGoes, when set, is called once by Close after the engine
	// closed — every outcome decided; engineErr is its Close's error, nil
	// when every session drained — and before the pool memory can go
	// (Engine.Block returns nil from then on, the memory is unmapped):
	// the embedder's callbacks that read blocks (a READY event's) end in
	// it. ctx is Close's. Close waits for it: it must return.
	BeforeMemoryGoes func(ctx context.Context, engineErr error) `json:"-"`
}

// Parallel is an instance's tensor × pipeline parallelism.
type Parallel struct {
	TP int `json:"tp"`
	PP int `json:"pp"`
	// Stages, when set, is how many layers each pipeline stage holds,
	// comma-separated ("7,8,8,7", vLLM's VLLM_PP_LAYER_PARTITION format),
	// for an instance whose stages split the layers otherwise than
	// kvxfer's default (kvcache.Parallel.Stages). The default split
	// spelled out is the same parallelism as none.
	Stages string `json:"stages,omitempty"`
}

// Rank is one rank's tensor position and pipeline stage.
type Rank struct {
	TP int `json:"tp"`
	PP int `json:"pp"`
}

// Peer is one rank of another instance, reached at Endpoint.
type Peer struct {
	// Instance is the peer's instance name.
	Instance string `json:"instance"`
	// Parallel is the peer instance's parallelism (default 1×1) and Rank
	// the peer's rank in it: the peer is rank Parallel.Index(Rank), the
	// index kvxfer uses when a ReceiveRequest names the peer's instance
	// and parallelism.
	Parallel Parallel `json:"parallel"`
	Rank     Rank     `json:"rank"`
	// Endpoint is the peer's control endpoint (its Bind).
	Endpoint string `json:"endpoint"`
	// PublicKeyFile is the peer's CURVE public key file; PublicKey the
	// same key inline (Z85). Exactly one unless Insecure.
	PublicKeyFile string `json:"public_key_file"`
	PublicKey     string `json:"public_key"`
}

// Identity binds a CURVE client key to the instance (and rank indexes) it
// may speak for.
type Identity struct {
	PublicKey     string  `json:"public_key"`
	PublicKeyFile string  `json:"public_key_file"`
	Instance      string  `json:"instance"`
	Ranks         []int32 `json:"ranks"`
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("500ms", "30s").
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string; a bare number is refused (its
// unit would be a guess).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return &durationError{fmt.Sprintf("%s is not a duration string (want \"500ms\", \"30s\")", quote.JSONValue(b))}
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return &durationError{fmt.Sprintf("%s is not a duration (want \"500ms\", \"30s\")", quote.String(s))}
	}
	*d = Duration(v)
	return nil
}

// durationError is a bad Duration; ParseConfig finds its field.
type durationError struct{ msg string }

func (e *durationError) Error() string { return e.msg }

// durationFields are Config's Duration fields by JSON name.
var durationFields = []string{"heartbeat_interval", "transfer_timeout", "drain_grace", "discovery_ttl"}

// badDuration names the first duration field of the JSON object b that
// does not parse.
func badDuration(b []byte) error {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	for _, f := range durationFields {
		if raw, ok := m[f]; ok {
			var d Duration
			if err := d.UnmarshalJSON(raw); err != nil {
				return fmt.Errorf("%w: %s = %s: %v", ErrConfig, f, quote.JSONValue(raw), err)
			}
		}
	}
	return nil
}

// String is p as the config's errors name it: {TP:2 PP:1}, with
// Stages when set.
func (p Parallel) String() string {
	if p.Stages != "" {
		return fmt.Sprintf("{TP:%d PP:%d Stages:%s}", p.TP, p.PP, p.Stages)
	}
	return fmt.Sprintf("{TP:%d PP:%d}", p.TP, p.PP)
}

// kv converts to kvcache's types.
func (p Parallel) kv() kvcache.Parallel {
	return kvcache.Parallel{TP: p.TP, PP: p.PP, Stages: p.Stages}
}
func (r Rank) kv() kvcache.Rank { return kvcache.Rank{TP: r.TP, PP: r.PP} }

// orOne is p with a zero value read as 1×1.
func (p Parallel) orOne() Parallel {
	if p.TP == 0 && p.PP == 0 && p.Stages == "" {
		return Parallel{TP: 1, PP: 1}
	}
	return p
}

// ParseConfig decodes a JSON config (unknown fields are refused) and
// validates it. Every error wraps ErrConfig and names the field and value.
func ParseConfig(b []byte) (Config, error) {
	c, err := DecodeConfig(b)
	if err != nil {
		return c, err
	}
	return c, c.Validate()
}

// DecodeConfig is ParseConfig without Validate: for a caller that sets
// Go-only fields (Layout, CallerMemory) before it validates.
func DecodeConfig(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var te *json.UnmarshalTypeError
		var de *durationError
		if errors.As(err, &de) {
			if named := badDuration(b); named != nil {
				return c, named
			}
		}
		if errors.As(err, &te) {
			return c, fmt.Errorf("%w: %s: a JSON %s, want %s", ErrConfig, te.Field, te.Value, te.Type)
		}
		return c, fmt.Errorf("%w: %v", ErrConfig, quote.JSON(err))
	}
	if dec.More() {
		return c, fmt.Errorf("%w: trailing data after the JSON object", ErrConfig)
	}
	return c, nil
}

// instanceChars says what is wrong with the characters of an instance
// name, or "": a rank is named instance/rank in logs, metrics and etcd
// keys, so a '/' (or a space, or a control character) would make two
// names read alike.
func instanceChars(s string) string {
	for _, r := range s {
		switch {
		case r == '/':
			return "contains '/', which separates an instance from its rank (instance/rank)"
		case unicode.IsSpace(r) || !unicode.IsPrint(r):
			return fmt.Sprintf("contains %q: want no spaces or control characters", r)
		}
	}
	return ""
}

// checkNamedInstance checks an instance name another entry gives (a
// peer's, an identity's), as field: 1..MaxInstanceLen bytes of the
// characters instanceChars takes.
func checkNamedInstance(field, name string) error {
	if name == "" || len(name) > messages.MaxInstanceLen {
		return bad(field, name, "want 1..%d bytes", messages.MaxInstanceLen)
	}
	if why := instanceChars(name); why != "" {
		return bad(field, name, "%s", why)
	}
	return nil
}

// bad is a configuration error naming field and value (show), and a
// string value clipped in the reason too (an endpoint parser's error
// quoting it whole).
func bad(field string, value any, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	if s, ok := value.(string); ok {
		reason = quote.InText(reason, s)
	}
	return fmt.Errorf("%w: %s = %s: %s", ErrConfig, field, show(value), reason)
}

// show is a field's value as bad names it: a string quoted, its first
// quote.Max bytes and its length when longer (the C ABI's message buffer
// holds 1023 bytes, and the reason follows the value).
func show(v any) string {
	switch v := v.(type) {
	case string:
		return quote.String(v)
	case Duration:
		return time.Duration(v).String()
	default:
		return fmt.Sprintf("%+v", v)
	}
}

// heartbeatParams is the heartbeat interval and misses in effect, with
// their defaults filled in.
func (c Config) heartbeatParams() (time.Duration, time.Duration) {
	iv, m := time.Duration(c.HeartbeatInterval), c.HeartbeatMisses
	if iv <= 0 {
		iv = zmq.DefaultHeartbeatInterval
	}
	if m <= 0 {
		m = zmq.DefaultHeartbeatMisses
	}
	return iv, time.Duration(m)
}

// backend is the data plane the config asks for, with auto resolved.
func (c Config) backend() string {
	switch c.Backend {
	case "", BackendAuto:
		if ucx.Available {
			return ucx.Backend
		}
		return shm.Backend
	}
	return c.Backend
}

// kvLayout is the layout c names (its Layout, else its Model's preset),
// with its TokensPerBlock when set.
func (c Config) kvLayout() (kvcache.Layout, error) {
	var layout kvcache.Layout
	if c.Layout != nil {
		layout = c.Layout.Clone()
	} else {
		var err error
		if layout, err = kvcache.Preset(c.Model); err != nil {
			return layout, err
		}
	}
	if c.TokensPerBlock > 0 {
		layout = layout.WithTokensPerBlock(c.TokensPerBlock)
	}
	return layout, nil
}

// revokeBlock is the unit of revocation of c's shm pool: the greatest
// common divisor of its layer groups' block sizes on this rank, so that
// every block is whole units and the pool's indirection table is small
// (one entry per 2 MiB block of Llama-3.1-8B, not per page); the page size
// when that is not a whole number of pages or does not divide the pool
// (blocks then not aligned to it are quarantined, never revoked).
func (c Config) revokeBlock(poolBytes uint64) uint64 {
	page := uint64(os.Getpagesize())
	layout, err := c.kvLayout()
	if err != nil {
		return page
	}
	shape, err := layout.Shape(c.Parallel.orOne().kv(), c.Rank.kv())
	if err != nil {
		return page
	}
	var g uint64
	for i := range layout.Groups {
		if bb := shape.BlockBytes(layout, i); bb > 0 {
			g = gcd(g, bb)
		}
	}
	if g == 0 || g%page != 0 || poolBytes%g != 0 {
		return page
	}
	return g
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Validate checks every field without touching files or the network.
func (c Config) Validate() error {
	if len(c.Instance) > messages.MaxInstanceLen {
		return bad("instance", c.Instance, "longer than %d bytes", messages.MaxInstanceLen)
	}
	if why := instanceChars(c.Instance); why != "" {
		return bad("instance", c.Instance, "%s", why)
	}
	par := c.Parallel.orOne()
	if par.TP < 1 || par.PP < 1 {
		return bad("parallel", par, "tp and pp must be ≥ 1")
	}
	if !par.kv().Contains(c.Rank.kv()) {
		return bad("rank", c.Rank, "outside this instance's parallel %+v (tp in 0..%d, pp in 0..%d)", par, par.TP-1, par.PP-1)
	}
	if c.Model == "" && c.Layout == nil {
		return bad("model", c.Model, "empty: name a preset (%s)", strings.Join(kvcache.Presets(), ", "))
	}
	if c.TokensPerBlock < 0 {
		return bad("tokens_per_block", c.TokensPerBlock, "must be ≥ 0")
	}
	layout, err := c.kvLayout()
	if err != nil {
		return bad("model", c.Model, "%v", err)
	}
	if err := par.kv().Validate(layout); err != nil {
		return bad("parallel", par, "%v", err)
	}
	if shape, err := layout.Shape(par.kv(), c.Rank.kv()); err == nil && c.PoolBytes > 0 {
		var perSet, empty uint64
		for g := range layout.Groups {
			bb := shape.BlockBytes(layout, g)
			perSet += bb
			if bb == 0 {
				empty++ // kvxfer.Config's placeholder pool: one byte
			}
		}
		if c.PoolBytes < perSet {
			return bad("pool_bytes", c.PoolBytes, "holds no block: one block of every layer group of %s is %d bytes on this rank", layout.Name, perSet)
		}
		// Before Open allocates it (seconds for a large pool), as the
		// engine would refuse it after: a Hello names at most
		// messages.MaxBlocks blocks of a group.
		if n := (c.PoolBytes - min(empty, c.PoolBytes)) / max(perSet, 1); n > messages.MaxBlocks {
			return bad("pool_bytes", c.PoolBytes, "holds %d blocks per layer group (one block of every group of %s is %d bytes on this rank), more than the %d a pool may hold: use a smaller pool_bytes or a larger tokens_per_block", n, layout.Name, perSet, messages.MaxBlocks)
		}
	}
	if c.Workers < 0 || c.Workers > kvxfer.MaxWorkers {
		return bad("workers", c.Workers, "must be 1 to %d (0: the default)", kvxfer.MaxWorkers)
	}
	switch c.Backend {
	case "", BackendAuto, shm.Backend, loopback.Backend, cudaipc.Backend:
	case ucx.Backend:
		if !ucx.Available {
			return bad("backend", c.Backend, "%v (backend \"shm\" runs without UCX)", ucx.ErrUnavailable)
		}
	default:
		return bad("backend", c.Backend, "want %q, %q, %q, %q or %q", BackendAuto, ucx.Backend, shm.Backend, cudaipc.Backend, loopback.Backend)
	}
	if err := c.validateDevice(); err != nil {
		return err
	}
	if err := c.validateCallerMemory(); err != nil {
		return err
	}
	inProcess := c.Backend == loopback.Backend && c.Bind == ""
	if err := c.validateDiscovery(inProcess); err != nil {
		return err
	}
	if inProcess {
		if len(c.Peers) > 0 {
			return bad("bind", c.Bind, "empty (the in-process link) but %d peers are listed: give a bind endpoint", len(c.Peers))
		}
	} else if err := zmq.CheckEndpoint(c.Bind); err != nil {
		return bad("bind", c.Bind, "%v", trimZmq(err))
	}
	if c.HeartbeatInterval < 0 {
		return bad("heartbeat_interval", c.HeartbeatInterval, "must be > 0 (liveness needs heartbeats)")
	}
	if c.HeartbeatInterval > 0 && c.HeartbeatInterval < Duration(MinHeartbeatInterval) {
		return bad("heartbeat_interval", c.HeartbeatInterval, "below the minimum %v: the link cannot beat that often, and a live peer would be declared down", MinHeartbeatInterval)
	}
	if c.HeartbeatMisses < 0 || c.HeartbeatMisses == 1 {
		return bad("heartbeat_misses", c.HeartbeatMisses, "must be ≥ %d (0: the default %d; with 1, a live peer is declared down whenever a beat comes a moment late)", MinHeartbeatMisses, zmq.DefaultHeartbeatMisses)
	}
	if iv, m := c.heartbeatParams(); iv > math.MaxInt64/time.Duration(m) {
		return bad("heartbeat_misses", c.HeartbeatMisses, "times heartbeat_interval (%v) overflows a duration", iv)
	}
	if c.TransferTimeout < 0 {
		return bad("transfer_timeout", c.TransferTimeout, "must be > 0")
	}
	if c.DrainGrace < 0 {
		return bad("drain_grace", c.DrainGrace, "must be > 0")
	}
	if c.WriterLease < 0 {
		return bad("writer_lease", c.WriterLease, "must be ≥ 0 (0: off)")
	}
	if iv, _ := c.heartbeatParams(); c.WriterLease > 0 && time.Duration(c.WriterLease) < 2*iv {
		// The link renews it at most once per heartbeat interval: shorter,
		// it lapses between a live peer's heartbeats, and every request
		// with that peer fails ("let its writer lease lapse").
		return bad("writer_lease", c.WriterLease, "shorter than two heartbeat intervals (heartbeat_interval %v): a live peer's heartbeats renew the lease at most once per interval, so it would lapse between them and fail the requests with that peer; give at least %v, or 0 (off)", iv, 2*iv)
	}
	if c.TraceMaxBytes < 0 {
		return bad("trace_max_bytes", c.TraceMaxBytes, "must be ≥ 0 (0: 1 GiB)")
	}
	if c.TraceKeep < 0 {
		return bad("trace_keep", c.TraceKeep, "must be ≥ 0 (0: stop recording at trace_max_bytes; N: keep N rotated files)")
	}
	if c.TracePath == "" && (c.TraceMaxBytes != 0 || c.TraceKeep != 0) {
		return bad("trace_path", c.TracePath, "trace_max_bytes and trace_keep bound a trace: give its trace_path")
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return bad("metrics_addr", c.MetricsAddr, "%v (want HOST:PORT)", err)
		}
	}
	if c.Insecure {
		if err := c.insecureKeys(); err != nil {
			return err
		}
	}
	if !c.Insecure && !inProcess {
		if (c.KeyFile == "") == (c.SecretKey == "") {
			return bad("key_file", c.KeyFile, "give exactly one of key_file and secret_key (or insecure: true)")
		}
		if c.SecretKey != "" && zmq.CheckKey(c.SecretKey) != nil {
			// The value is a secret: neither it nor a character of it is shown.
			return fmt.Errorf("%w: secret_key: not a CURVE secret key (%d characters; want 40 of Z85, as kvxfer keygen writes)",
				ErrConfig, len(c.SecretKey))
		}
	}
	seen := map[messages.PeerID]int{}
	// A peer's parallelism is compared normalized for the layers of this
	// node's layout (kvcache.Parallel.Normal; a peer lays the model out
	// as this node does, or every request with it fails at its Hello):
	// the default split spelled out ("16,16" for 32 layers at PP2) is the
	// same parallelism as "" (the default), as node compares a peer's
	// Hello and etcd record with it. Errors name the values as given.
	type listed struct {
		as   Parallel         // as the first peer of the instance gave it
		norm kvcache.Parallel // normalized
	}
	pars := map[string]listed{}
	self := par.kv().Normal(layout.Layers)
	for i, p := range c.Peers {
		f := fmt.Sprintf("peers[%d]", i)
		if err := checkNamedInstance(f+".instance", p.Instance); err != nil {
			return err
		}
		pp := p.Parallel.orOne()
		if pp.TP < 1 || pp.PP < 1 {
			return bad(f+".parallel", pp, "tp and pp must be ≥ 1")
		}
		if !pp.kv().Contains(p.Rank.kv()) {
			return bad(f+".rank", p.Rank, "outside %s's parallel %+v (tp in 0..%d, pp in 0..%d)", p.Instance, pp, pp.TP-1, pp.PP-1)
		}
		// A peer serves this node's model: a parallelism (a split) that
		// model cannot take is a mistake here, not at the peer's Hello.
		if err := pp.kv().Validate(layout); err != nil {
			return bad(f+".parallel", pp, "%v", err)
		}
		norm := pp.kv().Normal(layout.Layers)
		if prev, ok := pars[p.Instance]; !ok {
			pars[p.Instance] = listed{as: pp, norm: norm}
		} else if prev.norm != norm {
			return bad(f+".parallel", pp, "another peer of %s says %+v: one instance has one parallelism", p.Instance, prev.as)
		}
		id := p.id()
		if j, ok := seen[id]; ok {
			return bad(f+".rank", p.Rank, "%s is also peers[%d]", id, j)
		}
		seen[id] = i
		if p.Instance == c.instance() && norm == self && p.Rank == c.Rank {
			return bad(f, id.String(), "is this node itself")
		}
		if p.Endpoint == "" && c.etcd() {
			// Found through etcd; a key given pins it. A pinned key is
			// checked as a static peer's is: a mistyped one would
			// otherwise surface only once the peer registers, as a
			// record refused for a key mismatch that is no mismatch.
			if p.PublicKeyFile != "" && p.PublicKey != "" {
				return bad(f+".public_key_file", p.PublicKeyFile, "give at most one of public_key_file and public_key")
			}
			if err := checkInlineKey(p.PublicKey); err != nil {
				return bad(f+".public_key", p.PublicKey, "%v", err)
			}
			continue
		}
		if err := zmq.CheckPeerEndpoint(p.Endpoint); err != nil { // one to dial: no wildcard
			return bad(f+".endpoint", p.Endpoint, "%v", trimZmq(err))
		}
		if !c.Insecure && (p.PublicKeyFile == "") == (p.PublicKey == "") {
			return bad(f+".public_key_file", p.PublicKeyFile, "give exactly one of public_key_file and public_key (or insecure: true)")
		}
		if err := checkInlineKey(p.PublicKey); err != nil {
			return bad(f+".public_key", p.PublicKey, "%v", err)
		}
	}
	for i, id := range c.Identities {
		f := fmt.Sprintf("identities[%d]", i)
		// An identity names an instance as a peer does: a name no sender
		// can have ("ctx/0": '/' separates an instance from its rank)
		// would bind the key to no one, and the sender it was meant for
		// be refused with no word of why. Its ranks are checked here
		// too, by field, rather than by the link once Open starts it.
		if err := checkNamedInstance(f+".instance", id.Instance); err != nil {
			return err
		}
		for j, r := range id.Ranks {
			if r < 0 || r >= messages.MaxRank {
				return bad(fmt.Sprintf("%s.ranks[%d]", f, j), r, "want a rank index 0..%d", messages.MaxRank-1)
			}
		}
		if (id.PublicKey == "") == (id.PublicKeyFile == "") {
			return bad(f+".public_key_file", id.PublicKeyFile, "give exactly one of public_key_file and public_key")
		}
		if err := checkInlineKey(id.PublicKey); err != nil {
			return bad(f+".public_key", id.PublicKey, "%v", err)
		}
	}
	return nil
}

// checkInlineKey checks a CURVE key given inline in the configuration
// (nil for none): a mistyped key is named by its field at once, rather
// than by the link when it starts.
func checkInlineKey(key string) error {
	if key == "" {
		return nil
	}
	if err := zmq.CheckKey(key); err != nil {
		return errors.New(trimZmq(err))
	}
	return nil
}

// MaxDiscoveryTTL bounds discovery_ttl: a rank that died stays a member
// for that long.
const MaxDiscoveryTTL = time.Hour

// etcd reports whether the config asks for etcd discovery.
func (c Config) etcd() bool { return discovery.IsEtcd(c.Discovery) }

// etcdAccess names the settings of TLS and auth to etcd, the TLS ones
// first.
func (c Config) etcdAccess() []struct{ name, value string } {
	return []struct{ name, value string }{{"discovery_ca", c.DiscoveryCA}, {"discovery_cert", c.DiscoveryCert},
		{"discovery_key", c.DiscoveryKey}, {"discovery_user", c.DiscoveryUser},
		{"discovery_password_file", c.DiscoveryPasswordFile}}
}

// EtcdOptions loads what TLS and auth to etcd need from the files the
// config names (discovery.WithTLS, discovery.WithAuth), for a caller that
// reads the same etcd as the node; errors name the setting.
func (c Config) EtcdOptions() ([]discovery.Option, error) {
	var opts []discovery.Option
	if discovery.EtcdTLS(c.Discovery) {
		cfg, err := discovery.LoadTLS(c.DiscoveryCA, c.DiscoveryCert, c.DiscoveryKey)
		if err != nil {
			return nil, fmt.Errorf("node: discovery_ca = %q, discovery_cert = %q, discovery_key = %q: %w",
				c.DiscoveryCA, c.DiscoveryCert, c.DiscoveryKey, err)
		}
		opts = append(opts, discovery.WithTLS(cfg))
	}
	if c.DiscoveryUser != "" {
		pw, err := discovery.ReadPassword(c.DiscoveryPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("node: discovery_password_file = %q: %w", c.DiscoveryPasswordFile, err)
		}
		opts = append(opts, discovery.WithAuth(c.DiscoveryUser, pw))
	}
	return opts, nil
}

// validateDiscovery checks discovery, cluster, discovery_ttl and the
// settings of TLS and auth to etcd (the files are read at start).
func (c Config) validateDiscovery(inProcess bool) error {
	switch {
	case c.Discovery == "" || c.Discovery == "static":
		if c.Cluster != "" {
			return bad("cluster", c.Cluster, "set without etcd discovery (discovery = %q): give discovery = \"etcd://HOST:PORT\" or drop cluster", c.Discovery)
		}
		if c.DiscoveryTTL != 0 {
			return bad("discovery_ttl", c.DiscoveryTTL, "set without etcd discovery (discovery = %q)", c.Discovery)
		}
		for _, f := range c.etcdAccess() {
			if f.value != "" {
				return bad(f.name, f.value, "set without etcd discovery (discovery = %q)", c.Discovery)
			}
		}
		return nil
	case c.etcd():
		if _, err := discovery.ParseEtcdURL(c.Discovery); err != nil {
			return bad("discovery", c.Discovery, "%v", err)
		}
	default:
		return bad("discovery", c.Discovery, "want \"static\", \"etcd://HOST:PORT[,HOST:PORT]\" or \"etcds://HOST:PORT[,HOST:PORT]\" (TLS)")
	}
	if !discovery.EtcdTLS(c.Discovery) {
		for _, f := range c.etcdAccess()[:3] {
			if f.value != "" {
				return bad(f.name, f.value, "a TLS setting with the plaintext discovery = %q: use etcds://", c.Discovery)
			}
		}
	}
	if (c.DiscoveryCert == "") != (c.DiscoveryKey == "") {
		return bad("discovery_cert", c.DiscoveryCert, "and discovery_key = %q: a client certificate needs both", c.DiscoveryKey)
	}
	if (c.DiscoveryUser == "") != (c.DiscoveryPasswordFile == "") {
		return bad("discovery_user", c.DiscoveryUser, "and discovery_password_file = %q: etcd auth needs both", c.DiscoveryPasswordFile)
	}
	if err := discovery.CheckCluster(c.Cluster); err != nil {
		return bad("cluster", c.Cluster, "%v (etcd discovery needs a cluster name)", err)
	}
	if c.DiscoveryTTL < 0 || time.Duration(c.DiscoveryTTL) > MaxDiscoveryTTL {
		return bad("discovery_ttl", c.DiscoveryTTL, "want 1s..%v (0: the default, %v)", MaxDiscoveryTTL, discovery.DefaultTTL)
	}
	if inProcess {
		return bad("discovery", c.Discovery, "needs a bind endpoint peers in other processes can dial (bind is empty: the in-process link)")
	}
	if host := bindHost(c.Bind); host == "*" || host == "0.0.0.0" || host == "[::]" || host == "::" {
		return bad("bind", c.Bind, "a wildcard address is no endpoint peers can dial, and etcd discovery publishes it: bind one address")
	}
	return nil
}

// bindHost is the host of a tcp:// endpoint ("" for others).
func bindHost(ep string) string {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return ""
	}
	if i := strings.LastIndex(rest, ":"); i >= 0 {
		return rest[:i]
	}
	return rest
}

// trimZmq drops zmq's "bad config" prefix (ours says it already).
func trimZmq(err error) string {
	return strings.TrimPrefix(err.Error(), zmq.ErrConfig.Error()+": ")
}

func (c Config) instance() string {
	if c.Instance == "" {
		return kvxfer.DefaultInstance
	}
	return c.Instance
}

// self is this node's control-plane identity.
func (c Config) self() messages.PeerID {
	return messages.PeerID{Instance: c.instance(), Rank: int32(c.Parallel.orOne().kv().Index(c.Rank.kv()))}
}

// id is the peer's control-plane identity: rank Parallel.Index(Rank).
func (p Peer) id() messages.PeerID {
	return messages.PeerID{Instance: p.Instance, Rank: int32(p.Parallel.orOne().kv().Index(p.Rank.kv()))}
}

// insecureKeys refuses keys given with Insecure, as the CLI refuses
// --insecure with --key or --peer-key: insecure turns CURVE off, and the
// keys were ignored without a word, the user believing the link
// authenticated. A secret key is named by its field alone.
func (c *Config) insecureKeys() error {
	var given []string
	if c.KeyFile != "" {
		given = append(given, fmt.Sprintf("key_file %q", c.KeyFile))
	}
	if c.SecretKey != "" {
		given = append(given, "secret_key")
	}
	for i, p := range c.Peers {
		if p.PublicKeyFile != "" {
			given = append(given, fmt.Sprintf("peers[%d].public_key_file %q", i, p.PublicKeyFile))
		}
		if p.PublicKey != "" {
			given = append(given, fmt.Sprintf("peers[%d].public_key", i))
		}
	}
	if len(c.Identities) > 0 {
		given = append(given, "identities")
	}
	if len(given) == 0 {
		return nil
	}
	return fmt.Errorf("%w: insecure = true with %s: insecure turns CURVE off, so the keys would be ignored: drop insecure to authenticate with them, or drop the keys",
		ErrConfig, strings.Join(given, " and "))
}
