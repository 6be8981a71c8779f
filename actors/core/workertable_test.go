package core

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

type wSub struct{ op OpRef }
type wFlush struct{}

func wop(req string, seq int) OpRef { return OpRef{Request: req, Peer: 1, Seq: seq} }

// TestWorkerTable_ConnectQueue: while a Connect to a peer runs, what comes
// for that peer waits behind it, in order; once it is open, later requests
// find the endpoint; a failed Connect opens nothing.
func TestWorkerTable_ConnectQueue(t *testing.T) {
	tb := NewWorkerTable[string, int]()
	if _, open, queued := tb.Endpoint("A", wSub{wop("r", 0)}); open || queued {
		t.Fatalf("first request to A: open %v queued %v, want neither (connect)", open, queued)
	}
	tb.Connecting("A", wSub{wop("r", 0)})
	for _, m := range []any{wSub{wop("r", 1)}, wFlush{}} {
		if _, _, queued := tb.Endpoint("A", m); !queued {
			t.Fatalf("%v not queued behind the Connect", m)
		}
	}
	waiting := tb.Connected("A", 7, nil)
	if want := []any{wSub{wop("r", 0)}, wSub{wop("r", 1)}, wFlush{}}; !reflect.DeepEqual(waiting, want) {
		t.Fatalf("waiting %v, want %v", waiting, want)
	}
	if ep, open, queued := tb.Endpoint("A", wFlush{}); ep != 7 || !open || queued {
		t.Fatalf("after the Connect: ep %d open %v queued %v", ep, open, queued)
	}
	tb.Connecting("B", wSub{wop("s", 0)})
	if waiting := tb.Connected("B", 0, errors.New("refused")); len(waiting) != 1 {
		t.Fatalf("waiting %v", waiting)
	}
	if _, open, _ := tb.Endpoint("B", wFlush{}); open {
		t.Fatal("a failed Connect opened an endpoint")
	}
}

// TestWorkerTable_CloseAndRestart: closing an endpoint takes it and the ops
// in flight on it (by session, in order) out of the table; a restart
// refuses the ops with no open endpoint (never posted), puts the others in
// doubt, drops the submits waiting for a Connect and keeps its flushes,
// and names the endpoints to close.
func TestWorkerTable_CloseAndRestart(t *testing.T) {
	tb := NewWorkerTable[string, int]()
	tb.Connected("A", 1, nil)
	tb.Connected("B", 2, nil)
	tb.Admit(wop("r", 1), "s1", "A")
	tb.Admit(wop("r", 0), "s1", "A")
	tb.Admit(wop("q", 0), "s2", "A")
	tb.Admit(wop("r", 2), "s1", "B")
	tb.Admit(wop("x", 0), "s3", "C") // C is connecting: never posted
	tb.Connecting("C", wSub{wop("x", 0)})
	tb.Endpoint("C", wFlush{})
	ep, retired, ok := tb.Close("A")
	want := []SessionOps[string]{{"s2", []OpRef{wop("q", 0)}}, {"s1", []OpRef{wop("r", 0), wop("r", 1)}}}
	if ep != 1 || !ok || !reflect.DeepEqual(retired, want) {
		t.Fatalf("Close A: ep %d ok %v retired %v, want %v", ep, ok, retired, want)
	}
	if _, _, ok := tb.Close("A"); ok {
		t.Fatal("A closed twice")
	}
	refused, doubt, keys := tb.Restart(func(m any) bool { _, ok := m.(wSub); return ok })
	if want := []SessionOps[string]{{"s3", []OpRef{wop("x", 0)}}}; !reflect.DeepEqual(refused, want) {
		t.Fatalf("refused %v, want %v", refused, want)
	}
	if want := []SessionOps[string]{{"s1", []OpRef{wop("r", 2)}}}; !reflect.DeepEqual(doubt, want) {
		t.Fatalf("in doubt %v, want %v", doubt, want)
	}
	if !reflect.DeepEqual(keys, []string{"B"}) {
		t.Fatalf("keys %v", keys)
	}
	if waiting := tb.Connected("C", 3, nil); !reflect.DeepEqual(waiting, []any{wFlush{}}) {
		t.Fatalf("after the restart, C's queue is %v, want only the flush", waiting)
	}
	if _, retired, _ := tb.Close("B"); len(retired) != 1 || tb.InFlight() != 0 {
		t.Fatalf("Close B retired %v, %d still in flight", retired, tb.InFlight())
	}
}

// TestWorkerTable_Carries: a stream's ops are carried by key while they
// are in flight to it (posted, or waiting for its Connect); once key's
// endpoint is closed they are not, and an endpoint opened at key since
// carries only the ops posted on it.
func TestWorkerTable_Carries(t *testing.T) {
	tb := NewWorkerTable[string, int]()
	tb.Connecting("A", wSub{wop("r", 0)})
	tb.Admit(wop("r", 0), "s1", "A")
	if !tb.Carries("A", "s1", 1) {
		t.Fatal("an op waiting for its Connect is not carried")
	}
	tb.Connected("A", 1, nil)
	tb.Admit(wop("q", 0), "s2", "A")
	for _, c := range []struct {
		key, session string
		peer         int
	}{{"B", "s1", 1}, {"A", "s3", 1}, {"A", "s1", 2}} {
		if tb.Carries(c.key, c.session, c.peer) {
			t.Fatalf("%s carries an op of %s's stream to peer %d: it has none", c.key, c.session, c.peer)
		}
	}
	tb.Close("A")
	tb.Connected("A", 2, nil)
	tb.Admit(wop("x", 0), "s3", "A")
	if tb.Carries("A", "s1", 1) || tb.Carries("A", "s2", 1) {
		t.Fatal("the endpoint opened after a close carries the ops that close took")
	}
	if !tb.Carries("A", "s3", 1) {
		t.Fatal("the endpoint opened after a close does not carry the op posted on it")
	}
}

// TestWorkerFor_SpreadsARequestsStreams: WorkerFor is fixed for a stream
// and gives the streams of one request consecutive workers by peer rank,
// so that they spread over distinct workers when there are enough; with
// one worker (or none) every stream is worker 0's.
//
// Guard, removed by hand and seen to fail this test: the peer rank's term
// in WorkerFor (every stream of a request on one worker).
func TestWorkerFor_SpreadsARequestsStreams(t *testing.T) {
	for _, workers := range []int{2, 4, 8} {
		for _, req := range []string{"r1", "r2", "req-7"} {
			seen := map[int]bool{}
			for rank := range workers {
				p := messages.PeerID{Instance: "gen", Rank: int32(rank)}
				w := WorkerFor(req, p, workers)
				if w < 0 || w >= workers || w != WorkerFor(req, p, workers) {
					t.Fatalf("WorkerFor(%s, %v, %d) = %d", req, p, workers, w)
				}
				seen[w] = true
			}
			if len(seen) != workers {
				t.Errorf("%s over %d workers: %d ranks took only %d workers", req, workers, workers, len(seen))
			}
		}
	}
	for _, workers := range []int{0, 1} {
		if w := WorkerFor("r1", messages.PeerID{Instance: "gen", Rank: 3}, workers); w != 0 {
			t.Errorf("%d workers: worker %d", workers, w)
		}
	}
}
