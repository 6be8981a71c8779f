package proc

import (
	"context"
	"io"
	"strings"
	"testing"

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
		{func(o *Options) { o.Parallel = node.Parallel{TP: 2, PP: 1} }, "--tp = 2, --peer-tp = 1: more than one rank per instance needs --discovery"},
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
}
