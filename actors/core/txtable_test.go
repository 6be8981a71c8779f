package core

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// t0 is the tables' clock in these tests.
var t0 = time.Unix(1_700_000_000, 0)

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
	if deliver, notBound, _ := tb.Cancel(cancel, t0); !deliver || notBound {
		t.Fatalf("Cancel x: deliver %v notBound %v", deliver, notBound)
	}
	if deliver, notBound, _ := tb.Cancel(&messages.Cancel{RequestID: "x", From: messages.PeerID{Instance: "evil"}}, t0); deliver || !notBound {
		t.Fatalf("Cancel x from another instance: deliver %v notBound %v", deliver, notBound)
	}
	tb.Stopped("x")
	if deliver, _, _ := tb.Cancel(cancel, t0); deliver {
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
	if v, _ := tb.RequestData(rdFrom("gen", "v")); v != RequestDataClosing {
		t.Fatalf("RequestData for a new request while closing: %v, want closing (%v)", v, RequestDataClosing)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "y")); v != RequestDataStale {
		t.Fatalf("RequestData for a finished request while closing: %v, want stale (%v)", v, RequestDataStale)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "w")); v != RequestDataResolve {
		t.Fatalf("RequestData for a live request while closing: %v", v)
	}
}

// TestTxTable_Silence: a request whose stream to a generation rank ended
// without a terminal frame (its writes may still land) never answers that
// rank again, also once its tombstone is forgotten: its Cancel is held,
// not acknowledged, and its RequestData dropped, not answered FAILED — both
// would be proofs; the request is never opened again. Another rank of the
// same instance is answered as for any finished request.
func TestTxTable_Silence(t *testing.T) {
	tb := NewTxTable(1)
	silent, other := messages.PeerID{Instance: "gen", Rank: 1}, messages.PeerID{Instance: "gen", Rank: 2}
	if _, err := tb.Open("r", "gen"); err != nil {
		t.Fatal(err)
	}
	tb.Silence("r", []SilentPeer{{PeerID: silent}})
	tb.Silence("r", []SilentPeer{{PeerID: silent}}) // twice: once is enough
	tb.Stopped("r")
	if _, err := tb.Open("q", ""); err != nil {
		t.Fatal(err)
	}
	tb.Stopped("q") // the ring holds 1: r's tombstone is forgotten
	if !tb.Silenced("r", silent, 0) || tb.Silenced("r", other, 0) || tb.Silenced("q", silent, 0) {
		t.Fatalf("Silenced: r/%v %v, r/%v %v, q/%v %v", silent, tb.Silenced("r", silent, 0), other, tb.Silenced("r", other, 0), silent, tb.Silenced("q", silent, 0))
	}
	for _, epoch := range []uint64{1, 2} {
		deliver, notBound, hold := tb.Cancel(&messages.Cancel{RequestID: "r", Epoch: epoch, From: silent}, t0)
		if deliver || notBound || !hold {
			t.Fatalf("Cancel r epoch %d from the silenced rank: deliver %v notBound %v hold %v, want held", epoch, deliver, notBound, hold)
		}
		rd := &messages.RequestData{RequestID: "r", Epoch: epoch, From: silent}
		if v, _ := tb.RequestData(rd); v != RequestDataSilenced {
			t.Fatalf("RequestData r epoch %d from the silenced rank: %v, want silenced (%v)", epoch, v, RequestDataSilenced)
		}
	}
	if _, err := tb.Open("r", ""); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("Open of a silenced request: %v, want ErrBadRequest", err)
	}
	if deliver, _, hold := tb.Cancel(&messages.Cancel{RequestID: "r", Epoch: 1, From: other}, t0); deliver || hold {
		t.Fatalf("Cancel r from another rank: deliver %v hold %v, want it acknowledged", deliver, hold)
	}
	if tb.Close(); !tb.Silenced("r", silent, 0) {
		t.Fatal("closing forgot the silenced rank")
	}
}

