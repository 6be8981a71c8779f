package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestSuspectHeardWhenItLeavesTheDownSet: a writer declared down for missed
// heartbeats leaves the rx parent's down set when a new request's start
// finds its Hello current, or when a frame of it arrives. Either way it is
// heard again, and the requests that suspected it must hear it too
// (RxHeard): a closing engine then waits for its answer to their Cancel
// instead of abandoning their blocks to quarantine. The writer here is
// alive and answers every Cancel it gets; r1's are held on the wire until
// the engine closes. Before the fix only Engine.PeerAlive and Close told
// the sessions, and only of a peer still in the down set: the start or the
// frame had emptied it, so r1 was abandoned at Close with its writer
// alive (Close: "1 requests keep destination blocks quarantined … [r1]").
func TestSuspectHeardWhenItLeavesTheDownSet(t *testing.T) {
	for _, byFrame := range []bool{false, true} {
		name := "by a new request's start"
		if byFrame {
			name = "by a frame of it"
		}
		t.Run(name, func(t *testing.T) { testSuspectHeard(t, byFrame) })
	}
}

func testSuspectHeard(t *testing.T, byFrame bool) {
	ml := control.NewMemLink()
	ctxR := startTestRank(t, "ctx", ml)
	ctxID := ctxR.e.Hello().From
	var holding atomic.Bool
	holding.Store(true)
	sent := make(chan string, 16)     // requests whose RequestData left
	closing := make(chan struct{}, 1) // r2's Cancel: the engine closes
	tap := &tapLink{Link: ml, on: func(f messages.Frame) (bool, error) {
		switch f := f.(type) {
		case *messages.RequestData:
			sent <- f.RequestID
		case *messages.Cancel:
			switch f.RequestID {
			case "r1":
				return holding.Load(), nil
			case "r2":
				select {
				case closing <- struct{}{}:
				default:
				}
			}
		}
		return false, nil
	}}
	genR := startTestRank(t, "gen", tap)
	receive := func(id string) *RxHandle {
		t.Helper()
		rx, err := genR.e.Receive(RxRequest{ID: id, PromptLen: 32, Context: "ctx",
			ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if got := wait(t, id+"'s RequestData", sent); got != id {
			t.Fatalf("RequestData of %s, want %s", got, id)
		}
		return rx
	}

	var rx0 *RxHandle
	if byFrame {
		rx0 = receive("r0")
	}
	receive("r1")
	genR.e.PeerDown(ctxID, "missed its heartbeats (test)")
	if byFrame {
		// r0's Cancel is answered: the CancelAck is a frame of ctx.
		wait(t, "r0's blocks released", rx0.Released())
	}
	receive("r2") // its start finds ctx's Hello current
	genR.e.PeerAlive(ctxID)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- genR.e.Close(ctx)
	}()
	// r2's Cancel leaves once the rx parent took the close (RxAbandon
	// is in r1's mailbox by then): r1's Cancels may reach ctx now.
	wait(t, "r2's Cancel at Close", closing)
	holding.Store(false)
	if err := tap.release(); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, "gen's Close", done); err != nil {
		t.Fatalf("close: %v (ctx was heard again and answers r1's Cancel: r1 must wait for it)", err)
	}
}
