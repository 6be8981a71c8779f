package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/internal/proc"
	"github.com/kvxfer/kvxfer/internal/scratch"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// roleKeys are the common settings ctx and gen take, and their defaults.
var (
	roleKeys     = []string{config.Model, config.Pool, config.TokensPerBlock, config.Workers, config.Backend, config.Timeout, config.MetricsAddr, config.CurveIdentities}
	roleDefaults = map[string]string{config.Pool: "1GiB", config.Backend: crossProcessBackend(), config.Timeout: "1m"}
	roleDocs     = map[string]string{config.TokensPerBlock: presetBlockDoc}
)

// crossProcessBackend is the default data plane between processes: ucx
// when this binary has it (UCX picks shared memory, RDMA or TCP), else shm.
func crossProcessBackend() string {
	if ucx.Available {
		return ucx.Backend
	}
	return shm.Backend
}

// checkCrossProcessBackend refuses a backend that cannot join processes
// (kvxfer ctx and gen also run cudaipc: GPU to GPU on one host).
func checkCrossProcessBackend(s config.Settings, what string) error {
	switch s.Backend {
	case shm.Backend:
		return nil
	case cudaipc.Backend: // kvxfer demo refuses it first
		return nil
	case ucx.Backend:
		if !ucx.Available {
			return s.Invalid(config.Backend, ucx.ErrUnavailable.Error())
		}
		return nil
	}
	want := "want shm or ucx"
	if !strings.HasPrefix(what, "demo") {
		want = "want shm, ucx or cudaipc (GPU to GPU on one host)"
	}
	return s.Invalid(config.Backend, what+" runs across processes: "+want)
}

// ctxOnlyFlags are the flags of kvxfer ctx that kvxfer gen does not take
// (the context role alone hands chunks over and posts writes), with why;
// ctxOnlyNote says so in gen's help.
var ctxOnlyFlags = map[string]string{
	"layer-parts":  "the context role alone hands chunks over",
	"writer-lease": "the context role alone posts writes",
}

const ctxOnlyNote = "not kvxfer ctx's own --layer-parts and --writer-lease: give those to ctx alone"

// roleFlags are the flags `kvxfer ctx` and `kvxfer gen` share.
type roleFlags struct {
	o           proc.Options
	trace       traceFlags
	keyFile     string
	peerPubFile string
	// settings are the common settings resolve applied, with where each
	// came from (nameFlags names them).
	settings *config.Settings
}

func addRoleFlags(cmd *cobra.Command, f *roleFlags, self, peer string) {
	f.o = proc.Options{Instance: self, Peer: peer, Requests: 8,
		MinTokens: 512, MaxTokens: 4096, ChunkTokens: 512, Compute: 5 * time.Millisecond, Concurrency: 2, Seed: 1,
		Heartbeat: time.Second, HeartbeatMisses: 3}
	fl := cmd.Flags()
	fl.StringVar(&f.o.Instance, "instance", self, "this engine's instance name")
	fl.StringVar(&f.o.Peer, "peer", peer, "the peer engine's instance name")
	fl.StringVar(&f.o.Bind, "bind", "", "this engine's control endpoint (tcp://127.0.0.1:PORT or ipc://PATH)")
	fl.StringVar(&f.o.PeerEndpoint, "peer-endpoint", "", "the peer's control endpoint")
	fl.StringVar(&f.keyFile, "key", "", "this engine's CURVE secret key file (kvxfer keygen)")
	fl.StringVar(&f.peerPubFile, "peer-key", "", "the peer's CURVE public key file")
	fl.BoolVar(&f.o.Insecure, "insecure", false, "no CURVE authentication or encryption (local demos only; refused with --key or --peer-key)")
	fl.IntVar(&f.o.Device, "device", 0, "CUDA ordinal of this process's GPU (--backend cudaipc: the pool is device memory there)")
	addSettingFlags(fl, roleDefaults, roleDocs, roleKeys...)
	fl.IntVar(&f.o.Requests, "requests", f.o.Requests, fmt.Sprintf("number of requests (1 to %d)", proc.MaxRequests))
	fl.IntVar(&f.o.MinTokens, "min-tokens", f.o.MinTokens, "shortest prompt")
	fl.IntVar(&f.o.MaxTokens, "max-tokens", f.o.MaxTokens, "longest prompt")
	chunkUsage, computeUsage := "prefill chunk size in tokens", "simulated compute per chunk"
	if self != "ctx" {
		// Taken so that ctx's workload flags can be given to gen
		// unchanged (kvxfer demo gives both the same), but only the
		// context role prefills: the help showed its default as this
		// role's own. ctx's own flags (ctxOnlyFlags) are not taken, so
		// the help says so rather than claim one command line for both.
		chunkUsage = "unused here: kvxfer ctx's prefill chunk size in tokens, taken so that ctx's workload flags can be given to gen unchanged (" + ctxOnlyNote + ")"
		computeUsage = "unused here: kvxfer ctx's simulated compute per chunk, taken so that ctx's workload flags can be given to gen unchanged (" + ctxOnlyNote + ")"
	}
	fl.IntVar(&f.o.ChunkTokens, "chunk-tokens", f.o.ChunkTokens, chunkUsage)
	fl.DurationVar(&f.o.Compute, "compute", f.o.Compute, computeUsage)
	fl.IntVar(&f.o.Concurrency, "concurrency", f.o.Concurrency, "requests in flight")
	fl.Uint64Var(&f.o.Seed, "seed", f.o.Seed, "seed of the request list (both roles must agree)")
	fl.DurationVar(&f.o.Heartbeat, "heartbeat", f.o.Heartbeat, "heartbeat interval")
	fl.IntVar(&f.o.HeartbeatMisses, "heartbeat-misses", f.o.HeartbeatMisses, "missed heartbeats that make a peer dead")
	fl.StringVar(&f.o.TracePath, "trace", "", "record a replayable trace of every session to this file, one per process (kvxfer replay, kvxfer trace export)")
	addTraceFlags(fl, &f.trace)
	fl.StringVar(&f.o.Discovery, "discovery", "static", "membership: static (--peer-endpoint, --peer-key), etcd://HOST:PORT[,HOST:PORT] (peers found there) or etcds://… (etcd over TLS)")
	fl.StringVar(&f.o.DiscoveryCA, "discovery-ca", "", "PEM file of the CA that signed etcd's server certificate (etcds://; default: the system's roots)")
	fl.StringVar(&f.o.DiscoveryCert, "discovery-cert", "", "PEM client certificate for an etcd that asks for one (etcds://; with --discovery-key)")
	fl.StringVar(&f.o.DiscoveryKey, "discovery-key", "", "PEM key of --discovery-cert")
	fl.StringVar(&f.o.DiscoveryUser, "discovery-user", "", "etcd user to log in as (etcd's auth; with --discovery-password-file)")
	fl.StringVar(&f.o.DiscoveryPasswordFile, "discovery-password-file", "", "file whose first line is --discovery-user's password")
	fl.StringVar(&f.o.Cluster, "cluster", "", "the etcd cluster name both roles register under (with --discovery etcd://…)")
	fl.DurationVar(&f.o.DiscoveryTTL, "discovery-ttl", 0, "etcd lease TTL, rounded up to whole seconds (default 5s): how long a killed rank stays a member")
	fl.IntVar(&f.o.Parallel.TP, "tp", 1, "this instance's tensor parallelism (more than 1 needs --discovery etcd://…)")
	fl.IntVar(&f.o.Rank.TP, "tp-rank", 0, "this process's tensor rank in its instance, 0..--tp-1")
	fl.IntVar(&f.o.PeerParallel.TP, "peer-tp", 1, "the peer instance's tensor parallelism (more than 1 needs --discovery etcd://…)")
	fl.IntVar(&f.o.Parallel.PP, "pp", 1, "this instance's pipeline parallelism (more than 1 needs --discovery etcd://…)")
	fl.IntVar(&f.o.Rank.PP, "pp-rank", 0, "this process's pipeline stage in its instance, 0..--pp-1")
	fl.StringVar(&f.o.Parallel.Stages, "pp-stages", "", "each of this instance's --pp stages' layer count, comma-separated (\"7,8,8,7\", as VLLM_PP_LAYER_PARTITION), when they split the model's layers otherwise than kvxfer's default (the first layers % pp stages one layer longer)")
	fl.IntVar(&f.o.PeerParallel.PP, "peer-pp", 1, "the peer instance's pipeline parallelism (more than 1 needs --discovery etcd://…)")
	fl.StringVar(&f.o.PeerParallel.Stages, "peer-pp-stages", "", "each of the peer instance's --peer-pp stages' layer count, as --pp-stages")
	if self == "ctx" {
		fl.DurationVar(&f.o.WriterLease, "writer-lease", 0, "post writes for the generation peer only while its frames or heartbeats renewed a lease within this long (0: off; at least two --heartbeat intervals)")
		fl.IntVar(&f.o.LayerParts, "layer-parts", 0, "layer ranges each chunk is handed over in, each as the simulated forward pass computes it (0: one per layer; 1: the whole chunk at its end)")
	}
}

