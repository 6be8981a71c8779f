package proc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// TestUnusableUCXSaysWhatElse: when UCX cannot start (no usable
// transport), the role fails at once with UCX's reason and the way out.
func TestUnusableUCXSaysWhatElse(t *testing.T) {
	if !ucx.Available {
		t.Skip("built without the ucx backend")
	}
	t.Setenv("UCX_TLS", "no-such-transport")
	o := Options{Instance: "gen", Peer: "ctx", Bind: "ipc:///nonexistent/gen", PeerEndpoint: "ipc:///nonexistent/ctx",
		Insecure: true, Backend: ucx.Backend, Model: "Llama-3.1-8B", Requests: 1, MinTokens: 1, MaxTokens: 1, Concurrency: 1}
	_, err := RunGen(context.Background(), o, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no-such-transport") || !strings.Contains(err.Error(), `"shm" runs without UCX`) {
		t.Fatalf("RunGen with an unusable UCX: %v; want UCX's reason and the shm way out", err)
	}
}

func TestBackendRefused(t *testing.T) {
	o := Options{Insecure: true, Backend: "carrier-pigeon", Requests: 1, MinTokens: 1, MaxTokens: 1, Concurrency: 1}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), `"carrier-pigeon"`) {
		t.Fatalf("validate: %v, want an error naming the backend", err)
	}
	// A GPU is cudaipc's: a device ordinal is refused negative, or with
	// another backend, and reaches the node's config.
	o.Backend, o.Device = "cudaipc", -1
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--device = -1") {
		t.Fatalf("validate: %v, want an error naming --device", err)
	}
	o.Backend, o.Device = "shm", 1
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--device = 1") || !strings.Contains(err.Error(), `"shm"`) {
		t.Fatalf("validate: %v, want an error naming --device and the backend", err)
	}
	o.Backend, o.PeerEndpoint, o.Bind = "cudaipc", "ipc:///x", "ipc:///y"
	if err := o.validate(); err != nil {
		t.Fatalf("validate cudaipc on device 1: %v", err)
	}
	if c := o.nodeConfig(false, func() {}); c.Backend != "cudaipc" || c.Device != 1 {
		t.Fatalf("node config: backend %q device %d, want cudaipc on device 1", c.Backend, c.Device)
	}
}

// TestDiscoveryOptionsRefused: etcd discovery needs a cluster; more than
// one rank per instance needs etcd; a pinned peer key names one rank.
func TestDiscoveryOptionsRefused(t *testing.T) {
	base := Options{Insecure: true, Requests: 1, MinTokens: 1, MaxTokens: 1, Concurrency: 1}
	for _, c := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Discovery = "etcd://127.0.0.1:2379" }, `--discovery = "etcd://127.0.0.1:2379" needs --cluster`},
		{func(o *Options) { o.Parallel = node.Parallel{TP: 2, PP: 1} }, "--tp = 2, --pp = 1, --peer-tp = 1, --peer-pp = 1: more than one rank per instance needs --discovery"},
		{func(o *Options) { o.Parallel = node.Parallel{TP: 0, PP: 1} }, "--tp = 0: must be ≥ 1"},
		{func(o *Options) { o.PeerParallel = node.Parallel{TP: -1, PP: 1} }, "--peer-tp = -1: must be ≥ 1"},
		{func(o *Options) {
			o.Discovery, o.Cluster, o.PeerPublicKey, o.PeerParallel = "etcd://127.0.0.1:2379", "c", "k", node.Parallel{TP: 2, PP: 1}
		}, "--peer-key pins one peer rank, but --peer-tp = 2"},
	} {
		o := base
		c.edit(&o)
		if err := o.validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("validate: %v, want an error containing %q", err, c.want)
		}
	}
	o := base
	o.Discovery, o.Cluster, o.Peer, o.PeerParallel = "etcd://127.0.0.1:2379", "c", "ctx", node.Parallel{TP: 2, PP: 1}
	if err := o.validate(); err != nil {
		t.Fatalf("etcd with a TP2 peer: %v", err)
	}
	if ps := o.peers(); len(ps) != 2 || ps[1].Rank.TP != 1 || ps[1].Endpoint != "" || ps[1].Parallel.TP != 2 {
		t.Fatalf("peers of a TP2 peer instance through etcd: %+v", ps)
	}
	// TLS and auth to etcd reach the node's config.
	o.Discovery, o.DiscoveryCA, o.DiscoveryCert, o.DiscoveryKey = "etcds://127.0.0.1:2379", "ca", "cert", "key"
	o.DiscoveryUser, o.DiscoveryPasswordFile = "u", "pw"
	if c := o.nodeConfig(false, nil); c.Discovery != o.Discovery || c.DiscoveryCA != "ca" || c.DiscoveryCert != "cert" ||
		c.DiscoveryKey != "key" || c.DiscoveryUser != "u" || c.DiscoveryPasswordFile != "pw" {
		t.Fatalf("node config of etcds:// with TLS and auth: %+v", c)
	}
}

