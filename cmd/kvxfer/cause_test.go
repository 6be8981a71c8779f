package main

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/internal/proc"
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