// resolve applies the common settings and checks the role's own flags.
func (f *roleFlags) resolve(a *app, cmd *cobra.Command) error {
	s, err := a.settings(cmd, roleDefaults, roleKeys...)
	if err != nil {
		return err
	}
	f.settings = &s
	if err := checkCrossProcessBackend(s, "kvxfer "+cmd.Name()); err != nil {
		return err
	}
	if err := checkTokensPerBlock(&s); err != nil {
		return err
	}
	f.o.Backend = s.Backend
	f.o.Model, f.o.PoolBytes, f.o.TokensPerBlock, f.o.Workers = s.Model, s.Pool, s.TokensPerBlock, s.Workers
	f.o.PoolName = settingName(s, config.Pool)
	f.o.Timeout, f.o.MetricsAddr = s.Timeout, s.MetricsAddr
	if s.Backend != cudaipc.Backend { // a cudaipc pool is GPU memory
		if err := checkPoolMemory(s, meminfo.Available); err != nil {
			return err
		}
	}
	// Named by their flags here: the node would refuse a negative one by
	// its config key, and take 0 for its default without a word.
	if f.o.Heartbeat <= 0 {
		return fmt.Errorf("--heartbeat = %v: must be > 0 (a peer's liveness is its heartbeats)", f.o.Heartbeat)
	}
	if f.o.Heartbeat < node.MinHeartbeatInterval {
		return fmt.Errorf("--heartbeat = %v: below the minimum %v: the link cannot beat that often, and a live peer would be declared down", f.o.Heartbeat, node.MinHeartbeatInterval)
	}
	if f.o.HeartbeatMisses < node.MinHeartbeatMisses {
		return fmt.Errorf("--heartbeat-misses = %d: must be ≥ %d (with 1, a live peer is declared down whenever a beat comes a moment late)", f.o.HeartbeatMisses, node.MinHeartbeatMisses)
	}
	if f.o.Heartbeat > math.MaxInt64/time.Duration(f.o.HeartbeatMisses) {
		return fmt.Errorf("--heartbeat-misses = %d: times --heartbeat (%v) overflows a duration", f.o.HeartbeatMisses, f.o.Heartbeat)
	}
	for _, id := range s.CurveIdentities {
		f.o.Identities = append(f.o.Identities, zmq.Identity{PublicKey: id.PublicKey, Instance: id.Instance, Ranks: id.Ranks})
	}
	if err := f.resolveDiscovery(cmd); err != nil {
		return err
	}
	if err := checkStages("pp-stages", f.o.Parallel.Stages, "pp", f.o.Parallel.PP, f.o.Model, f.o.Layout); err != nil {
		return err
	}
	if err := checkStages("peer-pp-stages", f.o.PeerParallel.Stages, "peer-pp", f.o.PeerParallel.PP, f.o.Model, f.o.Layout); err != nil {
		return err
	}
	if f.o.Instance == "" {
		// The node would run as the library's default instance name.
		return fmt.Errorf("--instance = \"\": want this engine's instance name (the peer's --peer)")
	}
	etcd := f.o.Discovery != "static"
	switch {
	case f.o.Bind == "" && !etcd && f.o.PeerEndpoint == "":
		return fmt.Errorf("--bind and --peer-endpoint are required (--peer-endpoint only with --discovery static)")
	case f.o.Bind == "":
		// Naming the one missing: the message named both, one of them
		// given.
		return fmt.Errorf("--bind is required: this engine's control endpoint, where its peer's --peer-endpoint points (tcp://127.0.0.1:PORT or ipc://PATH)")
	case !etcd && f.o.PeerEndpoint == "":
		return fmt.Errorf("--peer-endpoint is required with --discovery static: the peer's control endpoint, its --bind (tcp://HOST:PORT or ipc://PATH)")
	}
	if err := zmq.CheckEndpoint(f.o.Bind); err != nil {
		return fmt.Errorf("--bind: %w", err)
	}
	if err := checkBindPlace(f.o.Bind); err != nil {
		return err
	}
	if !etcd {
		if err := zmq.CheckPeerEndpoint(f.o.PeerEndpoint); err != nil {
			return fmt.Errorf("--peer-endpoint: %w", err)
		}
		if f.o.PeerEndpoint == f.o.Bind {
			return fmt.Errorf("--bind and --peer-endpoint are both %q: the peer's endpoint is where the other process binds", f.o.Bind)
		}
	}
	if err := checkTracePath(f.o.TracePath); err != nil {
		return err
	}
	if f.o.TraceMaxBytes, f.o.TraceKeep, err = f.trace.resolve(cmd.Flags(), f.o.TracePath, false); err != nil {
		return err
	}
	f.o.Log = a.log.With().Str("role", f.o.Instance).Logger()
	if f.o.Parallel.TP > 1 {
		f.o.Log = f.o.Log.With().Int("tp_rank", f.o.Rank.TP).Logger()
	}
	if f.o.Parallel.PP > 1 {
		f.o.Log = f.o.Log.With().Int("pp_rank", f.o.Rank.PP).Logger()
	}
	if f.o.Insecure {
		if err := f.checkInsecureKeys(); err != nil {
			return err
		}
		f.o.Log.Warn().Msg("--insecure: control plane neither authenticated nor encrypted")
		return nil
	}
	if f.keyFile == "" || (!etcd && f.peerPubFile == "") {
		return fmt.Errorf("--key and --peer-key are required unless --insecure (with --discovery etcd://… --peer-key is optional: it pins the peer's key)")
	}
	// A key file that is not there named only the open's error: say
	// which file each flag wants and what writes it.
	self, other := cmd.Name(), map[string]string{"ctx": "gen", "gen": "ctx"}[cmd.Name()]
	if f.o.SecretKey, err = config.ReadSecretKey(f.keyFile); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--key: %w: give this engine's secret key file (kvxfer keygen --out %s writes %s.key, and %s.pub for the %s process's --peer-key)", err, self, self, self, other)
		}
		return fmt.Errorf("--key: %w", err)
	}
	if w := config.SecretKeyExposed(f.keyFile); w != "" {
		f.o.Log.Warn().Msg("--key: " + w)
	}
	if f.peerPubFile != "" {
		if f.o.PeerPublicKey, err = config.ReadPublicKey(f.peerPubFile); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("--peer-key: %w: give the %s process's public key file (the %s.pub kvxfer keygen --out %s wrote beside its %s.key)", err, other, other, other, other)
			}
			return fmt.Errorf("--peer-key: %w", err)
		}
		if own, err := zmq4.AuthCurvePublic(f.o.SecretKey); err == nil && own == f.o.PeerPublicKey {
			// Both processes would hold one keypair: each then refuses
			// the other's handshake, named only once both are running.
			return fmt.Errorf("--peer-key %s is the public key of this engine's own --key %s: give the peer's public key (each engine has its own keypair: kvxfer keygen --out ctx, kvxfer keygen --out gen)",
				f.peerPubFile, f.keyFile)
		}
	}
	return nil
}

