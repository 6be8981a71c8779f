package actors

import (
	"errors"
	"testing"
)

// TestHandleFinishedDoesNotTakeTheOutcome: a watcher that waits on
// Finished (node.Receive's hello watcher) leaves the outcome on Done for
// the caller (before: the watcher selected on Done and took it, and the
// caller read a zero Outcome from the closed channel).
func TestHandleFinishedDoesNotTakeTheOutcome(t *testing.T) {
	h := NewHandle()
	select {
	case <-h.Finished():
		t.Fatal("Finished closed before any outcome")
	default:
	}
	watched := make(chan struct{})
	go func() { <-h.Finished(); close(watched) }()
	want := Outcome{Request: "r", Status: StatusFailed, Err: errors.New("boom")}
	h.finish(want)
	<-watched
	got, ok := <-h.Done()
	if !ok || got.Request != want.Request || got.Status != want.Status || got.Err != want.Err {
		t.Fatalf("Done gave %+v (ok %v), want %+v", got, ok, want)
	}
}