// TestTxTable_SilencedOpenSaysWhy: Send of a request silenced towards a
// generation rank is refused for the engine's life, and the error says
// why — the rank it is silenced towards, and that writes to it may still
// land — instead of a bare "already sent" that reads as the caller's
// mistake; also once its tombstone is forgotten and another rank of the
// instance cancelled it (a cancel tombstone), and whether Send names the
// instance or not.
func TestTxTable_SilencedOpenSaysWhy(t *testing.T) {
	tb := NewTxTable(1)
	silent, other := messages.PeerID{Instance: "gen", Rank: 1}, messages.PeerID{Instance: "gen", Rank: 2}
	if _, err := tb.Open("r", "gen"); err != nil {
		t.Fatal(err)
	}
	tb.Silence("r", []SilentPeer{{PeerID: silent}})
	tb.Stopped("r")
	check := func(when string) {
		t.Helper()
		for _, gen := range []string{"gen", ""} {
			_, err := tb.Open("r", gen)
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("%s: Open(r, %q): %v, want ErrBadRequest", when, gen, err)
			}
			for _, want := range []string{"silenced towards gen/1", "may still land"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("%s: Open(r, %q): %q, want it to say %q", when, gen, err, want)
				}
			}
		}
	}
	check("after the stop")
	if _, err := tb.Open("q", ""); err != nil {
		t.Fatal(err)
	}
	tb.Stopped("q") // the ring holds 1: r's tombstone is forgotten
	check("tombstone forgotten")
	// A RequestData of another instance opens a session for it (nothing
	// remembers it finished): Send still may not adopt it.
	rd := &messages.RequestData{RequestID: "r", Epoch: 1, From: messages.PeerID{Instance: "gen2"}}
	if v, _ := tb.RequestData(rd); v != RequestDataResolve {
		t.Fatalf("RequestData r from another instance: %v", v)
	}
	if refuse, spawn := tb.Resolved(rd, nil); refuse || !spawn {
		t.Fatalf("Resolved: refuse %v spawn %v", refuse, spawn)
	}
	check("reopened by another instance's RequestData")
	tb.Stopped("r")
	if deliver, _, hold := tb.Cancel(&messages.Cancel{RequestID: "r", Epoch: 1, From: other}, t0); deliver || hold {
		t.Fatalf("Cancel r from another rank: deliver %v hold %v, want it acknowledged", deliver, hold)
	}
	check("cancelled by another rank")
}

// TestTxTable_SilenceIsPerIncarnation: a request is silenced towards the
// incarnation of the generation rank its stream wrote to. A later
// incarnation of that rank (a receiver that died — the usual cause of an
// endpoint cut without proof — and restarted) never got a write of it: its
// RequestData for the id is answered (stale) and its Cancel acknowledged,
// as for any finished request. They were dropped and held for good, so the
// new incarnation's destination pages for a retried id stayed quarantined
// for the life of this engine. Frames of that incarnation, of an earlier
// one, or without incarnations (0) stay unanswered.
func TestTxTable_SilenceIsPerIncarnation(t *testing.T) {
	tb := NewTxTable(8)
	rank := messages.PeerID{Instance: "gen", Rank: 1}
	if _, err := tb.Open("r", "gen"); err != nil {
		t.Fatal(err)
	}
	tb.Silence("r", []SilentPeer{{PeerID: rank, Incarnation: 5}})
	tb.Stopped("r")
	for _, inc := range []uint64{0, 4, 5} {
		if !tb.Silenced("r", rank, inc) {
			t.Fatalf("incarnation %d: not silenced", inc)
		}
		cancel := &messages.Cancel{RequestID: "r", Epoch: 1, From: rank, Incarnations: messages.Incarnations{FromIncarnation: inc}}
		if deliver, _, hold := tb.Cancel(cancel, t0); deliver || !hold {
			t.Fatalf("Cancel of incarnation %d: deliver %v hold %v, want held", inc, deliver, hold)
		}
		rd := &messages.RequestData{RequestID: "r", Epoch: 1, From: rank, Incarnations: messages.Incarnations{FromIncarnation: inc}}
		if v, _ := tb.RequestData(rd); v != RequestDataSilenced {
			t.Fatalf("RequestData of incarnation %d: %v, want silenced", inc, v)
		}
	}
	if tb.Silenced("r", rank, 6) {
		t.Fatal("incarnation 6: silenced, but nothing of r ever wrote to it")
	}
	rd := &messages.RequestData{RequestID: "r", Epoch: 1, From: rank, Incarnations: messages.Incarnations{FromIncarnation: 6}}
	if v, _ := tb.RequestData(rd); v != RequestDataStale {
		t.Fatalf("RequestData of incarnation 6: %v, want stale (answered FAILED)", v)
	}
	cancel := &messages.Cancel{RequestID: "r", Epoch: 1, From: rank, Incarnations: messages.Incarnations{FromIncarnation: 6}}
	if deliver, _, hold := tb.Cancel(cancel, t0); deliver || hold {
		t.Fatalf("Cancel of incarnation 6: deliver %v hold %v, want it acknowledged", deliver, hold)
	}
	// Send stays refused: it names no incarnation, and its streams could
	// be read by the one whose writes may still land.
	if _, err := tb.Open("r", "gen"); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "incarnation 5") {
		t.Fatalf("Open of r: %v, want ErrBadRequest naming incarnation 5", err)
	}
	// A stream of a peer without incarnations (0) silences every one.
	tb.Silence("q", []SilentPeer{{PeerID: rank}})
	for _, inc := range []uint64{0, 5, 6} {
		if !tb.Silenced("q", rank, inc) {
			t.Fatalf("q, incarnation %d: not silenced after a stream to incarnation 0", inc)
		}
	}
}