// checkDiscoveryFiles reads the TLS files of an etcds:// --discovery and
// the password file of --discovery-user, naming the flag of a file that
// cannot be used: the node reads them only once it starts, and named
// them by its config keys ("node: discovery_ca = …, discovery_cert = \"\",
// discovery_key = \"\": …", "node: discovery_password_file: …").
func checkDiscoveryFiles(o *proc.Options) error {
	if discovery.EtcdTLS(o.Discovery) {
		if _, err := discovery.LoadTLS(o.DiscoveryCA, "", ""); err != nil {
			return fmt.Errorf("--discovery-ca = %q: %w: give the PEM file of the CA that signed etcd's server certificate", o.DiscoveryCA, err)
		}
		if _, err := discovery.LoadTLS("", o.DiscoveryCert, o.DiscoveryKey); err != nil {
			return fmt.Errorf("--discovery-cert = %q, --discovery-key = %q: %w", o.DiscoveryCert, o.DiscoveryKey, err)
		}
	}
	if o.DiscoveryUser == "" {
		return nil
	}
	if _, err := discovery.ReadPassword(o.DiscoveryPasswordFile); err != nil {
		return fmt.Errorf("--discovery-password-file = %q: %w: write --discovery-user %s's password there", o.DiscoveryPasswordFile, err, o.DiscoveryUser)
	}
	return nil
}

