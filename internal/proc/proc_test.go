package proc

import (
	"context"
	"io"
	"strings"
	"testing"

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
