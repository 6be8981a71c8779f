package core

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

func rxTestLayout() kvcache.Layout {
	return kvcache.Layout{Name: "t", Layers: 2, KVHeads: 2, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: []kvcache.LayerGroup{{Name: "full", Layers: []int{0, 1}}}}
}

var rxGen = messages.PeerID{Instance: "gen", Rank: 0}

func rxOpen(id string) RxOpen {
	return RxOpen{Request: id, PromptLen: 40, Context: "ctx", ContextParallel: kvcache.Parallel{TP: 2, PP: 1},
		Deadline: testEpoch0.Add(time.Second)}
}

// TestRxTable_StartPlansEveryWriter: a generation rank of TP 1 receiving
// from a context of TP 2 has two writers, each asked by its own
// RequestData for the request's blocks, each owing its half of the heads
// of every block, each on the worker WorkerFor names.
func TestRxTable_StartPlansEveryWriter(t *testing.T) {
	l := rxTestLayout()
	tb := NewRxTable(rxGen, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{}, 4)
	blocks := [][]kvcache.BlockID{{7, 8, 9}}
	epoch, ws, err := tb.Start(rxOpen("r"), blocks, testEpoch0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || !tb.Started("r") {
		t.Fatalf("%d writers, started %v; want 2, true", len(ws), tb.Started("r"))
	}
	// 3 blocks × 16 tokens × 2 layers × 1 of 2 heads × 4 dims × 2 (K, V) × 2 bytes.
	const want = 3 * 16 * 2 * 1 * 4 * 2 * 2
	for i, w := range ws {
		if w.Peer != (messages.PeerID{Instance: "ctx", Rank: int32(i)}) {
			t.Errorf("writer %d is %v", i, w.Peer)
		}
		if w.Worker != WorkerFor("r", w.Peer, 4) {
			t.Errorf("writer %d on worker %d, WorkerFor says %d", i, w.Worker, WorkerFor("r", w.Peer, 4))
		}
		if w.Bytes != want {
			t.Errorf("writer %d owes %d bytes, want %d", i, w.Bytes, want)
		}
		rd := w.Request
		if rd.Epoch != epoch || rd.RequestID != "r" || rd.From != rxGen || rd.PromptLen != 40 ||
			rd.DeadlineUnixNano != testEpoch0.Add(time.Second).UnixNano() || len(rd.Groups) != 1 ||
			len(rd.Groups[0].Blocks) != 3 || rd.Groups[0].Blocks[0] != 7 {
			t.Errorf("writer %d RequestData %+v", i, rd)
		}
		if err := rd.Validate(); err != nil {
			t.Errorf("writer %d RequestData invalid: %v", i, err)
		}
	}
	if _, _, err := tb.Start(RxOpen{Request: "bad", PromptLen: 40, Context: "ctx", ContextParallel: kvcache.Parallel{TP: 3, PP: 1}},
		blocks, testEpoch0); !errors.Is(err, ErrBadRequest) || tb.Started("bad") {
		t.Fatalf("a context TP that does not divide the heads: %v, started %v", err, tb.Started("bad"))
	}
}

// TestRxTable_RouteAndDown: frames reach a request's session only from
// its writers; a writer declared dead is named to its requests, keeps a
// new request from starting (nothing recorded, no RequestData) until it is
// heard again or one of its frames arrives.
func TestRxTable_RouteAndDown(t *testing.T) {
	tb := NewRxTable(rxGen, rxTestLayout(), kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{}, 1)
	blocks := [][]kvcache.BlockID{{0, 1, 2}}
	if _, _, err := tb.Start(rxOpen("a"), blocks, testEpoch0); err != nil {
		t.Fatal(err)
	}
	ctx1 := messages.PeerID{Instance: "ctx", Rank: 1}
	if v, w := tb.Route(&messages.Result{RequestID: "a", From: ctx1}); v != RxRouteDeliver || w != 1 {
		t.Fatalf("Result from writer 1: %v writer %d", v, w)
	}
	if v, _ := tb.Route(&messages.Result{RequestID: "a", From: messages.PeerID{Instance: "evil"}}); v != RxRouteNotWriter {
		t.Fatalf("Result from a stranger: %v", v)
	}
	if v, _ := tb.Route(&messages.CancelAck{RequestID: "zzz", From: ctx1}); v != RxRouteStale {
		t.Fatalf("CancelAck for no request: %v", v)
	}
	refs := tb.PeerDown(ctx1, 0)
	if len(refs) != 1 || refs[0] != (RxWriterRef{Request: "a", Writer: 1}) {
		t.Fatalf("PeerDown named %v", refs)
	}
	if down := tb.DownWriters(rxOpen("b")); len(down) != 1 || down[0] != ctx1 {
		t.Fatalf("DownWriters %v", down)
	}
	if _, _, err := tb.Start(rxOpen("b"), blocks, testEpoch0); !errors.Is(err, ErrPeerGone) || tb.Started("b") {
		t.Fatalf("Start with a writer down: %v, started %v", err, tb.Started("b"))
	}
	tb.Heard(ctx1)
	if _, _, err := tb.Start(rxOpen("b"), blocks, testEpoch0); err != nil {
		t.Fatalf("Start once the writer is heard: %v", err)
	}
	tb.PeerDown(ctx1, 0)
	tb.Route(&messages.CancelAck{RequestID: "b", From: ctx1}) // it speaks again
	if _, _, err := tb.Start(rxOpen("c"), blocks, testEpoch0); err != nil {
		t.Fatalf("Start after a frame of the writer: %v", err)
	}
	tb.Stopped("a")
	if v, _ := tb.Route(&messages.Result{RequestID: "a", From: ctx1}); v != RxRouteStale {
		t.Fatalf("Result after the session stopped: %v", v)
	}
	if got := tb.Live(); len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Fatalf("live %v", got)
	}
}