// checkInsecureKeys refuses --insecure given with --key or --peer-key:
// --insecure turns CURVE off, and the keys were ignored without a word,
// the user believing the link authenticated.
func (f *roleFlags) checkInsecureKeys() error {
	var given []string
	for _, k := range []struct{ flag, file string }{{"--key", f.keyFile}, {"--peer-key", f.peerPubFile}} {
		if k.file != "" {
			given = append(given, fmt.Sprintf("%s %s", k.flag, k.file))
		}
	}
	if len(given) == 0 {
		return nil
	}
	return fmt.Errorf("--insecure with %s: --insecure turns CURVE off, so the keys would be ignored: drop --insecure to authenticate with them, or drop the keys",
		strings.Join(given, " and "))
}

// checkTracePath refuses a --trace file this process cannot write, naming
// the flag: the engine creates it only once the node has started, and its
// error names kvxfer.Config's field (TracePath), not the flag. A file
// that is there is left as it is; one that was not is removed again.
func checkTracePath(path string) error {
	if path == "" {
		return nil
	}
	_, err := os.Stat(path)
	switch {
	case err == nil:
		var f *os.File
		if f, err = os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			_ = f.Close()
		}
	case errors.Is(err, fs.ErrNotExist):
		var f *os.File
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
			_ = f.Close()
			_ = os.Remove(path)
		}
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("--trace = %s: cannot write it: %w", path, err)
	}
	return nil
}

// checkBindPlace refuses, before the pool is mapped, a --bind that
// libzmq can only refuse once it binds, naming neither the flag nor the
// mistake: an ipc:// path in a directory that is not there ("bind: no
// such file or directory") and a tcp:// host that is neither `*`, an IP
// address nor an interface of this host ("bind: no such device": libzmq
// resolves no host name to bind; zmq.CheckEndpoint names one that
// resolves). Abstract (ipc://@name) and system-picked (ipc://*) paths,
// and a source;address pair, are left to libzmq.
func checkBindPlace(bind string) error {
	scheme, addr, _ := strings.Cut(bind, "://")
	switch scheme {
	case "ipc":
		if addr == "*" || strings.HasPrefix(addr, "@") {
			return nil
		}
		dir := filepath.Dir(addr)
		st, err := os.Stat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("--bind = %q: directory %s does not exist: create it, or bind a socket in a directory that does", bind, dir)
		case err == nil && !st.IsDir():
			return fmt.Errorf("--bind = %q: %s is not a directory: bind a socket in a directory", bind, dir)
		}
	case "tcp":
		i := strings.LastIndex(addr, ":")
		if i < 0 || strings.Contains(addr, ";") {
			return nil
		}
		host := strings.TrimSuffix(strings.TrimPrefix(addr[:i], "["), "]")
		ip, _, zoned := strings.Cut(host, "%")
		if host == "*" || zoned || net.ParseIP(ip) != nil {
			return nil
		}
		if _, err := net.InterfaceByName(host); err == nil {
			return nil
		}
		return fmt.Errorf("--bind = %q: %q is neither an IP address nor an interface of this host: bind one of its addresses (tcp://127.0.0.1%s), an interface name or every interface (tcp://*%s)",
			bind, host, addr[i:], addr[i:])
	}
	return nil
}

// checkPoolMemory refuses, before anything is mapped, a role's --pool
// larger than the memory available (MemAvailable; not checked where it
// cannot be read): the process maps one pool of it, which the transfers
// and the byte checks touch.
func checkPoolMemory(s config.Settings, avail func() (uint64, bool)) error {
	if have, ok := avail(); ok && s.Pool > have {
		return s.Invalid(config.Pool, fmt.Sprintf("more than the %.1fGiB of memory available (MemAvailable): use a smaller %s", float64(have)/(1<<30), settingName(s, config.Pool)))
	}
	return nil
}