// TestTxTable_OrphanLimit: a generation instance may have at most the
// limit of sessions its RequestData opened and no Send adopted; past it a
// new request's RequestData is shed, while frames for live requests,
// another instance's requests and Send are not; adoption and a stopped
// orphan give room back.
func TestTxTable_OrphanLimit(t *testing.T) {
	tb := NewTxTable(8)
	tb.SetOrphanLimit(2)
	open := func(inst, id string) {
		t.Helper()
		if v, _ := tb.RequestData(rdFrom(inst, id)); v != RequestDataResolve {
			t.Fatalf("RequestData %s from %s: verdict %v, want resolve", id, inst, v)
		}
		if refuse, spawn := tb.Resolved(rdFrom(inst, id), nil); refuse || !spawn {
			t.Fatalf("Resolved %s: refuse %v spawn %v", id, refuse, spawn)
		}
	}
	shed := func(inst, id string) {
		t.Helper()
		if v, _ := tb.RequestData(rdFrom(inst, id)); v != RequestDataShed {
			t.Fatalf("RequestData %s from %s: verdict %v, want shed (orphans %d)", id, inst, v, tb.Orphans(inst))
		}
	}
	open("gen", "r1")
	open("gen", "r2")
	shed("gen", "r3")
	if tb.Orphans("gen") != 2 || slices.Contains(tb.Live(), "r3") {
		t.Fatalf("orphans %d live %v after a shed RequestData", tb.Orphans("gen"), tb.Live())
	}
	// A live request's frame, and another instance's new request, pass.
	if v, _ := tb.RequestData(rdFrom("gen", "r1")); v != RequestDataResolve {
		t.Fatalf("RequestData for live r1: %v", v)
	}
	open("gen2", "q1")
	// Send for a new request is no orphan.
	if spawn, err := tb.Open("s1", "gen"); err != nil || !spawn {
		t.Fatalf("Open s1: %v %v", spawn, err)
	}
	shed("gen", "r3")
	// Send adopts r1: room for one more.
	if spawn, err := tb.Open("r1", "gen"); err != nil || spawn {
		t.Fatalf("Open r1: spawn %v err %v", spawn, err)
	}
	open("gen", "r3")
	shed("gen", "r4")
	// The orphan r2 times out and stops: room again.
	tb.Stopped("r2")
	open("gen", "r4")
	// Stopping adopted sessions changes no count.
	tb.Stopped("r1")
	tb.Stopped("s1")
	if tb.Orphans("gen") != 2 || tb.Orphans("gen2") != 1 {
		t.Fatalf("orphans gen %d gen2 %d, want 2 and 1", tb.Orphans("gen"), tb.Orphans("gen2"))
	}
	tb.Stopped("r3")
	tb.Stopped("r4")
	tb.Stopped("q1")
	if tb.Orphans("gen") != 0 || tb.Orphans("gen2") != 0 {
		t.Fatalf("orphans gen %d gen2 %d after every session stopped", tb.Orphans("gen"), tb.Orphans("gen2"))
	}
}

