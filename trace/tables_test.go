package trace_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
	"github.com/kvxfer/kvxfer/trace"
)

// requireTables checks that a replayed trace holds the tables of every
// parent, listener and worker of each engine, that the ones a transfer
// must use made calls (want: table kind → least calls, summed over the
// engine's actors of that kind), and that every call's outputs matched.
func requireTables(t *testing.T, path string, res *trace.Result, want map[string]int) {
	t.Helper()
	calls := map[string]int{}
	kinds := map[string]int{}
	for _, tb := range res.Tables {
		calls[tb.Kind] += tb.Calls
		kinds[tb.Kind]++
		if tb.Diverged {
			t.Errorf("%s: table %s diverged", path, tb.Actor)
		}
	}
	for _, k := range []string{actors.TableTx, actors.TableRx, actors.TableAlloc, actors.TableRoute, actors.TableWorker} {
		if kinds[k] < res.Engines {
			t.Errorf("%s: %d %s tables for %d engines", path, kinds[k], k, res.Engines)
		}
	}
	for k, n := range want {
		if calls[k] < n {
			t.Errorf("%s: %d calls on %s tables, want at least %d", path, calls[k], k, n)
		}
	}
	if res.CallsMatched != len(res.Tables)+res.Calls || res.Calls == 0 {
		t.Errorf("%s: %d tables + %d calls, %d matched", path, len(res.Tables), res.Calls, res.CallsMatched)
	}
}

// TestReplayTables records the in-process scenarios and checks that the
// parents', listeners' and workers' steps are in the traces and replay
// through the real tables with every output as recorded.
func TestReplayTables(t *testing.T) {
	ctxTrace, genTrace := recordScenarios(t)
	for path, want := range map[string]map[string]int{
		// 7 requests sent, 6 RequestData; 13 ops admitted and settled.
		ctxTrace: {actors.TableTx: 7 + 6 + 6 + 7, actors.TableRoute: 6, actors.TableWorker: 13 + 13},
		// 6 requests received and started, 6 Results routed.
		genTrace: {actors.TableRx: 6 * 4, actors.TableAlloc: 6, actors.TableRoute: 6},
	} {
		res := replayFile(t, path)
		requireIdentical(t, path, res)
		requireTables(t, path, res, want)
		var b strings.Builder
		res.Print(&b)
		if !strings.Contains(b.String(), "every output matched") {
			t.Errorf("%s: printed result does not report the tables:\n%s", path, b.String())
		}
		t.Logf("%s: %d tables, %d calls replayed identically", filepath.Base(path), len(res.Tables), res.Calls)
	}
}