// resolveDiscovery checks --discovery, --cluster, --discovery-ttl and the
// parallelism flags, naming the flag and its value.
func (f *roleFlags) resolveDiscovery(cmd *cobra.Command) error {
	o := &f.o
	switch {
	case o.Discovery == "static" || o.Discovery == "":
		o.Discovery = "static"
		if o.Cluster != "" {
			return fmt.Errorf("--cluster = %q: only with --discovery etcd://HOST:PORT", o.Cluster)
		}
		for _, name := range []string{"discovery-ttl", "discovery-ca", "discovery-cert", "discovery-key", "discovery-user", "discovery-password-file"} {
			if fl := cmd.Flags().Lookup(name); fl.Changed {
				return fmt.Errorf("--%s = %v: only with --discovery etcd://HOST:PORT (or etcds://)", name, fl.Value)
			}
		}
		if o.Parallel.TP < 1 || o.PeerParallel.TP < 1 {
			return fmt.Errorf("--tp = %d, --peer-tp = %d: must be ≥ 1", o.Parallel.TP, o.PeerParallel.TP)
		}
		if o.Parallel.TP != 1 || o.PeerParallel.TP != 1 {
			return fmt.Errorf("--tp = %d, --peer-tp = %d: more than one rank per instance needs --discovery etcd://HOST:PORT (one --peer-endpoint names one rank)", o.Parallel.TP, o.PeerParallel.TP)
		}
		if o.Parallel.PP < 1 || o.PeerParallel.PP < 1 {
			return fmt.Errorf("--pp = %d, --peer-pp = %d: must be ≥ 1", o.Parallel.PP, o.PeerParallel.PP)
		}
		if o.Parallel.PP != 1 || o.PeerParallel.PP != 1 {
			return fmt.Errorf("--pp = %d, --peer-pp = %d: more than one rank per instance needs --discovery etcd://HOST:PORT (one --peer-endpoint names one rank)", o.Parallel.PP, o.PeerParallel.PP)
		}
	default:
		if _, err := discovery.ParseEtcdURL(o.Discovery); err != nil {
			return fmt.Errorf("--discovery: %w (want static, etcd://HOST:PORT[,HOST:PORT] or etcds://…)", err)
		}
		if o.Cluster == "" {
			// CheckCluster's words ("invalid record: cluster name of 0
			// bytes") name no flag a user left out.
			return fmt.Errorf("--cluster is required with --discovery %s: give every ctx and gen process of one deployment the same name (--cluster prod)", o.Discovery)
		}
		if err := discovery.CheckCluster(o.Cluster); err != nil {
			return fmt.Errorf("--cluster = %q: %w (--discovery etcd://… needs one)", o.Cluster, err)
		}
		// Pairs the node would name by its config keys, half as flags
		// ("--discovery-cert = …: and discovery_key = \"\""). A
		// certificate over etcd:// is refused as a TLS setting over
		// plaintext, by the node.
		pairs := [][4]string{{"--discovery-user", o.DiscoveryUser, "--discovery-password-file", o.DiscoveryPasswordFile}}
		if strings.HasPrefix(o.Discovery, "etcds://") {
			pairs = append(pairs, [4]string{"--discovery-cert", o.DiscoveryCert, "--discovery-key", o.DiscoveryKey})
		}
		for _, p := range pairs {
			switch {
			case p[1] != "" && p[3] == "":
				return fmt.Errorf("%s = %q without %s: give both", p[0], p[1], p[2])
			case p[1] == "" && p[3] != "":
				return fmt.Errorf("%s = %q without %s: give both", p[2], p[3], p[0])
			}
		}
		if err := checkDiscoveryFiles(o); err != nil {
			return err
		}
		if o.PeerEndpoint != "" {
			return fmt.Errorf("--peer-endpoint = %q: with --discovery etcd://… peers are found in etcd", o.PeerEndpoint)
		}
		// 0 is the flag's own value for "the default"; given, it would
		// have been taken as the default without a word.
		if o.DiscoveryTTL < 0 || o.DiscoveryTTL == 0 && cmd.Flags().Lookup("discovery-ttl").Changed {
			return fmt.Errorf("--discovery-ttl = %v: want 1s..1h, a lease's time to live (leave the flag out for the default, 5s)", o.DiscoveryTTL)
		}
	}
	if o.Parallel.TP < 1 {
		return fmt.Errorf("--tp = %d: must be ≥ 1", o.Parallel.TP)
	}
	if o.PeerParallel.TP < 1 {
		return fmt.Errorf("--peer-tp = %d: must be ≥ 1", o.PeerParallel.TP)
	}
	if o.Rank.TP < 0 || o.Rank.TP >= o.Parallel.TP {
		return fmt.Errorf("--tp-rank = %d: want 0..%d (--tp = %d)", o.Rank.TP, o.Parallel.TP-1, o.Parallel.TP)
	}
	if o.Parallel.PP < 1 {
		return fmt.Errorf("--pp = %d: must be ≥ 1", o.Parallel.PP)
	}
	if o.PeerParallel.PP < 1 {
		return fmt.Errorf("--peer-pp = %d: must be ≥ 1", o.PeerParallel.PP)
	}
	if o.Rank.PP < 0 || o.Rank.PP >= o.Parallel.PP {
		return fmt.Errorf("--pp-rank = %d: want 0..%d (--pp = %d)", o.Rank.PP, o.Parallel.PP-1, o.Parallel.PP)
	}
	return nil
}

// checkStages refuses a --pp-stages (or --peer-pp-stages) that is no list
// of pp layer counts (--pp or --peer-pp, named by ppFlag) adding up to the
// model's layers, naming the flag and its value, before anything starts.
// An unknown model is left to the engine to name.
func checkStages(flag, stages, ppFlag string, pp int, model string, layout *kvcache.Layout) error {
	if stages == "" {
		return nil
	}
	counts, err := kvcache.ParseStages(stages)
	if err != nil {
		return fmt.Errorf("--%s = %q: %w", flag, stages, err)
	}
	if len(counts) != pp {
		return fmt.Errorf("--%s = %q: %d stages, --%s = %d: give one layer count per pipeline stage", flag, stages, len(counts), ppFlag, pp)
	}
	var l kvcache.Layout
	if layout != nil {
		l = *layout
	} else if l, err = kvcache.Preset(model); err != nil {
		return nil
	}
	sum := 0
	for _, n := range counts {
		sum += n
	}
	if sum != l.Layers {
		return fmt.Errorf("--%s = %q: %d layers in all, model %s has %d", flag, stages, sum, l.Name, l.Layers)
	}
	return nil
}

func newRoleCmd(a *app, use, short, example string, run func(context.Context, proc.Options, *cobra.Command) error, self, peer string) *cobra.Command {
	var f roleFlags
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `.

The two roles derive the same request list from --seed, --requests and the
token range, so both must be given the same values (ctx sends its values
with each request, and gen names a difference and fails the run). Each
prints one JSON report line on standard output when it ends and exits
non-zero if a request failed, a byte differed (gen), a block leaked, or
(ctx) gen asked for a request past ctx's --requests: after its last request
ctx waits for gen to leave (at most --timeout) and fails naming the first
such request as soon as one comes. Both must use the same
--backend: ucx (the default in a build with UCX; UCX picks shared memory, RDMA
or TCP), shm, or cudaipc (GPU to GPU between processes of one host: each
pool is --pool of device memory on GPU --device, written by the GPUs' copy
engines; it needs the NVIDIA driver). kvxfer demo --processes 2 runs both.

With --discovery etcd://HOST:PORT and --cluster NAME each process registers
its endpoint and CURVE public key in etcd under a lease (--discovery-ttl) and
finds its peers there: no --peer-endpoint, and --peer-key only to pin the
peer's key. A peer killed is seen as down when its lease expires. --tp,
--tp-rank and --peer-tp (and --pp, --pp-rank and --peer-pp) run an
instance as several ranks (etcd only); --pp-stages and --peer-pp-stages
say a pipeline split other than kvxfer's default (each stage's layer
count, "7,8,8,7"). kvxfer demo --cluster runs a context of TP2 and a
generation of TP1.

--trace FILE records a replayable trace (kvxfer replay, kvxfer trace
export). ` + traceRotationHelp,
		Example: example,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.resolve(a, cmd); err != nil {
				return err
			}
			ctx, got, stop := interruptible(cmd.Context())
			defer stop()
			hint := clusterHint(ctx, f.o)
			err := f.nameFlags(run(ctx, f.o, cmd))
			if h := hint(); h != "" && err != nil && strings.Contains(err.Error(), notRegistered) {
				err = fmt.Errorf("%w (%s)", err, h)
			}
			if errors.Is(err, kvcache.ErrBadRegion) {
				// A pool the host cannot map says which setting set it.
				err = fmt.Errorf("%s = %s: %w", f.o.PoolName, config.FormatSize(f.o.PoolBytes), err)
			}
			return interrupted(got, err)
		},
	}
	addRoleFlags(cmd, &f, self, peer)
	return cmd
}

