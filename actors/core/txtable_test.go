package core

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

func rdFrom(inst, id string) *messages.RequestData {
	return &messages.RequestData{RequestID: id, Epoch: 1, From: messages.PeerID{Instance: inst}}
}

// TestTxTable_SendAndRequestData: Send and RequestData open a session
// once, in either order; Send may be called once per request; a request
// binds to one generation instance and another instance's frames neither
// open nor reach it.
func TestTxTable_SendAndRequestData(t *testing.T) {
	tb := NewTxTable(8)
	if spawn, err := tb.Open("a", ""); err != nil || !spawn {
		t.Fatalf("Open a: spawn %v err %v, want a new session", spawn, err)
	}
	if _, err := tb.Open("a", ""); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("second Open a: %v, want ErrBadRequest", err)
	}
	// RequestData first, then Send.
	if v, _ := tb.RequestData(rdFrom("gen", "b")); v != RequestDataResolve {
		t.Fatalf("RequestData b: verdict %v", v)
	}
	if refuse, spawn := tb.Resolved(rdFrom("gen", "b"), nil); refuse || !spawn {
		t.Fatalf("Resolved b: refuse %v spawn %v", refuse, spawn)
	}
	if _, err := tb.Open("b", "other"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("Open b naming another instance than the one that asked: %v", err)
	}
	if spawn, err := tb.Open("b", "gen"); err != nil || spawn {
		t.Fatalf("Open b: spawn %v err %v, want the session adopted", spawn, err)
	}
	if v, bound := tb.RequestData(rdFrom("evil", "b")); v != RequestDataNotBound || bound != "gen" {
		t.Fatalf("RequestData b from another instance: %v bound %q", v, bound)
	}
	if refuse, spawn := tb.Resolved(rdFrom("gen", "b"), nil); refuse || spawn {
		t.Fatalf("second RequestData b: refuse %v spawn %v", refuse, spawn)
	}
	if got := tb.Live(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("live %v", got)
	}
}

// TestTxTable_UnresolvedRequestData: a RequestData that cannot be resolved
// is refused without a trace while nobody claimed the request, and goes to
// the session (which fails) once its own instance has.
func TestTxTable_UnresolvedRequestData(t *testing.T) {
	tb := NewTxTable(8)
	bad := errors.New("blocks outside the pool")
	if refuse, spawn := tb.Resolved(rdFrom("gen", "c"), bad); !refuse || spawn {
		t.Fatalf("unclaimed: refuse %v spawn %v, want refused", refuse, spawn)
	}
	if spawn, err := tb.Open("c", "gen"); err != nil || !spawn {
		t.Fatalf("Open after a refused frame: spawn %v err %v", spawn, err)
	}
	if refuse, spawn := tb.Resolved(rdFrom("gen", "c"), bad); refuse || spawn {
		t.Fatalf("claimed: refuse %v spawn %v, want delivered to the session", refuse, spawn)
	}
}

// TestTxTable_StoppedAndClose: a finished request leaves a tombstone (late
// frames are stale, Send is refused) for the last n requests only; Cancel
// reaches only a live session of its own instance; Close refuses new
// requests and lists the live ones.
func TestTxTable_StoppedAndClose(t *testing.T) {
	tb := NewTxTable(2)
	for _, id := range []string{"x", "y", "z"} {
		if _, err := tb.Open(id, "gen"); err != nil {
			t.Fatal(err)
		}
	}
	cancel := &messages.Cancel{RequestID: "x", From: messages.PeerID{Instance: "gen"}}
	if deliver, notBound := tb.Cancel(cancel); !deliver || notBound {
		t.Fatalf("Cancel x: deliver %v notBound %v", deliver, notBound)
	}
	if deliver, notBound := tb.Cancel(&messages.Cancel{RequestID: "x", From: messages.PeerID{Instance: "evil"}}); deliver || !notBound {
		t.Fatalf("Cancel x from another instance: deliver %v notBound %v", deliver, notBound)
	}
	tb.Stopped("x")
	if deliver, _ := tb.Cancel(cancel); deliver {
		t.Fatal("Cancel reached a stopped session")
	}
	if v, _ := tb.RequestData(rdFrom("gen", "x")); v != RequestDataStale {
		t.Fatalf("RequestData for a finished request: %v", v)
	}
	if _, err := tb.Open("x", ""); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("Open of a finished request: %v", err)
	}
	tb.Stopped("y")
	tb.Stopped("z") // the ring holds 2: x is forgotten
	if v, _ := tb.RequestData(rdFrom("gen", "x")); v != RequestDataResolve {
		t.Fatalf("RequestData for a forgotten request: %v", v)
	}
	if _, err := tb.Open("w", ""); err != nil {
		t.Fatal(err)
	}
	if got := tb.Close(); !slices.Equal(got, []string{"w"}) || !tb.Draining() {
		t.Fatalf("Close: live %v draining %v", got, tb.Draining())
	}
	if _, err := tb.Open("v", ""); !errors.Is(err, ErrClosed) {
		t.Fatalf("Open while closing: %v", err)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "v")); v != RequestDataStale {
		t.Fatalf("RequestData for a new request while closing: %v", v)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "w")); v != RequestDataResolve {
		t.Fatalf("RequestData for a live request while closing: %v", v)
	}
}
