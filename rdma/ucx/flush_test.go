//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// A Flush dispatched while failLink has marked the link failed but not
// yet its endpoints (Post already refuses then, through link.acquire)
// reports the peer gone; after a clean Bye (the link left) it reports
// nothing lost. TestCrossProcessPeerKilled met the first window once
// under load: Post refused, then Flush said nil.
func TestFlushWhileTheLinkFails(t *testing.T) {
	for _, c := range []struct {
		name    string
		state   linkState
		wantErr error
	}{
		{"link failed, endpoint not yet", linkFailed, rdma.ErrPeerGone},
		{"peer left cleanly", linkLeft, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLink(address{}, "test link")
			e := &endpoint{name: "test endpoint", link: l, wake: make(chan struct{}, 1)}
			var got []error
			e.Flush(func(err error) { got = append(got, err) })
			l.setState(c.state, errors.New("the peer is unreachable"))
			if err := l.acquire(0); !errors.Is(err, rdma.ErrPeerGone) {
				t.Fatalf("link.acquire (as Post) = %v, want ErrPeerGone", err)
			}
			var run []*entry
			if n, _, _ := e.dispatchReady(&run); n != 1 || len(got) != 1 {
				t.Fatalf("dispatched %d entries, %d Flush callbacks; want 1 and 1", n, len(got))
			}
			if c.wantErr == nil && got[0] != nil || c.wantErr != nil && !errors.Is(got[0], c.wantErr) {
				t.Fatalf("Flush(%v), want %v", got[0], c.wantErr)
			}
		})
	}
}
