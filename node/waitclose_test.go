package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestCloseEndsWaitPeersMismatchWait: Close, called while WaitPeers,
// having found a mistake, waits for the peer to learn of it too, ends
// that wait at once (as it ends WaitPeers' wait for a Hello), and
// WaitPeers' error wraps kvxfer.ErrClosed as well as the mistake found.
// "refusals": gen holds a wrong key for ctx, so it refuses ctx's key,
// and its own handshakes with ctx (made with that wrong key as ctx's
// server key) fail before ctx's ZAP handler sees them: the refusals ctx
// waits for never come. "hello": gen
// serves another model and ctx's connection to it can never come up
// (its endpoint for gen is one where nothing listens). The heartbeat
// interval is an hour, so a wait bounded only by 3 heartbeat intervals
// would not end within the test's patience. (Checked to fail without
// the waits watching Close: "refusals" still waited at the deadline;
// "hello" returned the mismatch without ErrClosed.)
func TestCloseEndsWaitPeersMismatchWait(t *testing.T) {
	ctx0, gen0 := messages.PeerID{Instance: "ctx"}, messages.PeerID{Instance: "gen"}
	for _, c := range []struct {
		what   string
		waiter messages.PeerID // whose WaitPeers waits
		setup  func(cc, gc *node.Config)
		want   error
	}{
		{"refusals", ctx0, func(cc, gc *node.Config) { gc.Peers[0].PublicKey = newKeys(t).public }, node.ErrHandshake},
		{"hello", ctx0, func(cc, gc *node.Config) {
			cc.Peers[0].Endpoint = "ipc://" + filepath.Join(t.TempDir(), "nobody.sock")
			other := tiny()
			other.Name = "other"
			gc.Layout = other
		}, kvxfer.ErrMismatch},
	} {
		t.Run(c.what, func(t *testing.T) {
			cc, gc := pair(t, shm.Backend)
			c.setup(&cc, &gc)
			for _, cfg := range []*node.Config{&cc, &gc} {
				cfg.HeartbeatInterval = node.Duration(time.Hour)
			}
			// The waiting node's peer: the other one.
			peer, wcfg, ocfg := ctx0, gc, cc
			if c.waiter == ctx0 {
				peer, wcfg, ocfg = gen0, cc, gc
			}
			waiting := make(chan struct{})
			var once atomic.Bool
			node.SetAwaitHook(func(what string, id messages.PeerID) {
				if what == c.what && id == peer && once.CompareAndSwap(false, true) {
					close(waiting)
				}
			})
			t.Cleanup(func() { node.SetAwaitHook(nil) })
			w, err := node.Open(context.Background(), wcfg)
			if err != nil {
				t.Fatal(err)
			}
			open(t, ocfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- w.WaitPeers(ctx) }()
			select {
			case <-waiting:
			case err := <-errc:
				t.Fatalf("WaitPeers returned before its %s wait: %v", c.what, err)
			case <-time.After(patience):
				t.Fatalf("WaitPeers did not begin its %s wait within %v", c.what, patience)
			}
			closeCtx, cancelClose := context.WithTimeout(context.Background(), patience)
			defer cancelClose()
			closed := make(chan error, 1)
			go func() { closed <- w.Close(closeCtx) }()
			select {
			case err := <-errc:
				if !errors.Is(err, kvxfer.ErrClosed) || !errors.Is(err, c.want) || !strings.Contains(err.Error(), peer.String()) {
					t.Fatalf("WaitPeers = %v, want kvxfer.ErrClosed and %v naming %s", err, c.want, peer)
				}
			case <-time.After(patience):
				t.Fatalf("WaitPeers still waiting %v after Close began (3 heartbeat intervals are 3h)", patience)
			}
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
		})
	}
}
