//go:build kvxfer_invariants

package kvxfer_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
)

// TestWorkerCrashWhileConnecting: the worker crashes while its Connect to
// instance A hangs. A's op was never posted, so it is refused at once (not
// left in doubt with no endpoint to retire it): the request fails with the
// crash and its pins drop. Once the Connect returns, the restarted worker
// serves A again.
func TestWorkerCrashWhileConnecting(t *testing.T) {
	s := newSlowConnect(t)
	a := s.send("a", s.ga)
	s.connecting()
	s.ce.CrashWorker(0)
	// The crash may reach the outcome first hand, or through the peer's
	// report of the failure the context side sent it.
	if tx, rx := s.outcomes(a); tx.OK || rx.OK || !strings.Contains(fmt.Sprint(tx.Err), actors.ErrWorkerCrashed.Error()) {
		t.Fatalf("request a: %s %v / %s, want FAILED by the worker crash on both sides", tx.Status, tx.Err, rx.Status)
	}
	s.release()
	if tx, rx := s.outcomes(s.send("a2", s.ga)); !tx.OK || !rx.OK {
		t.Fatalf("request a2 after the restart: %s %v / %s %v", tx.Status, tx.Err, rx.Status, rx.Err)
	}
	s.noLeaks()
}
