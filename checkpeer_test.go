package kvxfer_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestCheckPeerNamesABackendMismatch: a peer on another data-plane backend
// is named as such when its Hello arrives — not later, per request, as an
// address this backend cannot parse ("bad peer address: UCA2…").
func TestCheckPeerNamesABackendMismatch(t *testing.T) {
	c := startCluster(t, smallLayout(), kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	ce, ge := c.ctx[0], c.gen[0]
	if err := ce.CheckPeer(ge.Hello()); err != nil {
		t.Fatalf("same layout, same backend: %v", err)
	}
	h := *ge.Hello()
	h.Backend = "faulty(" + h.Backend + ")" // a wrapper of the same backend
	if err := ce.CheckPeer(&h); err != nil {
		t.Fatalf("a wrapped backend of the same kind: %v", err)
	}
	h.Backend = "ucx"
	err := ce.CheckPeer(&h)
	if !errors.Is(err, kvxfer.ErrMismatch) || !strings.Contains(err.Error(), `"ucx"`) || !strings.Contains(err.Error(), `"loopback"`) {
		t.Fatalf("a peer on ucx, this rank on loopback: %v, want ErrMismatch naming both backends", err)
	}
}