// TestLayerPartsRefused: more layer parts than the model has layers, or
// fewer than 0, are named before anything opens; up to the layers pass.
func TestLayerPartsRefused(t *testing.T) {
	tiny := kvcache.Layout{Name: "tiny", Layers: 2, KVHeads: 1, HeadDim: 1, DTypeBytes: 1, TokensPerBlock: 1,
		Groups: kvcache.FullAttention(2)}
	for _, c := range []struct {
		o    Options
		want string // "" passes
	}{
		{Options{Model: "Llama-3.1-8B", LayerParts: 33}, "--layer-parts = 33: Llama-3.1-8B has 32 layers"},
		{Options{Model: "Llama-3.1-8B", LayerParts: 32}, ""},
		{Options{Model: "Llama-3.1-8B"}, ""},
		{Options{Layout: &tiny, LayerParts: 3}, "--layer-parts = 3: tiny has 2 layers"},
		{Options{Model: "no-such-model", LayerParts: 3}, ""}, // the engine names the model
	} {
		err := c.o.checkLayerParts()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%q %d parts: %v, want %q", c.o.Model, c.o.LayerParts, err, c.want)
		}
	}
	o := Options{Requests: 1, MinTokens: 1, MaxTokens: 1, Concurrency: 1, LayerParts: -1}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--layer-parts = -1") {
		t.Errorf("-1 parts: %v", err)
	}
}

// TestWriterLease: --writer-lease reaches the node's config; a negative
// lease, or one shorter than two heartbeat intervals (it would lapse
// between a live peer's heartbeats), is named before anything opens.
func TestWriterLease(t *testing.T) {
	base := Options{Requests: 1, MinTokens: 1, MaxTokens: 1, Concurrency: 1, Heartbeat: time.Second, Insecure: true,
		Bind: "tcp://127.0.0.1:0", PeerEndpoint: "tcp://127.0.0.1:1"}
	for _, c := range []struct {
		lease time.Duration
		want  string // "" passes
	}{
		{0, ""},
		{3 * time.Second, ""},
		{2 * time.Second, ""},
		{-time.Second, "--writer-lease = -1s: must be ≥ 0"},
		{1500 * time.Millisecond, "--writer-lease = 1.5s: shorter than two --heartbeat intervals (2s)"},
	} {
		o := base
		o.WriterLease = c.lease
		err := o.validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("lease %v: %v, want %q", c.lease, err, c.want)
		}
	}
	o := base
	o.WriterLease = 3 * time.Second
	if got := o.nodeConfig(false, func() {}).WriterLease; time.Duration(got) != 3*time.Second {
		t.Fatalf("node config's WriterLease %v, want 3s", time.Duration(got))
	}
}

// TestProofWait: a role whose peer went down waits for the proof as long
// as Options.ProofWait says, or by default as long as the missed
// heartbeats took (1 to 5 s); a negative wait is named before anything
// opens.
func TestProofWait(t *testing.T) {
	base := Options{Requests: 1, MinTokens: 1, MaxTokens: 1, Concurrency: 1, Heartbeat: time.Second, Insecure: true,
		Bind: "tcp://127.0.0.1:0", PeerEndpoint: "tcp://127.0.0.1:1"}
	for _, c := range []struct {
		hb     time.Duration
		misses int
		wait   time.Duration
		want   time.Duration
	}{
		{200 * time.Millisecond, 3, 0, time.Second},
		{time.Second, 3, 0, 3 * time.Second},
		{time.Second, 60, 0, 5 * time.Second},
		{time.Second, 60, time.Minute, time.Minute},
		{time.Second, 3, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		o := base
		o.Heartbeat, o.HeartbeatMisses, o.ProofWait = c.hb, c.misses, c.wait
		if err := o.validate(); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if got := o.proofWait(); got != c.want {
			t.Errorf("heartbeat %v × %d, ProofWait %v: waits %v, want %v", c.hb, c.misses, c.wait, got, c.want)
		}
	}
	o := base
	o.ProofWait = -time.Second
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "ProofWait = -1s: must be ≥ 0") {
		t.Fatalf("ProofWait -1s: %v", err)
	}
}