// TestTxTable_OrphansCounted: the table counts the orphans live now (of
// every instance) and those that stopped with no Send adopting them, and
// names the first MaxOrphanIDs not adopted: an adopted orphan leaves the
// names and counts nowhere, an ended one stays named and counted, a
// shed RequestData and a Send's own request are no orphans. (What a
// context process needs to tell that its generation peer asked for
// requests it never sent.)
func TestTxTable_OrphansCounted(t *testing.T) {
	tb := NewTxTable(8)
	tb.SetOrphanLimit(6)
	open := func(inst, id string) {
		t.Helper()
		if v, _ := tb.RequestData(rdFrom(inst, id)); v != RequestDataResolve {
			t.Fatalf("RequestData %s from %s: verdict %v, want resolve", id, inst, v)
		}
		if refuse, spawn := tb.Resolved(rdFrom(inst, id), nil); refuse || !spawn {
			t.Fatalf("Resolved %s: refuse %v spawn %v", id, refuse, spawn)
		}
	}
	check := func(what string, live int, ended int64, ids ...string) {
		t.Helper()
		got, _ := tb.OrphanIDs()
		if tb.OrphansLive() != live || tb.OrphansEnded() != ended || !slices.Equal(got, ids) {
			t.Fatalf("%s: orphans live %d ended %d ids %v, want %d %d %v", what, tb.OrphansLive(), tb.OrphansEnded(), got, live, ended, ids)
		}
	}
	check("empty", 0, 0)
	// Send first, then its RequestData: no orphan at any point.
	if spawn, err := tb.Open("s", "gen"); err != nil || !spawn {
		t.Fatalf("Open s: %v %v", spawn, err)
	}
	if refuse, spawn := tb.Resolved(rdFrom("gen", "s"), nil); refuse || spawn {
		t.Fatalf("Resolved s: refuse %v spawn %v", refuse, spawn)
	}
	tb.Stopped("s")
	check("a Send's request", 0, 0)
	// RequestData first, Send adopts it, it ends: counted while live only.
	open("gen", "a")
	_, v0 := tb.OrphanIDs()
	check("an orphan", 1, 0, "a")
	if spawn, err := tb.Open("a", "gen"); err != nil || spawn {
		t.Fatalf("Open a: spawn %v err %v", spawn, err)
	}
	if _, v := tb.OrphanIDs(); v == v0 {
		t.Fatalf("the ids changed and their version did not (%d)", v)
	}
	tb.Stopped("a")
	check("an adopted orphan that ended", 0, 0)
	// Orphans no Send adopts, of two instances: the first MaxOrphanIDs
	// named, in order; those that end stay named and are counted.
	for i := range MaxOrphanIDs + 1 {
		open("gen", fmt.Sprintf("req-%d", 8+i))
	}
	open("gen2", "q")
	want := []string{"req-8", "req-9", "req-10", "req-11"}
	check("orphans", MaxOrphanIDs+2, 0, want...)
	tb.Stopped("req-9")
	tb.Stopped("q")
	check("two ended", MaxOrphanIDs, 2, want...)
	// Adopting a named one makes room for the next new orphan's name.
	if _, err := tb.Open("req-10", "gen"); err != nil {
		t.Fatalf("Open req-10: %v", err)
	}
	check("one adopted", MaxOrphanIDs-1, 2, "req-8", "req-9", "req-11")
	open("gen", "req-20")
	check("after one more", MaxOrphanIDs, 2, "req-8", "req-9", "req-11", "req-20")
	// A shed RequestData is no orphan.
	tb.SetOrphanLimit(1)
	if v, _ := tb.RequestData(rdFrom("gen", "req-30")); v != RequestDataShed {
		t.Fatalf("RequestData past the limit: %v", v)
	}
	check("after a shed RequestData", MaxOrphanIDs, 2, "req-8", "req-9", "req-11", "req-20")
	for _, id := range tb.Close() {
		tb.Stopped(id)
	}
	check("closed", 0, 2+MaxOrphanIDs, "req-8", "req-9", "req-11", "req-20")
}

