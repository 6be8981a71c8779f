package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// refusingLink wraps a Link: while refuse is set, its connections refuse
// every SUCCESS Result (as a control plane does whose peer cannot be
// dialled or whose backlog is full) — or, with panics set, panic inside
// Send (a bug of the control plane: the worker crashes mid-send); every
// other frame goes through.
type refusingLink struct {
	control.Link
	refuse  atomic.Bool
	panics  bool
	refused atomic.Int64
}

func (l *refusingLink) Dial(peer messages.PeerID) (control.Conn, error) {
	c, err := l.Link.Dial(peer)
	if err != nil {
		return nil, err
	}
	return &refusingConn{Conn: c, l: l, peer: peer}, nil
}

type refusingConn struct {
	control.Conn
	l    *refusingLink
	peer messages.PeerID
}

func (c *refusingConn) Send(f messages.Frame) error {
	if r, ok := f.(*messages.Result); ok && r.Status == messages.StatusSuccess && c.l.refuse.Load() {
		c.l.refused.Add(1)
		if c.l.panics {
			panic("control plane: injected panic in Send")
		}
		return fmt.Errorf("%w: dial %s: connection refused", control.ErrPeerGone, c.peer)
	}
	return c.Conn.Send(f)
}

// TestResultUnsentFailsTheRequest: a context rank whose SUCCESS Result the
// control plane refuses does not report DONE — its outcome is FAILED,
// naming the frame, the peer and why (ErrFrameUnsent, and ErrPeerGone from
// the control plane) — within the request, not at a deadline. The
// generation side, which never got a Result, waits (until its deadline in
// production; here the test cancels it): its Cancel is acknowledged by
// the context rank, whose session is gone, so its blocks are freed, not
// quarantined.
// Nothing leaks, and the next request on the same engines is DONE/READY
// with every byte verified. Before TxSent the context side said DONE here
// (checked: with the session's sending phase removed this test fails).
// A worker that crashes inside the send (panics) reports the frame as not
// sent when it restarts: whether it left is not known, so the request
// fails rather than claim DONE.
func TestResultUnsentFailsTheRequest(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%v", panics), func(t *testing.T) { testResultUnsent(t, panics) })
	}
}

func testResultUnsent(t *testing.T, panics bool) {
	l := smallLayout()
	one := kvcache.Parallel{TP: 1, PP: 1}
	var rl *refusingLink
	c := startClusterOn(t, l, one, one, 2, clusterOpts{link: func(inst string, ml *control.MemLink) control.Link {
		if inst != "ctx" {
			return ml
		}
		rl = &refusingLink{Link: ml, panics: panics}
		return rl
	}})

	rl.refuse.Store(true)
	const prompt = 64
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "unsent", PromptLen: prompt,
		Context: "ctx", ContextParallel: one})
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(prompt)
	}
	src, err := c.ctx[0].Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "unsent", PromptLen: prompt})
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(prompt, 32, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chunks {
		if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), actors.FiredFence{}); err != nil {
			t.Fatal(err)
		}
	}
	o := waitOutcome(t, tx.Done())
	if o.OK || o.Status != kvxfer.StatusFailed {
		t.Fatalf("context side: %s %v, want FAILED: its Result never left", o.Status, o.Err)
	}
	cause, why := kvxfer.ErrPeerGone, "connection refused"
	if panics {
		cause, why = kvxfer.ErrWorkerCrashed, "worker"
	}
	if !errors.Is(o.Err, kvxfer.ErrFrameUnsent) || !errors.Is(o.Err, cause) {
		t.Fatalf("context side err %v: want ErrFrameUnsent wrapping %v", o.Err, cause)
	}
	if msg := o.Err.Error(); !strings.Contains(msg, "Result for gen/0") || !strings.Contains(msg, why) {
		t.Fatalf("context side err %q: want it to name the Result, its peer and why (%q)", msg, why)
	}
	if rl.refused.Load() == 0 {
		t.Fatal("the wrapper refused nothing: the test did not test")
	}
	if err := c.ctx[0].Pools().Free(src); err != nil {
		t.Fatalf("free source after Done: %v", err)
	}
	select {
	case ro := <-rx.Done():
		t.Fatalf("generation side ended %s (%v) before its deadline or a cancel: no Result reached it", ro.Status, ro.Err)
	default:
	}
	rx.Cancel()
	if ro := waitOutcome(t, rx.Done()); ro.Status != kvxfer.StatusCancelled {
		t.Fatalf("generation side: %s %v, want CANCELLED", ro.Status, ro.Err)
	}
	checkNoLeaks(t, c)

	// The engines are unharmed: the next request goes through.
	rl.refuse.Store(false)
	transfer(t, c, l, "after", 3, prompt, 32, true)
	checkNoLeaks(t, c)
}
