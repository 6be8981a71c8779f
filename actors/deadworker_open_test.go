//go:build kvxfer_invariants

package actors

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
)

// A Send that passed its failed-engine check just before a worker stopped
// for good reaches the tx parent after TxWorkerDead went out: the parent
// refuses it too, instead of spawning a session that does not know the
// worker is dead (a later RequestData would route a stream to it, whose
// ops nothing posts or settles: the session would never drain, its source
// pages pinned; found by a review).
func TestOpenAfterWorkerDeathRefused(t *testing.T) {
	ctxR := startTestRank(t, "ctx", control.NewMemLink())
	for range 11 { // the restart budget is 10
		ctxR.e.CrashWorker(0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !ctxR.e.env.failed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("worker 0 never stopped for good")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	// What Send does once its own check passed.
	open := &txOpenReq{request: "late", start: TxStart{PromptLen: 32, Deadline: time.Now().Add(time.Minute)},
		handle: NewHandle(), reply: newOpenReply[txOpenReply]()}
	ctxR.e.sys.Root.Send(ctxR.e.tx, open)
	<-open.reply.done
	if r := open.reply.r; !errors.Is(r.err, ErrEngineFailed) {
		t.Fatalf("open after the worker stopped: %v, want ErrEngineFailed", r.err)
	}
}
