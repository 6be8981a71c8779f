package node_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestMechanismMismatchNamedAfterTheWait: gen is insecure, ctx uses
// CURVE. Against a peer of the other mechanism libzmq reports, attempt by
// attempt, either the mismatch or only that the peer hung up; here the
// link's state of ctx/0 says "hung up" when WaitPeers first finds the
// failed handshake and the mismatch once WaitPeers has begun to wait for
// its own refusals (awaitOurRefusals): the order a new user saw. The
// error names the mismatch, not the hang-up. (The states are driven
// through peerStateHook: which one libzmq reports first is chance.)
// Checked to fail without the second look after the wait: the error
// named the hang-up.
func TestMechanismMismatchNamedAfterTheWait(t *testing.T) {
	cc, gc := pair(t, shm.Backend)
	insecure(&gc)
	waiting := driveMismatchReason(t)
	genN := open(t, gc)
	open(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	err := genN.WaitPeers(ctx)
	if !errors.Is(err, node.ErrHandshake) || !strings.Contains(err.Error(), "ctx/0 at "+cc.Bind) ||
		!strings.Contains(err.Error(), mismatch) || strings.Contains(err.Error(), "hung up") ||
		zmq.CauseOf(err) != zmq.CauseMechanismMismatch {
		t.Fatalf("WaitPeers = %v, want ErrHandshake naming ctx/0 at %s and %q, not the hang-up", err, cc.Bind, mismatch)
	}
	if !waiting.Load() {
		t.Fatal("WaitPeers returned ErrHandshake without waiting for its refusals")
	}
}

// TestMechanismMismatchEndsTheRefusalsWait: on a security mechanism
// mismatch no refusal of ours can come (the peer's handshakes with our
// listener fail at the greeting, before any key is judged; an insecure
// link has no ZAP handler at all) and the peer learns of the mismatch on
// its own dial: WaitPeers' wait for its refusals ends as soon as the
// link names the mismatch, and the error names it. As in
// TestMechanismMismatchNamedAfterTheWait the link's reason is driven
// (a hang-up, then the mismatch once the wait began); the heartbeat
// interval is an hour, so a wait bounded only by 3 heartbeat intervals
// would not end within the test's patience. (Checked to fail without
// the mismatch ending the wait: still waiting at the deadline.)
func TestMechanismMismatchEndsTheRefusalsWait(t *testing.T) {
	cc, gc := pair(t, shm.Backend)
	insecure(&gc)
	for _, c := range []*node.Config{&cc, &gc} {
		c.HeartbeatInterval = node.Duration(time.Hour)
	}
	waiting := driveMismatchReason(t)
	genN := open(t, gc)
	open(t, cc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- genN.WaitPeers(ctx) }()
	select {
	case err := <-errc:
		if !errors.Is(err, node.ErrHandshake) || !strings.Contains(err.Error(), mismatch) {
			t.Fatalf("WaitPeers = %v, want ErrHandshake naming %q", err, mismatch)
		}
	case <-time.After(patience):
		t.Fatalf("WaitPeers still waiting %v after the link named the mismatch (3 heartbeat intervals are 3h)", patience)
	}
	if !waiting.Load() {
		t.Fatal("WaitPeers returned ErrHandshake without waiting for its refusals")
	}
}

// The driven reasons are worded unlike control/zmq's: node decides by
// their zmq.Cause, not their words. The hang-up's starts as the link's
// mismatch did and the mismatch's names no "security mechanism mismatch"
// at all; node's former prefix checks took the hang-up for the mismatch
// (checked: both tests then fail, the error naming the hang-up).
const (
	hungUp   = "security mechanism mismatch, a wrong server key or no kvxfer engine: what listens there hung up during the handshake (broken pipe)"
	mismatch = "we are insecure and the peer uses CURVE: the two mechanisms differ"
)

// driveMismatchReason makes the link's state of ctx/0's failed handshake
// the hang-up (zmq.CauseHungUp) until WaitPeers waits for its refusals,
// and the mechanism mismatch (zmq.CauseMechanismMismatch) from then on;
// the flag says whether that wait began.
func driveMismatchReason(t *testing.T) *atomic.Bool {
	ctx0 := messages.PeerID{Instance: "ctx"}
	var waiting atomic.Bool
	node.SetAwaitHook(func(what string, id messages.PeerID) {
		if what == "refusals" && id == ctx0 {
			waiting.Store(true)
		}
	})
	node.SetPeerStateHook(func(id messages.PeerID, st zmq.PeerState, err error) (zmq.PeerState, error) {
		if id != ctx0 || err != nil || st.Conn != zmq.ConnHandshakeFailed {
			return st, err
		}
		st.Reason, st.Cause = hungUp, zmq.CauseHungUp
		if waiting.Load() {
			st.Reason, st.Cause = mismatch, zmq.CauseMechanismMismatch
		}
		return st, nil
	})
	t.Cleanup(func() { node.SetPeerStateHook(nil); node.SetAwaitHook(nil) })
	return &waiting
}
