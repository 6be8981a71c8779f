package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestMismatchWaitEndsAtPeersGoodbye: ctx and gen serve different models;
// ctx's connection to gen never comes up (it holds an endpoint where
// nothing listens), so after it finds the mismatch in gen's Hello its
// WaitPeers waits for its own Hello to leave (awaitOurHello). gen then
// closes, saying goodbye: nobody is left to tell, and the wait ends
// there, WaitPeers returning the mismatch. The heartbeat interval is an
// hour, so a wait bounded only by heartbeat intervals (3 of them) would
// not end within the test's patience. (Checked to fail without the
// goodbye ending the wait: WaitPeers was still waiting at the deadline.)
func TestMismatchWaitEndsAtPeersGoodbye(t *testing.T) {
	cc, gc := pair(t, shm.Backend)
	cc.Peers[0].Endpoint = "ipc://" + filepath.Join(t.TempDir(), "nobody.sock")
	other := tiny()
	other.Name = "other"
	gc.Layout = other
	for _, c := range []*node.Config{&cc, &gc} {
		c.HeartbeatInterval = node.Duration(time.Hour)
	}
	gen0 := messages.PeerID{Instance: "gen"}
	waiting := make(chan struct{})
	var once atomic.Bool
	node.SetAwaitHook(func(what string, id messages.PeerID) {
		if what == "hello" && id == gen0 && once.CompareAndSwap(false, true) {
			close(waiting)
		}
	})
	t.Cleanup(func() { node.SetAwaitHook(nil) })
	ctxN := open(t, cc)
	genN, err := node.Open(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- ctxN.WaitPeers(ctx) }()
	select {
	case <-waiting:
	case err := <-errc:
		t.Fatalf("WaitPeers returned before it waited for its Hello to leave: %v", err)
	case <-time.After(patience):
		t.Fatalf("ctx's WaitPeers did not find the mismatch within %v", patience)
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), patience)
	if err := genN.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	cancelClose()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "gen/0 at "+cc.Peers[0].Endpoint) || !strings.Contains(err.Error(), `serves model "other"`) {
			t.Fatalf("WaitPeers = %v, want the mismatch naming gen/0 at %s and its model", err, cc.Peers[0].Endpoint)
		}
	case <-time.After(patience):
		t.Fatalf("WaitPeers still waiting %v after gen/0 said goodbye (3 heartbeat intervals are 3h)", patience)
	}
	if _, err := ctxN.LinkHello(gen0); !errors.Is(err, zmq.ErrPeerClosed) {
		t.Fatalf("ctx's link Hello of gen/0 = %v, want it closed (it said goodbye)", err)
	}
}
