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

// TestHandleChannelsAskedBeforeOrAfter: Released and Finished (made only
// when asked for) are open until their event and closed after it, whether
// asked for before the event or only after it; a second release or finish
// changes nothing.
func TestHandleChannelsAskedBeforeOrAfter(t *testing.T) {
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	early := NewHandle()
	rel, fin := early.Released(), early.Finished()
	if closed(rel) || closed(fin) {
		t.Fatal("a new handle's Released or Finished is closed")
	}
	early.release()
	early.release()
	if !closed(rel) || closed(fin) {
		t.Fatalf("after release: Released closed %v (want true), Finished closed %v (want false)", closed(rel), closed(fin))
	}
	early.finish(Outcome{Request: "r", Status: StatusReady})
	if !closed(fin) || !closed(early.Finished()) || !closed(early.Released()) {
		t.Fatal("after finish: Finished (asked before or after) or Released not closed")
	}

	late := NewHandle()
	late.release()
	late.finish(Outcome{Request: "r", Status: StatusReady})
	late.finish(Outcome{Request: "r", Status: StatusFailed})
	if !closed(late.Released()) || !closed(late.Finished()) {
		t.Fatal("asked for only after the events: Released or Finished not closed")
	}
	if o := <-late.Done(); o.Status != StatusReady {
		t.Fatalf("Done gave %v, want the first outcome (READY)", o.Status)
	}
}
