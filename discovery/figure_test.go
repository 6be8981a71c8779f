package discovery

import (
	"flag"
	"slices"
	"testing"
	"time"
)

var (
	deathRounds = flag.Int("death-rounds", 5, "TestDeathToDownFigure: rounds")
	deathTTL    = flag.Duration("death-ttl", time.Second, "TestDeathToDownFigure: lease TTL")
)

// TestDeathToDownFigure measures the time from a rank's death (its etcd
// client closed: no revoke, no leave) to its peer's Down through lease
// expiry, over -death-rounds rounds, and logs the median with the TTL:
//
//	go test -count=1 -run TestDeathToDownFigure -v ./discovery
//
// It asserts no timing, only that every death is seen as a lease expiry.
// The rank dies right after it registered, that is right after a lease
// renewal: the worst phase, so the figure is TTL plus up to 500 ms (etcd
// looks for expired leases twice a second). A rank that dies later in its
// renewal period (the client renews every TTL/3) goes down up to TTL/3
// sooner.
func TestDeathToDownFigure(t *testing.T) {
	cluster := clusterName(t)
	watcher := newEtcdRegistry(t, cluster)
	var took []time.Duration
	for round := 1; round <= *deathRounds; round++ {
		cli := newClient(t)
		victim := newEtcdRegistry(t, cluster, WithClient(cli), WithTTL(*deathTTL))
		inc := uint64(round)
		if err := victim.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, inc)); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, watcher, waitFor, "victim up", isUp("ctx", 0, inc))
		start := time.Now()
		cli.Close()
		ev := waitEvent(t, watcher, *deathTTL+waitFor, "victim down", isDown("ctx", 0, inc))
		took = append(took, time.Since(start))
		if ev.Reason != ReasonLeaseExpired {
			t.Fatalf("round %d: reason %q, want %q", round, ev.Reason, ReasonLeaseExpired)
		}
		_ = victim.Close()
	}
	slices.Sort(took)
	t.Logf("death to peer Down via lease expiry: TTL %v, %d rounds: median %v, min %v, max %v (all %v)",
		*deathTTL, len(took), took[len(took)/2].Round(time.Millisecond), took[0].Round(time.Millisecond),
		took[len(took)-1].Round(time.Millisecond), took)
}