// TestTxTable_Unread: a RequestData not read (invalid, or refused for
// its sender's spent credits) goes to the session only when the request
// is live and bound to the sender's instance (by Send or by an earlier
// RequestData); every other is answered by the parent: no session (never
// seen, or finished), a live one not bound yet (no stream of anyone's),
// or one bound to another instance (no stream of the sender's). (Checked
// to fail: with Unread handing every live request to its session,
// "unbound" and "other" do.)
func TestTxTable_Unread(t *testing.T) {
	tb := NewTxTable(8)
	if _, err := tb.Open("unbound", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Open("bound", "gen"); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Open("done", "gen"); err != nil {
		t.Fatal(err)
	}
	tb.Stopped("done")
	tb.Resolved(rdFrom("gen", "asked"), nil) // bound by its first RequestData
	for _, tc := range []struct {
		inst, id  string
		toSession bool
	}{
		{"gen", "never", false},
		{"gen", "done", false},
		{"gen", "bound", true},
		{"gen", "asked", true},
		{"gen", "unbound", false},
		{"other", "bound", false},
		{"other", "asked", false},
	} {
		if got := tb.Unread(rdFrom(tc.inst, tc.id)); got != tc.toSession {
			t.Errorf("Unread(%s from %s) = to session %v; want %v", tc.id, tc.inst, got, tc.toSession)
		}
	}
}

// TestTxTable_CancelBeforeRequestData: a generation instance's Cancel may
// overtake its own RequestData (they can leave on two connections: a
// sender worker that restarted, or died, between them). The CancelAck
// answered at once lets that instance free the request's destination
// blocks, so the RequestData that arrives afterwards must open nothing
// here — it is stale — and Engine.Send for the request fails at once,
// naming the cancel. The tombstone is the cancelling instance's: another
// instance's RequestData, and a Send naming another instance, pass. Once
// Send adopted a request naming no instance, a Cancel reaches its session
// (which fails) instead of being answered by the table. Cancel tombstones
// share the bounded ring, one per (request, instance) however often the
// Cancel is re-sent. (Checked to fail with TxTable.Cancel remembering
// nothing: the RequestData resolved and opened a session.)
func TestTxTable_CancelBeforeRequestData(t *testing.T) {
	tb := NewTxTable(3)
	now := t0
	cancel := func(inst, id string) (deliver, notBound bool) {
		deliver, notBound, hold := tb.Cancel(&messages.Cancel{RequestID: id, Epoch: 1, From: messages.PeerID{Instance: inst}}, now)
		if hold {
			t.Fatalf("Cancel %s of %s held", id, inst)
		}
		return deliver, notBound
	}
	for range 3 { // the generation side re-sends its Cancel until acknowledged
		if deliver, notBound := cancel("gen", "a"); deliver || notBound {
			t.Fatalf("Cancel a without a session: deliver %v notBound %v, want answered at once", deliver, notBound)
		}
	}
	if v, _ := tb.RequestData(rdFrom("gen", "a")); v != RequestDataStale {
		t.Fatalf("RequestData a after its instance's Cancel: verdict %v, want stale (%v)", v, RequestDataStale)
	}
	if len(tb.Live()) != 0 {
		t.Fatalf("live %v after a cancelled request's RequestData", tb.Live())
	}
	for _, gen := range []string{"", "gen"} {
		_, err := tb.Open("a", gen)
		if !errors.Is(err, ErrPeerCancelled) || !strings.Contains(err.Error(), "generation instance gen") ||
			!strings.Contains(err.Error(), "request a") || !strings.Contains(err.Error(), "before Send") {
			t.Fatalf("Open a naming %q after its Cancel: %v, want ErrPeerCancelled naming request a and instance gen", gen, err)
		}
	}
	if len(tb.Live()) != 0 {
		t.Fatalf("live %v after a refused Open", tb.Live())
	}

	// Another instance's Cancel does not refuse this one's RequestData.
	cancel("evil", "b")
	if v, _ := tb.RequestData(rdFrom("evil", "b")); v != RequestDataStale {
		t.Fatalf("RequestData b from the instance that cancelled it: %v, want stale", v)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "b")); v != RequestDataResolve {
		t.Fatalf("RequestData b from another instance than the one that cancelled: %v, want resolve", v)
	}
	if refuse, spawn := tb.Resolved(rdFrom("gen", "b"), nil); refuse || !spawn {
		t.Fatalf("Resolved b: refuse %v spawn %v", refuse, spawn)
	}
	if spawn, err := tb.Open("b", "gen"); err != nil || spawn {
		t.Fatalf("Open b naming its instance: spawn %v err %v, want adopted", spawn, err)
	}
	cancel("evil", "c")
	if spawn, err := tb.Open("c", "gen"); err != nil || !spawn {
		t.Fatalf("Open c naming another instance than the one that cancelled: spawn %v err %v", spawn, err)
	}

	// A session Send opened naming no instance takes the first Cancel.
	if _, err := tb.Open("d", ""); err != nil {
		t.Fatal(err)
	}
	if deliver, notBound := cancel("gen", "d"); !deliver || notBound {
		t.Fatalf("Cancel d, Send-adopted and unbound: deliver %v notBound %v, want delivered", deliver, notBound)
	}
	if deliver, notBound := cancel("evil", "c"); deliver || !notBound {
		t.Fatalf("Cancel c from an instance Send did not name: deliver %v notBound %v", deliver, notBound)
	}

	// Bounded: gen's cancel tombstones are a ring of 3 of its own; three
	// more, once the ring's tombstones are CancelTombMinAge old, forget
	// q's. (a stays stale: its refused Send left a finished tombstone.)
	now = now.Add(CancelTombMinAge)
	cancel("gen", "q")
	now = now.Add(CancelTombMinAge)
	for _, id := range []string{"x", "y", "z"} {
		cancel("gen", id)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "q")); v != RequestDataResolve {
		t.Fatalf("RequestData q once its tombstone was forgotten: %v", v)
	}
	// Another instance's Cancels, however many, and finished requests do
	// not push gen's out.
	now = now.Add(CancelTombMinAge)
	cancel("gen", "keep")
	for i := range 10 {
		now = now.Add(CancelTombMinAge)
		cancel("evil", fmt.Sprint("junk-", i))
		tb.Stopped(fmt.Sprint("done-", i))
	}
	if v, _ := tb.RequestData(rdFrom("gen", "keep")); v != RequestDataStale {
		t.Fatalf("RequestData keep after another instance's Cancels and finished requests: %v, want stale", v)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "z")); v != RequestDataStale {
		t.Fatalf("RequestData z: %v, want stale", v)
	}
}