// TestRxTablePeerMapsAreBounded: every distinct context parallelism a
// caller names, valid or not, is answered alike, but the table keeps
// only valid maps and at most maxPeerMaps of them (it kept all, errors
// included: a caller naming ever new ones grew it for good).
func TestRxTablePeerMapsAreBounded(t *testing.T) {
	tb := NewRxTable(rxGen, rxTestLayout(), kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{}, 1)
	for i := 1; i <= 3*maxPeerMaps; i++ {
		o := rxOpen("r")
		o.ContextParallel = kvcache.Parallel{TP: 1, PP: i} // PP past the layers: refused
		if _, _, err := tb.writers(o); i <= 2 && err != nil || i > 2 && !errors.Is(err, ErrBadRequest) {
			t.Fatalf("PP %d: %v", i, err)
		}
		o.ContextParallel = kvcache.Parallel{TP: i, PP: 1}
		ranks, _, err := tb.writers(o)
		if i <= 2 && (err != nil || len(ranks) != i) {
			t.Fatalf("TP %d: writers %v, %v", i, ranks, err)
		}
	}
	if n := len(tb.maps); n > maxPeerMaps {
		t.Fatalf("%d peer maps kept, at most %d", n, maxPeerMaps)
	}
	for p, m := range tb.maps {
		if m.err != nil {
			t.Fatalf("the refused parallelism %v is kept: %v", p, m.err)
		}
	}
}

// rxResult is a Result of request from incarnation inc of peer.
func rxResult(request string, peer messages.PeerID, inc uint64) *messages.Result {
	return &messages.Result{RequestID: request, From: peer, Incarnations: messages.Incarnations{FromIncarnation: inc}}
}

// rxOpenOf is a request of one writer, rank 0 of instance.
func rxOpenOf(id, instance string) RxOpen {
	return RxOpen{Request: id, PromptLen: 16, Context: instance, ContextParallel: kvcache.Parallel{TP: 1, PP: 1}}
}

// rxStartOf starts request id of the one writer peer, learnt at inc just
// before (its Hello), and checks it is addressed to inc.
func rxStartOf(t *testing.T, tb *RxTable, id string, peer messages.PeerID, inc uint64) {
	t.Helper()
	tb.Learn(peer, inc)
	if _, ws, err := tb.Start(rxOpenOf(id, peer.Instance), [][]kvcache.BlockID{{1}}, testEpoch0); err != nil || len(ws) != 1 || ws[0].Incarnation != inc {
		t.Fatalf("start %s: %v %+v, want one writer addressed to %d", id, err, ws, inc)
	}
}