// TestOnlyNotWithdrawn: a role's close error that is nothing but etcd's
// record not withdrawn (etcd gone at the end) leaves the run's outcome as
// it was, a warning; any other close error still fails it.
func TestOnlyNotWithdrawn(t *testing.T) {
	nw := fmt.Errorf("%w: %v", discovery.ErrNotWithdrawn, errors.New("context deadline exceeded"))
	other := errors.New("deregister registration 1: region busy")
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{other, false},
		{nw, true},
		{errors.Join(nw, nil), true},
		{errors.Join(nw, other), false},
		{errors.Join(other), false},
	} {
		if got := onlyNotWithdrawn(c.err); got != c.want {
			t.Errorf("onlyNotWithdrawn(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestSleepCtxEndsWithItsContext: the roles' simulated compute and pauses
// end when the run's context does (a signal's drain does not wait an hour
// of --compute out), and last their time otherwise.
func TestSleepCtxEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() {
		sleepCtx(ctx, time.Hour)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("sleepCtx of an hour with its context ended did not return")
	}
	start := time.Now()
	sleepCtx(context.Background(), 20*time.Millisecond)
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("sleepCtx(20ms) returned after %v", d)
	}
}

// TestChunkTokensRefused: a chunk size that is not a multiple of the
// block size (the preset's, or --tokens-per-block) is named before
// anything opens. (Checked to fail without CheckChunkTokens: RunCtx
// connected and failed each request with "kvcache: misaligned chunk".)
func TestChunkTokensRefused(t *testing.T) {
	tiny := kvcache.Layout{Name: "tiny", Layers: 2, KVHeads: 1, HeadDim: 1, DTypeBytes: 1, TokensPerBlock: 4,
		Groups: kvcache.FullAttention(2)}
	for _, c := range []struct {
		o    Options
		want string // "" passes
	}{
		{Options{Model: "Llama-3.1-8B", ChunkTokens: 100}, "--chunk-tokens = 100: want a multiple of the block size, 32 tokens"},
		{Options{Model: "Llama-3.1-8B", ChunkTokens: 512}, ""},
		{Options{Model: "Llama-3.1-8B", ChunkTokens: 512, TokensPerBlock: 48}, "--chunk-tokens = 512: want a multiple of the block size, 48 tokens"},
		{Options{Model: "Llama-3.1-8B", ChunkTokens: 96, TokensPerBlock: 48}, ""},
		{Options{Layout: &tiny, ChunkTokens: 6}, "--chunk-tokens = 6: want a multiple of the block size, 4 tokens"},
		{Options{Model: "no-such-model", ChunkTokens: 7}, ""}, // the engine names the model
		{Options{Model: "Llama-3.1-8B", ChunkTokens: 0}, "--chunk-tokens = 0: must be ≥ 1"},
	} {
		err := c.o.CheckChunkTokens()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%q %d tokens, blocks of %d: %v, want %q", c.o.Model, c.o.ChunkTokens, c.o.TokensPerBlock, err, c.want)
		}
	}
}

// TestRequestsBounded: --requests past MaxRequests is named by validate,
// before anything opens. (Checked to fail without the bound.)
func TestRequestsBounded(t *testing.T) {
	o := Options{Requests: MaxRequests + 1, MinTokens: 1, MaxTokens: 1, Concurrency: 1}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--requests = %d: at most %d", MaxRequests+1, MaxRequests)) {
		t.Errorf("%d requests: %v", o.Requests, err)
	}
	o.Requests = MaxRequests
	if err := o.validate(); err != nil && strings.Contains(err.Error(), "--requests") {
		t.Errorf("%d requests: %v", o.Requests, err)
	}
}
