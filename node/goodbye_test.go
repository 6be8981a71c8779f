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
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestGracefulCloseSaysGoodbye: in static membership (no etcd, so no
// lease revoke tells anyone), a context node that closes gracefully says
// goodbye on its control link, and the generation node takes ctx/0 down
// at once: a Receive waiting for ctx/0 fails naming it and its close
// (ErrPeerGone, "ctx/0 closed (it said goodbye)"), OnPeerDown is called,
// the link's Hello says it closed, and the request's blocks are released
// (its RequestData provably never left: nothing waits for a proof).
// Heartbeats here would take 100 s (200 misses of 500 ms) to call ctx/0
// down and the request's deadline is further still, so within the test's
// wait only the goodbye can fail the request. (Checked to fail: without
// the goodbye the request does not end within the wait.)
//
// The generation node is given an endpoint for ctx/0 where nothing
// listens: ctx/0 reaches it (its Hello, its heartbeats and its goodbye
// come on ctx/0's own connection), but the request's RequestData cannot
// leave. Else it might reach ctx/0 as it closes, unread, and the
// request's blocks would wait for ctx/0's proof (its drained goodbye:
// TestDrainedGoodbyeReleasesUnreadRequests).
func TestGracefulCloseSaysGoodbye(t *testing.T) {
	cc, gc := pair(t, shm.Backend)
	gc.Peers[0].Endpoint = "ipc://" + filepath.Join(t.TempDir(), "nobody.sock")
	for _, c := range []*node.Config{&cc, &gc} {
		c.HeartbeatMisses = 200
		c.TransferTimeout = node.Duration(10 * time.Minute)
	}
	var down atomic.Value
	gc.OnPeerDown = func(instance string, rank int) {
		if instance == "ctx" && rank == 0 {
			down.Store(true)
		}
	}
	genN := open(t, gc)
	ctxN, err := node.Open(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	ctx0, gen0 := messages.PeerID{Instance: "ctx"}, messages.PeerID{Instance: "gen"}
	waitFor(t, patience, "ctx/0's Hello at gen/0 and its connection to gen/0 up", func() bool {
		_, err := genN.LinkHello(ctx0)
		st, serr := ctxN.PeerState(gen0)
		return err == nil && serr == nil && st.Conn == zmq.ConnUp
	})
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "bye", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctxN.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-rx.Done():
		if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) || !strings.Contains(o.Err.Error(), "ctx/0 closed (it said goodbye)") {
			t.Fatalf("request from a writer that closed: %s: %v; want FAILED with ErrPeerGone naming ctx/0 and its goodbye", o.Status, o.Err)
		}
		if strings.Contains(o.Err.Error(), "missed its heartbeats") {
			t.Fatalf("request failed with %v; want the goodbye, not missed heartbeats", o.Err)
		}
	case <-time.After(patience):
		t.Fatalf("the request from ctx/0 did not end within %v of its Close (heartbeats would take 100 s): no goodbye", patience)
	}
	waitFor(t, patience, "OnPeerDown(ctx/0)", func() bool { return down.Load() != nil })
	_, err = genN.LinkHello(ctx0)
	if !errors.Is(err, control.ErrPeerGone) || !strings.Contains(err.Error(), "ctx/0 closed (it said goodbye)") {
		t.Fatalf("link's Hello(ctx/0) after its goodbye: %v; want ErrPeerGone saying it closed", err)
	}
	select {
	case <-rx.Released():
	case <-time.After(patience):
		t.Fatal("the request's blocks were not released (its RequestData never left: no proof is due)")
	}
}