// TestTxTable_YoungCancelTombstonesAreKept: a burst of Cancels for
// requests without a session, more than an instance's ring holds, does not
// forget a tombstone younger than CancelTombMinAge: the Cancel that finds
// no room is held (left unanswered, to be re-sent), and the RequestData of
// every acknowledged Cancel stays stale. Once the oldest has aged, the
// held Cancel gets its slot. The same for the table's instances: a new
// instance's Cancel waits while the oldest instance's ring is young.
// (Checked to fail: with the ring overwriting young slots, the burst's
// fourth Cancel was acknowledged and the first request's RequestData
// resolved — a session writing into blocks its sender had freed.)
func TestTxTable_YoungCancelTombstonesAreKept(t *testing.T) {
	tb := NewTxTable(3)
	cancel := func(inst, id string, at time.Time) (hold bool) {
		deliver, notBound, hold := tb.Cancel(&messages.Cancel{RequestID: id, Epoch: 1, From: messages.PeerID{Instance: inst}}, at)
		if deliver || notBound {
			t.Fatalf("Cancel %s: deliver %v notBound %v", id, deliver, notBound)
		}
		return hold
	}
	for i, id := range []string{"a", "b", "c"} {
		if cancel("gen", id, t0.Add(time.Duration(i)*time.Millisecond)) {
			t.Fatalf("Cancel %s held with room in the ring", id)
		}
	}
	if !cancel("gen", "d", t0.Add(time.Second)) {
		t.Fatal("Cancel d acknowledged while every slot held a tombstone 1 s old")
	}
	for _, id := range []string{"a", "b", "c"} {
		if v, _ := tb.RequestData(rdFrom("gen", id)); v != RequestDataStale {
			t.Fatalf("RequestData %s after the burst: %v, want stale", id, v)
		}
	}
	if cancel("gen", "a", t0.Add(2*time.Second)) {
		t.Fatal("a re-sent Cancel whose tombstone is held was not answered")
	}
	if cancel("gen", "d", t0.Add(CancelTombMinAge)) {
		t.Fatal("Cancel d held once a's tombstone aged")
	}
	if v, _ := tb.RequestData(rdFrom("gen", "d")); v != RequestDataStale {
		t.Fatalf("RequestData d: %v, want stale", v)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "b")); v != RequestDataStale {
		t.Fatalf("RequestData b, younger than a: %v, want stale", v)
	}

	// Instances: the table keeps maxCancelInstances rings.
	tb = NewTxTable(3)
	for i := range maxCancelInstances {
		if cancel(fmt.Sprint("gen", i), "r", t0) {
			t.Fatalf("instance %d's Cancel held", i)
		}
	}
	if !cancel("late", "r", t0.Add(time.Second)) {
		t.Fatal("a new instance's Cancel acknowledged by forgetting a young instance's ring")
	}
	if v, _ := tb.RequestData(rdFrom("gen0", "r")); v != RequestDataStale {
		t.Fatalf("RequestData r of the oldest instance: %v, want stale", v)
	}
	if cancel("late", "r", t0.Add(CancelTombMinAge)) {
		t.Fatal("the new instance's Cancel held once the oldest ring aged")
	}

	// The instance that goes is the one that cancelled least recently,
	// not the first known: gen0 cancelling every 10 s must not hold every
	// newcomer forever while the others' rings are old (a review found a
	// newcomer held 3,600 times in an hour).
	tb = NewTxTable(3)
	for i := range maxCancelInstances {
		cancel(fmt.Sprint("gen", i), "r", t0)
	}
	at := t0
	for i := range 6 {
		at = t0.Add(time.Duration(i+1) * 10 * time.Second)
		if cancel("gen0", fmt.Sprint("busy-", i), at) {
			t.Fatalf("gen0's own Cancel %d held", i)
		}
	}
	if cancel("newcomer", "n", at) {
		t.Fatal("a newcomer's Cancel held while 63 instances' rings are a minute old")
	}
	if v, _ := tb.RequestData(rdFrom("gen0", "busy-5")); v != RequestDataStale {
		t.Fatalf("RequestData of busy gen0's newest Cancel: %v, want stale", v)
	}
}

