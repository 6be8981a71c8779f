package actors

import (
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestParentsTakeSessionStoppedOnlyFromTheSession: a sessionStopped that
// is not from the session a parent's table holds for its request (a second
// one: a session whose Finish or Stop a panic interrupted runs it again,
// and the first may have left; by then the id may be another session's)
// changes nothing. Taken, it would have the tx parent poison a live session
// (its pins held for good, its handle given a false outcome) and the rx
// parent forget one (Close would not wait for it). Checked to fail without
// the parents' check: both sessions vanish from the parents' lists.
func TestParentsTakeSessionStoppedOnlyFromTheSession(t *testing.T) {
	r := startTestRank(t, "solo", control.NewMemLink())
	if _, err := r.e.Send(TxRequest{ID: "tx-live", PromptLen: 32, Deadline: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.e.Receive(RxRequest{ID: "rx-live", PromptLen: 32, Context: "nobody", ContextParallel: kvcache.Parallel{TP: 1, PP: 1},
		Deadline: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	stale := actor.NewPID("nonhost", "$stale")
	r.e.sys.Root.Send(r.e.tx, &sessionStopped{request: "tx-live", session: stale, outcome: Outcome{Request: "tx-live", Status: StatusDone, OK: true}})
	r.e.sys.Root.Send(r.e.rx, &sessionStopped{request: "rx-live", session: stale})
	for _, p := range []struct {
		pid  *actor.PID
		want string
	}{{r.e.tx, "tx:tx-live"}, {r.e.rx, "rx:rx-live"}} {
		got, err := r.e.sys.Root.RequestFuture(p.pid, &listSessions{}, 10*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(got.([]string), p.want) {
			t.Fatalf("sessions %v after a stale sessionStopped, want %s still there", got, p.want)
		}
	}
}
