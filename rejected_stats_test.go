package kvxfer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// TestEveryRejectedFrameIsInStats: each reason of
// kvxfer_frames_rejected_total that the engine counts has its Stats
// counterpart, which counts the same frames: invalid, not_writer,
// unresolved, not_bound and orphan_limit are FramesRejected; stale
// FramesStale; shed FramesShed; silenced FramesSilenced; tombstones_full
// CancelsDeferred. The frames here are those the metric alone counted
// before: a Cancel from another instance than its request's (not_bound,
// answered CancelAck), a RequestData of the request's own instance that
// cannot be resolved (unresolved: its request fails), and a Cancel left
// unanswered because every instance's tombstone is young
// (tombstones_full).
func TestEveryRejectedFrameIsInStats(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	start := func(inst string) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 4 << 20,
			Workers: 1, Link: link, MetricsAddr: "127.0.0.1:0", TransferTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeWithin(t, e, inst) })
		return e
	}
	ctxE, genE := start("ctx"), start("gen")
	c := &cluster{link: link, ctx: []*kvxfer.Engine{ctxE}, gen: []*kvxfer.Engine{genE}, ctxPar: tp1, genPar: tp1}
	r := newRogue(t, c, messages.PeerID{Instance: "evil", Rank: 0})

	// not_bound: a Cancel of a request bound to gen, from evil. Answered
	// (nothing of ours writes for evil); the request goes on.
	victim, err := ctxE.Send(context.Background(), kvxfer.SendRequest{ID: "victim", PromptLen: 64, Generation: "gen"})
	if err != nil {
		t.Fatal(err)
	}
	r.send(t, c, &messages.Cancel{RequestID: "victim", Epoch: 1, From: r.id, Reason: "not yours"})
	r.wait(t, "the CancelAck of victim", func(f messages.Frame) bool {
		a, ok := f.(*messages.CancelAck)
		return ok && a.RequestID == "victim"
	})
	if victim.Err() != nil {
		t.Fatalf("a Cancel of another instance decided victim: %v", victim.Err())
	}

	// unresolved: evil's own request, asked for blocks outside its pool:
	// the request fails.
	own, err := ctxE.Send(context.Background(), kvxfer.SendRequest{ID: "own", PromptLen: 64, Generation: "evil"})
	if err != nil {
		t.Fatal(err)
	}
	r.send(t, c, requestData(r.id, "own", 64, [][]int32{{1 << 30, 1, 2, 3}, {0, 1, 2, 3}}))
	if o := waitOutcome(t, own.Done()); o.OK {
		t.Fatal("own: DONE, want FAILED: its instance's RequestData could not be resolved")
	}

	// tombstones_full: Cancels of requests never seen here, from as many
	// instances as the engine keeps cancel tombstones of (64), each
	// answered; one more instance's is held (every tombstone is young).
	const instances = 64
	for i := range instances + 1 {
		ri := newRogue(t, c, messages.PeerID{Instance: fmt.Sprintf("canceller-%d", i)})
		id := fmt.Sprintf("never-%d", i)
		ri.send(t, c, &messages.Cancel{RequestID: id, Epoch: 1, From: ri.id})
		if i < instances {
			ri.wait(t, "the CancelAck of "+id, func(f messages.Frame) bool {
				a, ok := f.(*messages.CancelAck)
				return ok && a.RequestID == id
			})
		}
	}

	// Each reason's count and its Stats counterpart, polled until the
	// last frame (the held Cancel) is counted.
	rejected := []string{"invalid", "not_writer", "unresolved", "not_bound", "orphan_limit"}
	var m samples
	var st kvxfer.Stats
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, st = gather(t, ctxE), ctxE.Stats()
		if m["kvxfer_frames_rejected_total{reason=tombstones_full}"] >= 1 && st.CancelsDeferred >= 1 {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	reason := func(r string) float64 { return m["kvxfer_frames_rejected_total{reason="+r+"}"] }
	for _, r := range []string{"not_bound", "unresolved", "tombstones_full"} {
		if reason(r) != 1 {
			t.Errorf("kvxfer_frames_rejected_total{reason=%s} = %v, want 1", r, reason(r))
		}
	}
	var sum float64
	for _, r := range rejected {
		sum += reason(r)
	}
	for _, c := range []struct {
		what   string
		metric float64
		stat   int64
	}{
		{"FramesRejected (" + strings.Join(rejected, ", ") + ")", sum, st.FramesRejected},
		{"FramesStale (stale)", reason("stale"), st.FramesStale},
		{"FramesShed (shed)", reason("shed"), st.FramesShed},
		{"FramesSilenced (silenced)", reason("silenced"), st.FramesSilenced},
		{"CancelsDeferred (tombstones_full)", reason("tombstones_full"), st.CancelsDeferred},
	} {
		if float64(c.stat) != c.metric {
			t.Errorf("Stats.%s = %d, kvxfer_frames_rejected_total counts %v: they count the same frames", c.what, c.stat, c.metric)
		}
	}
	victim.Cancel()
	waitOutcome(t, victim.Done())
}