// TestReplayFindsTableCorruption changes one input (or the clock) of one
// recorded parent, listener or worker step at a time and checks that
// replay reports the divergence at that record — actor, sequence, method
// and the output that came out differently. Were the table records
// ignored, no divergence would be found.
func TestReplayFindsTableCorruption(t *testing.T) {
	ctxTrace, genTrace := recordScenarios(t)
	msg := func(l line) map[string]any { return l["msg"].(map[string]any) }
	out := func(l line) map[string]any { o, _ := l["out"].(map[string]any); return o }
	cases := []struct {
		name, path, actor, method string
		pick                      func(l line) bool
		apply                     func(l line)
		field                     string
	}{
		{name: "tx parent: Send of a request already sent", path: ctxTrace, actor: "ctx/0/tx", method: "Open",
			pick:  func(l line) bool { return out(l)["Err"] == nil && msg(l)["Request"] != "ok-0" },
			apply: func(l line) { msg(l)["Request"] = "ok-0" }, field: "out."},
		{name: "tx parent: a Cancel from another instance", path: ctxTrace, actor: "ctx/0/tx", method: "Cancel",
			pick: func(l line) bool { return out(l)["Deliver"] == true },
			apply: func(l line) {
				msg(l)["Cancel"].(map[string]any)["From"].(map[string]any)["Instance"] = "stranger"
			}, field: "out."},
		{name: "worker: submit to an unknown peer", path: ctxTrace, actor: "ctx/0/worker-0", method: "Endpoint",
			pick:  func(l line) bool { return out(l)["Open"] == true },
			apply: func(l line) { msg(l)["Key"] = "c3RyYW5nZXI=" }, field: "out.Open"},
		{name: "listener: a frame that fails validation", path: genTrace, actor: "gen/0/listener", method: "RouteFrame",
			pick: func(l line) bool { return msg(l)["Frame"].(map[string]any)["Type"] == "Result" },
			apply: func(l line) {
				msg(l)["Frame"].(map[string]any)["Result"].(map[string]any)["RequestID"] = ""
			}, field: "out."},
		{name: "rx parent: a Result from a peer that is not a writer", path: genTrace, actor: "gen/0/rx", method: "Route",
			pick: func(l line) bool {
				return out(l)["Verdict"] == json.Number("1") && msg(l)["Frame"].(map[string]any)["Type"] == "Result"
			},
			apply: func(l line) {
				msg(l)["Frame"].(map[string]any)["Result"].(map[string]any)["From"].(map[string]any)["Rank"] = 7
			}, field: "out.Verdict"},
		{name: "rx parent: the writer of an invalid Result", path: genTrace, actor: "gen/0/rx", method: "Lookup",
			pick: func(l line) bool { return out(l)["Verdict"] == json.Number("1") },
			apply: func(l line) {
				msg(l)["Frame"].(map[string]any)["Result"].(map[string]any)["From"].(map[string]any)["Rank"] = 7
			}, field: "out.Verdict"},
		{name: "rx parent: the clock a Start read", path: genTrace, actor: "gen/0/rx", method: "Start",
			pick:  func(l line) bool { return out(l)["Err"] == nil },
			apply: func(l line) { l["t"] = json.Number("1000000000") }, field: "out.Epoch"},
		{name: "allocation queue: the pool refuses", path: genTrace, actor: "gen/0/rx/queue", method: "Drain",
			pick: func(l line) bool {
				a, _ := msg(l)["Allocs"].([]any)
				return out(l)["Started"] != nil && len(a) > 0 && a[0].(map[string]any)["Err"] == nil
			},
			apply: func(l line) {
				a := msg(l)["Allocs"].([]any)[0].(map[string]any)
				delete(a, "Blocks")
				a["Err"] = "injected: pool broken"
			}, field: "out.Started"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lines := readLines(t, tc.path)
			at := -1
			for i, l := range lines {
				if l["kind"] == "call" && l["actor"] == tc.actor && l["type"] == tc.method && tc.pick(l) {
					at = i
					break
				}
			}
			if at < 0 {
				t.Fatalf("no %s call on %s in %s", tc.method, tc.actor, tc.path)
			}
			seq := seqOf(lines[at])
			tc.apply(lines[at])
			bad := filepath.Join(t.TempDir(), "bad.jsonl")
			writeLines(t, bad, lines)
			res := replayFile(t, bad)
			d := res.Divergence
			if d == nil {
				t.Fatalf("replay of a trace with an edited %s call found no divergence", tc.method)
			}
			if d.Actor != tc.actor || d.Seq != seq || d.Type != tc.method || d.Line != at+1 || !strings.HasPrefix(d.Field, tc.field) {
				t.Fatalf("divergence %v; want %s seq %d %s line %d field %s…", d, tc.actor, seq, tc.method, at+1, tc.field)
			}
			if d.Expected == d.Got || d.Input == "" {
				t.Errorf("divergence does not show what differs: %+v", d)
			}
			if res.Diverged != 1 {
				t.Errorf("%d actors diverged, want 1", res.Diverged)
			}
			var b strings.Builder
			res.Print(&b)
			for _, s := range []string{"DIVERGED", tc.actor, tc.method, "input"} {
				if !strings.Contains(b.String(), s) {
					t.Errorf("printed result does not name %q:\n%s", s, b.String())
				}
			}
			t.Logf("%s: %v", tc.name, d)
		})
	}
}