func newCtxCmd(a *app) *cobra.Command {
	return newRoleCmd(a, "ctx", "Run the context (prefill) role as its own process", examples(
		"keys for both roles, then the context role (start kvxfer gen first, or after: either order works)",
		"kvxfer keygen --out ctx && kvxfer keygen --out gen",
		"", "kvxfer ctx --bind ipc:///tmp/ctx.sock --peer-endpoint ipc:///tmp/gen.sock --key ctx.key --peer-key gen.pub",
		"rank 1 of a TP2 context instance, peers found through etcd",
		"kvxfer ctx --bind tcp://10.0.0.1:5601 --key ctx1.key --discovery etcd://10.0.0.9:2379 --cluster prod --tp 2 --tp-rank 1",
	), func(ctx context.Context, o proc.Options, cmd *cobra.Command) error {
		rep, err := proc.RunCtx(ctx, o, cmd.OutOrStdout())
		if ctxRunFailed(rep) {
			err = withSummary(fmt.Errorf("ctx: %s%d failed, %d leaked blocks%s", runCause(rep, "gen"), rep.Failed, rep.LeakedBlocks, firstError(rep)), err)
		}
		return err
	}, "ctx", "gen")
}

// ctxRunFailed is whether kvxfer ctx exits non-zero after its run: a
// request failed, a block leaked, the run's settings differ from the
// generation process's (RunCtx names it: that process asked for requests
// past this one's --requests, which every request here succeeding does
// not show), or the generation process exited on an error it named.
func ctxRunFailed(rep proc.Report) bool {
	return rep.Failed > 0 || rep.LeakedBlocks > 0 || rep.SettingsMismatch != "" || rep.PeerReason != ""
}

func newGenCmd(a *app) *cobra.Command {
	return newRoleCmd(a, "gen", "Run the generation (decode) role as its own process and verify every byte", examples(
		"the generation side of kvxfer ctx's example, metrics on port 9465",
		"kvxfer gen --bind ipc:///tmp/gen.sock --peer-endpoint ipc:///tmp/ctx.sock --key gen.key --peer-key ctx.pub --metrics-addr 127.0.0.1:9465",
		"without CURVE (local tests only)", "kvxfer gen --insecure --bind tcp://127.0.0.1:5601 --peer-endpoint tcp://127.0.0.1:5600",
		"the generation side of a TP2 context, found through etcd", "kvxfer gen --bind tcp://10.0.0.2:5600 --key gen.key --discovery etcd://10.0.0.9:2379 --cluster prod --peer-tp 2",
	), func(ctx context.Context, o proc.Options, cmd *cobra.Command) error {
		// Unused here, but taken so that ctx's workload flags can be
		// given to gen unchanged: a value kvxfer ctx refuses at once is
		// refused here too, not after gen waited --timeout for a ctx that
		// never came.
		if cmd.Flags().Changed("chunk-tokens") {
			if err := o.CheckChunkTokens(); err != nil {
				return fmt.Errorf("%w (kvxfer ctx refuses it; gen takes it only so that ctx's workload flags can be given to gen unchanged)", err)
			}
		}
		rep, err := proc.RunGen(ctx, o, cmd.OutOrStdout())
		if rep.Failed > 0 || rep.LeakedBlocks > 0 || rep.Mismatches > 0 || rep.BytesVerified != rep.Bytes || rep.SettingsMismatch != "" || rep.PeerReason != "" {
			err = withSummary(fmt.Errorf("gen: %s%d failed, %d mismatched blocks, %d leaked blocks%s", runCause(rep, "ctx"), rep.Failed, rep.Mismatches, rep.LeakedBlocks, firstError(rep)), err)
		}
		return err
	}, "gen", "ctx")
}

// withSummary is a failed run's error: its summary first, then what
// the run itself returned (typically its close's: a pool that stays mapped
// because a frozen peer may still write into it), which alone hid the
// summary.
func withSummary(summary, err error) error {
	if err == nil {
		return summary
	}
	return fmt.Errorf("%w; then: %w", summary, err)
}

