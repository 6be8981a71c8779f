package main

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/internal/proc"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestRunCauseNamesThisProcessFirst: when this process's node failed (it
// lost its etcd membership) and the peer went down too (an etcd both
// lost), the run's cause names this process's failure, not the peer's (a
// review: gen's last line quoted ctx's membership loss); settings that
// differ still come first, and a peer's death alone is named as before.
func TestRunCauseNamesThisProcessFirst(t *testing.T) {
	lost := "node: membership lost: gen/0 in etcd cluster c3: keepalive stopped"
	if got := runCause(proc.Report{NodeFailed: lost, PeerDownMidRun: true}, "ctx"); !strings.Contains(got, "this process's node failed: "+lost) {
		t.Errorf("cause with this node failed and the peer down: %q", got)
	}
	if got := runCause(proc.Report{SettingsMismatch: "different request lists", NodeFailed: lost}, "ctx"); !strings.HasPrefix(got, "different request lists") {
		t.Errorf("cause with the settings differing: %q", got)
	}
	if got := runCause(proc.Report{PeerDownMidRun: true}, "ctx"); !strings.Contains(got, "the ctx process went down") {
		t.Errorf("cause with the peer down alone: %q", got)
	}
}

// TestRunCauseNamesTheCounts: a peer that went down mid-run may have been
// started with fewer --requests (kvxfer gen --requests 6 beside kvxfer ctx
// --requests 8 leaves after its 6, and ctx sees only a peer going down:
// gen never tells its count); the cause names how many of this process's
// requests succeeded before, and the flag. (Checked to fail without the
// counts: the cause said only "the gen process went down (...) before the
// run finished".)
func TestRunCauseNamesTheCounts(t *testing.T) {
	got := runCause(proc.Report{PeerDownMidRun: true, PeerClosed: true, Requests: 8, OK: 6, Failed: 2}, "gen")
	if want := "before the run finished, after 6 of this process's 8 requests succeeded (a gen process given fewer --requests also leaves then"; !strings.Contains(got, want) {
		t.Errorf("cause %q, want %q", got, want)
	}
}

// TestRunCauseHintsAtRequestsOnlyForAGoodbye: a peer that went down
// mid-run without a goodbye (killed, crashed, frozen: it never ran out
// of requests) gets the counts but no --requests hint; one whose goodbye
// named the error it exits on is named by it, first, with no hint.
// (Checked to fail before: the hint came with every down, and the
// goodbye's reason was not named.)
func TestRunCauseHintsAtRequestsOnlyForAGoodbye(t *testing.T) {
	killed := runCause(proc.Report{PeerDownMidRun: true, Requests: 8, OK: 6, Failed: 2}, "gen")
	if !strings.Contains(killed, "the gen process went down") || !strings.Contains(killed, "after 6 of this process's 8 requests succeeded") ||
		strings.Contains(killed, "--requests") {
		t.Errorf("cause for a peer down without a goodbye: %q; want the counts and no --requests hint", killed)
	}
	why := "gen/0: node: peer said nothing (no Hello within 2s): ctx/0 at ipc://ctx.sock: a Hello came from ctx2/0, which is not a peer of this engine"
	got := runCause(proc.Report{PeerDownMidRun: true, PeerClosed: true, PeerReason: why, Requests: 8, Failed: 8}, "gen")
	if want := "the gen process exited on an error it found, as its goodbye said: " + why; !strings.HasPrefix(got, want) || strings.Contains(got, "--requests") {
		t.Errorf("cause for a peer that exited naming an error: %q; want it to lead with %q, no --requests hint", got, want)
	}
	if !ctxRunFailed(proc.Report{Role: "ctx", Requests: 8, OK: 8, PeerReason: why}) {
		t.Error("a ctx run whose peer exited naming an error exits 0")
	}
}

// TestCtxRunFailsOnAnOrphan: kvxfer ctx exits non-zero when its run named
// requests the generation process asked for past its --requests
// (proc.RunCtx's SettingsMismatch), though every request it made
// succeeded; the message leads with it. (Checked to fail with the exit
// decided on failed requests and leaked blocks alone, as before.)
func TestCtxRunFailsOnAnOrphan(t *testing.T) {
	cause := "the generation process asked for req-8, past this process's --requests 8; give both roles the same --requests"
	rep := proc.Report{Role: "ctx", Requests: 8, OK: 8, SettingsMismatch: cause}
	if !ctxRunFailed(rep) {
		t.Fatalf("ctx run %+v: exits 0", rep)
	}
	if got := runCause(rep, "gen"); !strings.HasPrefix(got, cause) {
		t.Errorf("cause %q, want it to lead with %q", got, cause)
	}
	if ctxRunFailed(proc.Report{Role: "ctx", Requests: 8, OK: 8}) {
		t.Error("a run where every request succeeded and nothing else is named fails")
	}
}

// TestRunCauseNamesTheModelFlag: a peer that serves another model fails
// every request at its Hello; the run's message names each side's model,
// as the report keeps them (proc.Report.PeerModel, OwnModel), and says to
// give both the same --model. A report without them (one model laid out
// two ways: the engine names --tokens-per-block itself) is not called a
// model mismatch. (Checked to fail without the case: the message named
// the two models in the engine's words, without the flag.)
func TestRunCauseNamesTheModelFlag(t *testing.T) {
	self := actors.Topology{Layout: kvcache.Layout{Name: "Llama-3.1-8B", TokensPerBlock: 32}, LayoutHash: 1}
	other := actors.LayoutMismatch(self, &messages.Hello{From: messages.PeerID{Instance: "gen"}, Model: "Qwen3-8B", LayoutHash: 2})
	rep := proc.Report{Role: "ctx", Requests: 2, Failed: 2, FirstError: "req-0: node: gen/0 at ipc://g.sock: " + other.Error(),
		PeerModel: "Qwen3-8B", OwnModel: "Llama-3.1-8B"}
	want := "the gen process runs --model Qwen3-8B, this one --model Llama-3.1-8B: give both the same --model: "
	if got := runCause(rep, "gen"); got != want {
		t.Errorf("cause %q, want %q", got, want)
	}
	same := actors.LayoutMismatch(self, &messages.Hello{From: messages.PeerID{Instance: "gen"}, Model: "Llama-3.1-8B", LayoutHash: 2})
	if got := runCause(proc.Report{FirstError: "req-0: " + same.Error()}, "gen"); strings.Contains(got, "--model") {
		t.Errorf("one model laid out two ways: cause %q names --model", got)
	}
}