// TestTxTable_ForeignCancelBeforeSendFailsFast: Send naming no instance
// trusts the first instance to speak of the request, so another instance's
// Cancel before Send refuses it (ErrPeerCancelled); the request's own
// instance must then hear FAILED at once for its RequestData, not open a
// session that no Send adopts and wait for its deadline (a review found
// it waiting its full deadline).
func TestTxTable_ForeignCancelBeforeSendFailsFast(t *testing.T) {
	tb := NewTxTable(16)
	tb.Cancel(&messages.Cancel{RequestID: "e", Epoch: 1, From: messages.PeerID{Instance: "other"}}, t0)
	if _, err := tb.Open("e", ""); !errors.Is(err, ErrPeerCancelled) || !strings.Contains(err.Error(), "instance other") {
		t.Fatalf("Open e naming no instance after other's Cancel: %v, want ErrPeerCancelled naming other", err)
	}
	if v, _ := tb.RequestData(rdFrom("gen", "e")); v != RequestDataStale {
		t.Fatalf("RequestData e from its own instance after Send was refused: verdict %v, want stale (%v)", v, RequestDataStale)
	}
	if _, err := tb.Open("e", ""); !errors.Is(err, ErrPeerCancelled) {
		t.Fatalf("Open e again: %v, want ErrPeerCancelled still", err)
	}
}