// TestReplayVersion1 replays traces the version-1 writer recorded (before
// the format had parent and worker records): every session replays as it
// was recorded — but for the steps whose behaviour changed since: issue 17
// (a cancel quarantines) and the context side's DONE, which now waits for
// the worker's report that the Result left (TxSent, a message those traces
// do not have) — and there are no tables.
func TestReplayVersion1(t *testing.T) {
	for path, want := range map[string]map[string]string{
		// The successful context sessions stop at their divergence (below),
		// waiting for a TxSent the trace does not have.
		"testdata/v1-ctx.jsonl": {"ok-0": "TRANSFERRING", "ok-1": "TRANSFERRING", "ok-2": "TRANSFERRING", "ok-3": "TRANSFERRING",
			"cancelled": "CANCELLED", "bad-fence": "FAILED", "orphan": "CANCELLED"},
		"testdata/v1-gen.jsonl": {"ok-0": "READY", "ok-1": "READY", "ok-2": "READY", "ok-3": "READY", "cancelled": "CANCELLED", "bad-fence": "FAILED"},
	} {
		res := replayFile(t, path)
		if path == "testdata/v1-gen.jsonl" {
			// Recorded before issue 17: a cancel the writer had not acked
			// then freed the request's blocks; the real step now
			// quarantines them until the ack. Replay must find exactly
			// that change, on that session, and nothing else.
			d := res.Divergence
			if d == nil || !strings.Contains(d.Session, "rx cancelled") || d.Type != "RxCancel" || d.Got != "core.QuarantineDest" {
				var b strings.Builder
				res.Print(&b)
				t.Fatalf("%s: want the one divergence of issue 17 (RxCancel now quarantines), got:\n%s", path, b.String())
			}
		} else {
			// Recorded before TxSent: the flush that used to make a
			// session DONE now leaves it waiting for the report that its
			// Result left. Replay must find exactly that change, on the
			// successful sessions, and one more on the session cancelled
			// while its op waited for its fence: the op, never submitted,
			// now settles at the cancel, so its CancelAck leaves then,
			// not at the fence.
			d := res.Divergence
			if d == nil || !strings.Contains(d.Session, "tx ok-") || d.Type != "TxFlushed" || d.Field != "state" ||
				d.Expected != "DONE" || d.Got != "TRANSFERRING" {
				var b strings.Builder
				res.Print(&b)
				t.Fatalf("%s: want the one divergence of TxSent (DONE waits for the Result to leave), got:\n%s", path, b.String())
			}
			for _, s := range res.Sessions {
				if s.Diverged != (strings.HasPrefix(s.Request, "ok-") || s.Request == "cancelled") {
					t.Errorf("%s: session %s diverged=%v", path, s.Request, s.Diverged)
				}
			}
		}
		got := map[string]string{}
		for _, s := range res.Sessions {
			got[s.Request] = s.State
		}
		if len(got) != len(want) {
			t.Errorf("%s: sessions %v, want %v", path, got, want)
		}
		for id, st := range want {
			if got[id] != st {
				t.Errorf("%s: %s ended %q, want %q", path, id, got[id], st)
			}
		}
		if len(res.Tables) != 0 || res.Calls != 0 {
			t.Errorf("%s: a version-1 trace replayed %d tables, %d calls", path, len(res.Tables), res.Calls)
		}
	}
}

// TestReplayResultOfANewerStatus: a Result whose status this build does
// not define (a newer writer's) reaches the listener, whose RouteFrame
// refuses it naming the status that came ("result status 9"). The trace
// kept the frame without that status, so replay's RouteFrame named
// status 0 and diverged at out.Err on a faithful recording.
func TestReplayResultOfANewerStatus(t *testing.T) {
	const status = 9
	b, err := proto.Marshal(&pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Result{Result: &pb.Result{
		RequestId: "r1", Epoch: 3, From: &pb.PeerID{Instance: "ctx"}, Status: status}}})
	if err != nil {
		t.Fatal(err)
	}
	var inv *messages.InvalidFrame
	if _, err := messages.Decode(b); !errors.As(err, &inv) {
		t.Fatalf("decode a Result of status %d: %v, want an InvalidFrame", status, err)
	}
	var buf bytes.Buffer
	w := trace.NewWriter(&buf)
	tr := w.Table(messages.PeerID{Instance: "gen", Rank: 0}, "listener", actors.TableRoute, actors.TableBirth{}, time.Unix(1, 0))
	dest, rerr := core.RouteFrame(inv.Frame)
	if want := fmt.Sprintf("result status %d", status); rerr == nil || !strings.Contains(rerr.Error(), want) {
		t.Fatalf("RouteFrame: %v, want an error naming %q", rerr, want)
	}
	tr.Call("RouteFrame", time.Unix(2, 0), actors.TableIn{Frame: inv.Frame}, actors.TableOut{Dest: int(dest), Err: actors.ErrText(rerr)})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := trace.Replay(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Identical() || res.Calls != 1 {
		var p strings.Builder
		res.Print(&p)
		t.Fatalf("replay of a Result of status %d (%d calls):\n%s", status, res.Calls, p.String())
	}
}

