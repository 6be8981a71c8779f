//go:build cgo && linux && !kvxfer_noucx

package ucx_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// TestIdentityTooLongIsRefused: an agent's identity travels in its hello,
// which a peer drops as malformed when the identity is longer than 256
// bytes (and whose length field wraps past 65535): every Connect between
// two such agents then timed out as if the peer were not running. New
// refuses it instead, naming its length, as cudaipc.New does.
func TestIdentityTooLongIsRefused(t *testing.T) {
	ok := strings.Repeat("i", 256)
	a, err := ucx.New(ucx.WithIdentity(ok))
	if err != nil {
		t.Fatalf("New with a %d-byte identity: %v", len(ok), err)
	}
	defer a.Close()
	b, err := ucx.New(ucx.WithIdentity(ok))
	if err != nil {
		t.Fatalf("New with a %d-byte identity: %v", len(ok), err)
	}
	defer b.Close()
	ep, err := a.Connect(b.Address())
	if err != nil {
		t.Fatalf("Connect between agents with %d-byte identities: %v", len(ok), err)
	}
	ep.Close()

	for _, n := range []int{257, 1 << 16} {
		long := strings.Repeat("i", n)
		a, err := ucx.New(ucx.WithIdentity(long), ucx.WithHandshakeTimeout(500*time.Millisecond))
		if err == nil {
			b, berr := ucx.New(ucx.WithIdentity(long))
			if berr == nil {
				_, cerr := a.Connect(b.Address())
				t.Errorf("New with a %d-byte identity succeeded; Connect between two such agents: %v", n, cerr)
				b.Close()
			}
			a.Close()
			continue
		}
		if !strings.Contains(err.Error(), "identity") || !strings.Contains(err.Error(), "256") {
			t.Errorf("New with a %d-byte identity: %v, want an error naming the identity and its bound", n, err)
		}
	}
}
