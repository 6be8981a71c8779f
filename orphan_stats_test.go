package kvxfer_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer"
)

// TestStatsCountOrphanRequests: a context engine's Stats, OrphanIDs and
// metrics say when the generation side asked for a request no Send here
// took: OrphanRequests (kvxfer_orphan_requests) while it waits,
// OrphansEnded (kvxfer_orphan_requests_ended_total) once it ended
// unadopted (here the generation side cancelled it), its id named all
// along; a request Send took, whichever side came first, counts in
// neither. (A context process given fewer --requests than its
// generation peer had no way to see the requests past its own.)
func TestStatsCountOrphanRequests(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ce, ge := c.ctx[0], c.gen[0]
	f := begin(t, c, l, "req-0", 100, 32) // Receive first, then Send
	f.fire()
	if tx, rx := f.wait(t); !tx.OK || !rx.OK {
		t.Fatalf("req-0: tx %s %v, rx %s %v", tx.Status, tx.Err, rx.Status, rx.Err)
	}
	if st := ce.Stats(); st.OrphanRequests != 0 || st.OrphansEnded != 0 || ce.OrphanIDs() != nil {
		t.Fatalf("after a request Send took: orphans %d, ended %d, ids %v", st.OrphanRequests, st.OrphansEnded, ce.OrphanIDs())
	}
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "req-8", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "req-8 counted an orphan", func() bool {
		st := ce.Stats()
		return st.OrphanRequests == 1 && st.OrphansEnded == 0 && slices.Equal(ce.OrphanIDs(), []string{"req-8"}) &&
			scrape(t, ce, "ctx/0").get(t, "kvxfer_orphan_requests") == 1
	})
	rx.Cancel()
	if o := waitOutcome(t, rx.Done()); o.OK {
		t.Fatalf("req-8 cancelled, yet %s", o.Status)
	}
	eventually(t, "req-8 counted an orphan that ended", func() bool {
		st := ce.Stats()
		s := scrape(t, ce, "ctx/0")
		return st.OrphanRequests == 0 && st.OrphansEnded == 1 && slices.Equal(ce.OrphanIDs(), []string{"req-8"}) &&
			s.get(t, "kvxfer_orphan_requests") == 0 && s.get(t, "kvxfer_orphan_requests_ended_total") == 1
	})
	if st := ge.Stats(); st.OrphanRequests != 0 || st.OrphansEnded != 0 || ge.OrphanIDs() != nil {
		t.Fatalf("the generation engine counts orphans: %d, ended %d, ids %v", st.OrphanRequests, st.OrphansEnded, ge.OrphanIDs())
	}
}