// TestReplayChecksTheDownSetALateFrameClears: a writer declared down
// (Engine.PeerDown) whose frame comes late — after its request failed on
// the suspicion — leaves the down set on that frame, and the rx parent
// tells its requests it is heard. The trace must say so: the first Route
// after the PeerDown records its sender down, and replay compares it (a
// recording whose table had not marked the writer down diverges there).
// Before, the Route record held no down bit, and the frame cleared the
// mark before any recorded output showed it: a build that no longer
// marked the writer down replayed such a trace "identical". A trace of a
// build before the bit (none recorded) still replays identically.
func TestReplayChecksTheDownSetALateFrameClears(t *testing.T) {
	dir := t.TempDir()
	tp1 := kvcache.Parallel{TP: 1, PP: 1}
	c := startCluster(t, tp1, tp1, dir, nil)
	r := &request{c: c, id: "late", pl: 32}
	c.receive(t, r)
	checkFor(t, 10*time.Second, func() bool { return c.link.requestData(r.id) != nil })
	writer := c.ctx[0].Hello().From
	c.gen[0].PeerDown(writer)
	if o := wait(t, r.rxs[0].Done()); o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
		t.Fatalf("%s after its writer was declared down: %s %v", r.id, o.Status, o.Err)
	}
	conn, err := c.link.Dial(c.gen[0].Hello().From)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Send(&messages.Result{RequestID: r.id, Epoch: c.link.requestData(r.id).Epoch, From: writer,
		Status: messages.StatusSuccess}); err != nil {
		t.Fatal(err)
	}
	// The link handed the Result to the rx parent's mailbox: a question
	// the parent answers after it has routed it.
	if _, err := c.gen[0].WriterRequests(writer, 0); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, func() bool { return c.gen[0].Pools().Used()+c.gen[0].Pools().Quarantined() == 0 })
	c.close(t)

	path := filepath.Join(dir, "gen-0.jsonl")
	lines := readLines(t, path)
	const rx = "gen/0/rx"
	down, first, result := -1, -1, -1
	for i, l := range lines {
		if l["kind"] != "call" || l["actor"] != rx {
			continue
		}
		switch {
		case l["type"] == "PeerDown":
			down = i
		case l["type"] == "Route" && down >= 0:
			if first < 0 {
				first = i
			}
			if l["msg"].(map[string]any)["Frame"].(map[string]any)["Type"] == "Result" {
				result = i
			}
		}
	}
	if down < 0 || first < 0 || result < 0 {
		t.Fatalf("%s: PeerDown at line %d, first Route after it at line %d, the late Result's at line %d: want all three", path, down+1, first+1, result+1)
	}
	out := func(i int) map[string]any { o, _ := lines[i]["out"].(map[string]any); return o }
	if out(first)["Down"] != true {
		t.Fatalf("line %d: the first Route after the writer was declared down records %v, want Down true (the frame takes it out of the down set)", first+1, out(first))
	}
	if first != result && out(result)["Down"] != false {
		t.Errorf("line %d: the late Result's Route, the writer heard before it, records %v, want Down false", result+1, out(result))
	}
	requireIdentical(t, path, replayFile(t, path))

	out(first)["Down"] = false // a recording whose table had not marked the writer down
	edited := filepath.Join(t.TempDir(), "edited.jsonl")
	writeLines(t, edited, lines)
	res := replayFile(t, edited)
	if d := res.Divergence; d == nil || d.Actor != rx || d.Type != "Route" || d.Line != first+1 || d.Field != "out.Down" {
		var b strings.Builder
		res.Print(&b)
		t.Fatalf("a Route recorded with its down sender not down: divergence %+v, want %s Route at line %d, field out.Down:\n%s", d, rx, first+1, b.String())
	}

	for i, l := range lines {
		if l["kind"] == "call" && l["type"] == "Route" {
			delete(out(i), "Down") // as a build before the bit recorded it
		}
	}
	writeLines(t, edited, lines)
	requireIdentical(t, edited, replayFile(t, edited))
}