// runCause leads a failed run's message with what the report saw that
// explains its failures: the peer serving another model (refused at its
// Hello: every request failed for it), else the two roles' settings
// differing (the generation role's payload check), else this process's
// node failing, else the error the peer exited on (its goodbye named it),
// else the peer's death. The requests' own errors (cancelled, out of
// blocks, never sent) are their consequences, and the first of them alone
// misleads.
func runCause(rep proc.Report, peer string) string {
	switch {
	case rep.PeerModel != "":
		// Every request failed for it (the peer's Hello named another
		// model), and their errors name the two models but not the flag.
		return fmt.Sprintf("the %s process runs --model %s, this one --model %s: give both the same --model: ", peer, rep.PeerModel, rep.OwnModel)
	case rep.SettingsMismatch != "":
		return rep.SettingsMismatch + ": "
	case rep.NodeFailed != "":
		// Its own failure first: the peer, failing too (an etcd both
		// lost), would otherwise be blamed.
		return "this process's node failed: " + rep.NodeFailed + ": "
	case rep.PeerReason != "":
		return fmt.Sprintf("the %s process exited on an error it found, as its goodbye said: %s: ", peer, rep.PeerReason)
	case rep.PeerDownMidRun && rep.PeerClosed:
		// The counts too: a peer started with fewer --requests leaves
		// once its own are done, which from here is the same goodbye
		// (it never tells its count), and only they show it.
		return fmt.Sprintf("the %s process went down (it closed and said goodbye) before the run finished, after %d of this process's %d requests succeeded (a %s process given fewer --requests also leaves then: give both the same): ",
			peer, rep.OK, rep.Requests, peer)
	case rep.PeerDownMidRun:
		// No goodbye: killed, crashed or frozen, not a peer that ran
		// out of requests.
		return fmt.Sprintf("the %s process went down (it exited without a goodbye, missed its heartbeats or its etcd lease expired) before the run finished, after %d of this process's %d requests succeeded: ",
			peer, rep.OK, rep.Requests)
	}
	return ""
}

// firstError is ": " and the report's first request error, or "".
func firstError(rep proc.Report) string {
	if rep.FirstError == "" {
		return ""
	}
	return ": " + rep.FirstError
}

func newKeygenCmd() *cobra.Command {
	var (
		out   string
		force bool
	)
	cmd := &cobra.Command{
		Use:   "keygen [PREFIX]",
		Short: "Write a CURVE key pair: PREFIX.key (secret, mode 0600) and PREFIX.pub",
		Long: `Write a CURVE key pair: PREFIX.key, this engine's secret key (its --key, mode
0600), and PREFIX.pub, its public key (the peer's --peer-key). Each file
says in its header which key it holds (ZeroMQ certificate format), so a
public key given as --key is refused by name. An existing key file is not
overwritten unless --force: peers holding the old public key would no
longer admit the engine. --force writes the new pair beside the old one and
renames both into place once both are written, replacing a key file that
is a symbolic link (its target is left alone).`,
		Example: examples(
			"writes ctx.key and ctx.pub", "kvxfer keygen --out ctx",
			"the same", "kvxfer keygen ctx",
		),
		Args: func(_ *cobra.Command, args []string) error {
			// cobra.MaximumNArgs(1) said "accepts at most 1 arg(s),
			// received 2" to kvxfer keygen ctx gen.
			if len(args) > 1 {
				return fmt.Errorf("keygen %s: one prefix per run (kvxfer keygen PREFIX writes PREFIX.key and PREFIX.pub): kvxfer keygen %s && kvxfer keygen %s",
					strings.Join(args, " "), args[0], args[1])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if cmd.Flags().Changed("out") && out != args[0] {
					return fmt.Errorf("keygen %s --out %s: two prefixes, give one", args[0], out)
				}
				out = args[0]
			}
			flag := "--out"
			if len(args) == 1 {
				flag = "PREFIX"
			}
			if err := config.CheckKeyPrefix(out); err != nil {
				return fmt.Errorf("keygen %s: %w", flag, err)
			}
			// A prefix in a directory that is not there failed at the
			// write, as "key file: open DIR/ctx.key: no such file or
			// directory", naming neither the flag nor what to do.
			if dir := filepath.Dir(out); dir != "." {
				if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("keygen %s %s: directory %s does not exist: create it first (mkdir -p %s)", flag, out, dir, dir)
				}
			}
			pub, sec, err := zmq.GenerateKeys()
			if err != nil {
				return err
			}
			secPath, pubPath, err := config.WriteKeyPair(out, pub, sec, force)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (secret key) and %s (public key %s)\n", secPath, pubPath, pub)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "kvxfer", "path prefix of the key files (keys/ctx writes keys/ctx.key and keys/ctx.pub; not empty, not a directory)")
	cmd.Flags().BoolVar(&force, "force", false, "overwrite existing key files")
	return cmd
}

// runTwoProcesses is `kvxfer demo --processes 2`: it writes keys, spawns
// `kvxfer gen` and `kvxfer ctx` as separate processes over ipc endpoints
// and the demo's backend (shm or ucx), and fails unless both succeed.
func runTwoProcesses(ctx context.Context, a *app, cmd *cobra.Command, f demoFlags) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := scratchDir(a, "kvxfer-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, name := range []string{"ctx", "gen"} {
		pub, sec, err := zmq.GenerateKeys()
		if err != nil {
			return err
		}
		if _, _, err := config.WriteKeyPair(filepath.Join(dir, name), pub, sec, false); err != nil {
			return err
		}
	}
	common := roleArgs(a, f)
	metrics := map[string]string{"ctx": f.o.MetricsAddr, "gen": f.o.GenMetricsAddr}
	ep := func(n string) string { return "ipc://" + filepath.Join(dir, n+".sock") }
	role := func(name, peer string) *exec.Cmd {
		args := append([]string{name, "--bind", ep(name), "--peer-endpoint", ep(peer),
			"--key", filepath.Join(dir, name+".key"), "--peer-key", filepath.Join(dir, peer+".pub")}, common...)
		if name == "ctx" {
			args = append(args, ctxArgs(f)...)
		}
		if metrics[name] != "" {
			args = append(args, "--metrics-addr", metrics[name])
		}
		c := exec.CommandContext(ctx, self, args...)
		c.Stdout = cmd.OutOrStdout()
		c.Stderr = cmd.ErrOrStderr()
		interruptOnCancel(c)
		return c
	}
	gen, ctxp := role("gen", "ctx"), role("ctx", "gen")
	a.log.Info().Str("keys", dir).Str("backend", f.backend).Msg("kvxfer demo --processes 2: gen and ctx processes, CURVE")
	if err := startTied(gen); err != nil {
		return err
	}
	if err := startTied(ctxp); err != nil {
		_ = gen.Process.Signal(os.Interrupt)
		_ = gen.Wait()
		return err
	}
	cerr, gerr := ctxp.Wait(), gen.Wait()
	if cerr != nil || gerr != nil {
		return fmt.Errorf("two-process demo failed: ctx: %v, gen: %v", cerr, gerr)
	}
	fmt.Fprintln(cmd.OutOrStdout(), "OK: two processes, every byte verified on the generation side, 0 leaked blocks")
	return nil
}