// TestRxTableIncarnationsAreBounded: the table keeps the incarnations of
// at most maxIdleIncs peers that write for no started request, forgetting
// the least recently heard first, and none of a peer it never knew that
// sends frames (--insecure peers may name any identity); a writer of a
// live request is never forgotten, however many come and go. Without the
// bound it kept the latest incarnation of every peer it had heard, for
// good: writers under ever new identities (a context instance restarted
// under a new name each time) and strangers' frames grew it without end.
func TestRxTableIncarnationsAreBounded(t *testing.T) {
	const n = maxIdleIncs + 100
	tb := NewRxTable(rxGen, rxTestLayout(), kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{}, 2)
	keep := messages.PeerID{Instance: "keep"}
	rxStartOf(t, tb, "live", keep, 9) // stays live throughout
	ctx := messages.PeerID{Instance: "ctx"}
	for i := range n {
		peer := messages.PeerID{Instance: fmt.Sprintf("ctx-%d", i)}
		// A writer of a new identity, and a restart of the same one.
		for _, p := range []messages.PeerID{peer, ctx} {
			id := fmt.Sprintf("%s/r%d", p.Instance, i)
			rxStartOf(t, tb, id, p, uint64(i+1))
			if v, w := tb.Route(rxResult(id, p, uint64(i+1))); v != RxRouteDeliver || w != 0 {
				t.Fatalf("Result of %s: %v writer %d", id, v, w)
			}
			tb.Stopped(id)
		}
		// Frames of senders the table never knew: for no request, and
		// for a request they do not write for.
		for _, req := range []string{"nothing", "live"} {
			stranger := messages.PeerID{Instance: fmt.Sprintf("evil-%s-%d", req, i), Rank: int32(i)}
			tb.Route(rxResult(req, stranger, 7))
			if tb.Incarnation(stranger) != 0 {
				t.Fatalf("a stranger's frame taught its incarnation")
			}
		}
	}
	if len(tb.incs) != maxIdleIncs+1 || len(tb.idle) != maxIdleIncs || tb.idleLRU.Len() != maxIdleIncs || len(tb.writing) != 1 {
		t.Fatalf("after %d identities, %d restarts and %d strangers: incarnations of %d peers kept (%d idle, %d listed, %d writing), want %d (%d idle, 1 writing)",
			n, n, 2*n, len(tb.incs), len(tb.idle), tb.idleLRU.Len(), len(tb.writing), maxIdleIncs+1, maxIdleIncs)
	}
	if got := tb.Incarnation(keep); got != 9 {
		t.Fatalf("the live request's writer: incarnation %d, want 9", got)
	}
	if got := tb.Incarnation(ctx); got != n {
		t.Fatalf("the writer restarted %d times: incarnation %d, want %d", n, got, n)
	}
	if tb.Incarnation(messages.PeerID{Instance: "ctx-0"}) != 0 || tb.Incarnation(messages.PeerID{Instance: fmt.Sprintf("ctx-%d", n-1)}) != n {
		t.Fatal("the least recently heard idle writer is kept, or the latest forgotten")
	}
	// A forgotten writer's next request is addressed as any: to its latest
	// Hello, learnt just before its Start.
	rxStartOf(t, tb, "again", messages.PeerID{Instance: "ctx-0"}, 77)
}

// TestRxTableOldIncarnationStillRoutes: a writer that restarted while a
// request addressed to its old incarnation still drains keeps its latest
// incarnation while that request is live, however many idle writers push
// others out: the old incarnation's Result still reaches the request, its
// exit proof still names it, and a frame of the writer still teaches its
// incarnation; once every request of it stopped it is kept as before, and
// a request started without a fresh Hello is addressed to it.
func TestRxTableOldIncarnationStillRoutes(t *testing.T) {
	tb := NewRxTable(rxGen, rxTestLayout(), kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{}, 2)
	writer := messages.PeerID{Instance: "ctx"}
	rxStartOf(t, tb, "old", writer, 5)
	rxStartOf(t, tb, "new", writer, 6) // the writer restarted: its new Hello
	tb.Stopped("new")
	// A late frame of the writer still teaches its incarnation.
	if tb.Route(rxResult("new", writer, 7)); tb.Incarnation(writer) != 7 {
		t.Fatalf("incarnation %d after a frame of incarnation 7, want 7", tb.Incarnation(writer))
	}
	for i := range maxIdleIncs + 10 { // idle writers enough to push the first out
		rxStartOf(t, tb, fmt.Sprintf("r%d", i), messages.PeerID{Instance: fmt.Sprintf("ctx-%d", i)}, 1)
		tb.Stopped(fmt.Sprintf("r%d", i))
	}
	if got := tb.Incarnation(writer); got != 7 {
		t.Fatalf("incarnation %d while a request of the writer is live, want 7 (the latest)", got)
	}
	if v, w := tb.Route(rxResult("old", writer, 5)); v != RxRouteDeliver || w != 0 {
		t.Fatalf("Result of incarnation 5 for the request addressed to it: %v writer %d", v, w)
	}
	if got := tb.Incarnation(writer); got != 7 {
		t.Fatalf("incarnation %d after the old one's Result, want 7 (never backwards)", got)
	}
	if refs := tb.Exited(writer, 5); len(refs) != 1 || refs[0] != (RxWriterRef{Request: "old"}) {
		t.Fatalf("Exited(5) = %v, want the old request's writer 0", refs)
	}
	tb.Stopped("old")
	if v, _ := tb.Route(rxResult("old", writer, 5)); v != RxRouteStale {
		t.Fatalf("Result after the session stopped: %v", v)
	}
	_, ws, err := tb.Start(rxOpenOf("next", "ctx"), [][]kvcache.BlockID{{1}}, testEpoch0)
	if err != nil || ws[0].Incarnation != 7 {
		t.Fatalf("a request without a fresh Hello: %v %+v, want addressed to 7", err, ws)
	}
}