// TestTxTable_OrphanBlocksBounded: an instance's orphans are bounded by
// the destination blocks their RequestData name too, not only by their
// count — 4096 orphans of 1M ids each held ~31 GiB (a review) — and
// blocks come back when Send adopts an orphan or it stops.
func TestTxTable_OrphanBlocksBounded(t *testing.T) {
	tb := NewTxTable(16)
	tb.SetOrphanLimit(2) // 2 orphans, 2 × OrphanBlocksEach ids
	big := func(inst, id string, n int) *messages.RequestData {
		rd := rdFrom(inst, id)
		rd.Groups = []messages.GroupDest{{Blocks: make([]int32, n/2)}, {Blocks: make([]int32, n-n/2)}}
		return rd
	}
	orphan := func(rd *messages.RequestData) {
		t.Helper()
		if v, _ := tb.RequestData(rd); v != RequestDataResolve {
			t.Fatalf("RequestData %s (%d blocks): verdict %v, want resolve", rd.RequestID, DestBlocks(rd), v)
		}
		if refuse, spawn := tb.Resolved(rd, nil); refuse || !spawn {
			t.Fatalf("Resolved %s: refuse %v spawn %v", rd.RequestID, refuse, spawn)
		}
	}
	orphan(big("gen", "a", OrphanBlocksEach+1))
	if n := tb.OrphanBlocks("gen"); n != OrphanBlocksEach+1 {
		t.Fatalf("OrphanBlocks = %d, want %d", n, OrphanBlocksEach+1)
	}
	if v, _ := tb.RequestData(big("gen", "b", OrphanBlocksEach)); v != RequestDataShed {
		t.Fatalf("a second orphan past the instance's blocks: verdict %v, want shed (%v)", v, RequestDataShed)
	}
	orphan(big("other", "c", OrphanBlocksEach))    // another instance's budget
	orphan(big("gen", "d", OrphanBlocksEach-1))    // fits exactly
	if _, err := tb.Open("a", "gen"); err != nil { // adopted: no longer an orphan
		t.Fatal(err)
	}
	if n := tb.OrphanBlocks("gen"); n != OrphanBlocksEach-1 {
		t.Fatalf("OrphanBlocks after Send adopted a = %d, want %d", n, OrphanBlocksEach-1)
	}
	tb.Stopped("d")
	if n := tb.OrphanBlocks("gen"); n != 0 || tb.Orphans("gen") != 0 {
		t.Fatalf("after d stopped: %d orphans naming %d blocks, want none", tb.Orphans("gen"), n)
	}
	orphan(big("gen", "b", 2*OrphanBlocksEach))
}

// A Send after a Cancel that came before any session had its request is
// refused naming the Cancel's reason: a generation rank whose RequestData
// the control plane refused for good (past this writer's frame limit)
// says why in its Cancel, and the serving process's Send must say it too,
// not only that the request was cancelled (as a session the Cancel finds
// does: TestTx_PeerCancelBeforeRequestNamesItsReason).
func TestTxTable_OpenAfterCancelNamesItsReason(t *testing.T) {
	tb := NewTxTable(3)
	const why = `actors: control frame not sent: request a: RequestData for writer ctx/0 refused: control/zmq: frame too large: 960 bytes exceeds the peer's MaxFrameBytes 768`
	for i, reason := range []string{why, "a re-sent Cancel's"} { // the first reason given is kept
		deliver, notBound, hold := tb.Cancel(&messages.Cancel{RequestID: "a", Epoch: 1, From: messages.PeerID{Instance: "gen"}, Reason: reason}, t0)
		if deliver || notBound || hold {
			t.Fatalf("Cancel %d of a without a session: deliver %v notBound %v hold %v, want answered at once", i, deliver, notBound, hold)
		}
	}
	if _, _, hold := tb.Cancel(&messages.Cancel{RequestID: "b", Epoch: 1, From: messages.PeerID{Instance: "gen"}}, t0); hold {
		t.Fatal("Cancel of b held")
	}
	for _, gen := range []string{"", "gen"} {
		_, err := tb.Open("a", gen)
		if !errors.Is(err, ErrPeerCancelled) || !strings.Contains(err.Error(), "before Send") || !strings.Contains(err.Error(), strconv.Quote(why)) {
			t.Fatalf("Open a naming %q after a Cancel saying why: %v, want ErrPeerCancelled naming its reason %q", gen, err, why)
		}
		// Without a reason, the error says none.
		if _, err := tb.Open("b", gen); !errors.Is(err, ErrPeerCancelled) || strings.Contains(err.Error(), "reason") {
			t.Fatalf("Open b naming %q after a Cancel without a reason: %v", gen, err)
		}
	}
}