// scratchDir makes the demo's private directory of keys and sockets
// (internal/scratch), first removing those of demos killed (SIGKILL)
// before their deferred RemoveAll ran, and says so.
func scratchDir(a *app, prefix string) (string, error) {
	dir, swept, err := scratch.Dir(prefix)
	if len(swept) > 0 {
		a.log.Info().Strs("removed", swept).Msg("removed the key directories of demos that were killed before they could")
	}
	return dir, err
}

// childDrain is how long a demo waits for a child process it interrupted
// (its context ended: Ctrl-C, SIGTERM, another child failed) to drain,
// print its report and remove its pool file before it kills it: longer
// than the child's own close deadline (proc's finish, 10 s).
const childDrain = 15 * time.Second

// childDump is how long before it is killed a child that has not
// drained is sent SIGQUIT: the Go runtime writes every goroutine's stack
// to its standard error (the demo's) and exits, so that a child stuck in
// its drain says where instead of vanishing under SIGKILL.
const childDump = 3 * time.Second

// interruptOnCancel makes the end of c's context interrupt the child
// (SIGINT, as Ctrl-C does) instead of killing it, which would leave its
// pool file in /dev/shm and no report; a child still running
// childDrain - childDump later dumps its goroutines (SIGQUIT), and one
// still running at childDrain is killed.
func interruptOnCancel(c *exec.Cmd) { interruptWithin(c, childDrain, childDump) }

// interruptWithin is interruptOnCancel with the drain limit and the dump's
// lead as arguments.
func interruptWithin(c *exec.Cmd, drain, dump time.Duration) {
	c.Cancel = func() error {
		time.AfterFunc(drain-dump, func() {
			// After the child's exit this does nothing: os.Process holds
			// a pidfd, never a pid another process may have reused.
			if c.Process.Signal(syscall.Signal(0)) == nil {
				w := c.Stderr
				if w == nil {
					w = os.Stderr
				}
				fmt.Fprintf(w, "kvxfer demo: %s (pid %d) has not drained %v after the interrupt: its goroutines follow (SIGQUIT)\n",
					c.Args[1], c.Process.Pid, drain-dump)
				_ = c.Process.Signal(syscall.SIGQUIT)
			}
		})
		return c.Process.Signal(os.Interrupt)
	}
	c.WaitDelay = drain
	// The child is in the terminal's process group: a Ctrl-C reaches it
	// as well as the SIGINT above. It drains on both; the demo's own
	// second signal ends the demo at once, and the child with it.
	if c.Env == nil {
		c.Env = os.Environ()
	}
	c.Env = append(c.Env, demoChildEnv+"=1")
	atForceExit(func() {
		if c.Process != nil {
			_ = c.Process.Kill()
		}
	})
}

// startTied starts a demo's child so that it is sent SIGTERM (and
// drains, as on Ctrl-C) if the demo dies without interrupting it: a
// demo killed by SIGKILL (or the OOM killer) left its kvxfer ctx and gen
// running on their own, for all their requests, each with its pool in
// /dev/shm, and the demo's key directory behind. The kernel sends the
// signal when the thread that forked the child ends, not only the
// process: the child is started from a goroutine locked to its thread,
// which stays locked (and the thread alive) until the child has exited.
func startTied(c *exec.Cmd) error {
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.SysProcAttr.Pdeathsig = syscall.SIGTERM
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := c.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		// Until the child exits, without reaping it (c.Wait does): a
		// child already reaped ends this at once (ECHILD).
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, c.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return <-started
}

// roleArgs are the flags demo --processes 2 and demo --cluster give both
// kvxfer ctx and kvxfer gen: the demo's options, as the user set them.
func roleArgs(a *app, f demoFlags) []string {
	args := []string{"--model", f.o.Model, "--requests", strconv.Itoa(f.o.Requests),
		"--min-tokens", strconv.Itoa(f.o.MinTokens), "--max-tokens", strconv.Itoa(f.o.MaxTokens),
		"--chunk-tokens", strconv.Itoa(f.o.ChunkTokens), "--compute", f.o.Compute.String(),
		"--concurrency", strconv.Itoa(f.o.Concurrency), "--workers", strconv.Itoa(f.o.Workers),
		"--seed", strconv.FormatUint(f.o.Seed, 10), "--pool", f.pool, "--timeout", f.timeout,
		"--log-level", a.log.GetLevel().String(), "--backend", f.backend}
	if f.o.TokensPerBlock > 0 {
		args = append(args, "--tokens-per-block", strconv.Itoa(f.o.TokensPerBlock))
	}
	return args
}

// ctxArgs are the flags those demos give kvxfer ctx only.
func ctxArgs(f demoFlags) []string {
	return []string{"--layer-parts", strconv.Itoa(f.o.LayerParts)}
}

// notAcrossProcesses names the demo flags that demo --processes 2 and demo
// --cluster do not carry to their processes: set there, they are refused,
// not ignored.
var notAcrossProcesses = map[string]string{
	"prefill-devices": "each kvxfer ctx process computes every request's chunks on a device of its own",
	"json":            "each process prints its own JSON report line",
	"trace":           "each kvxfer ctx and gen process takes its own --trace file",
	"trace-max-bytes": "each kvxfer ctx and gen process takes its own --trace file and bound",
	"trace-keep":      "each kvxfer ctx and gen process takes its own --trace file and rotation",
}
