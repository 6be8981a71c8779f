package discovery

import (
	"context"
	"fmt"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// testRecord is a valid record of instance/rank at incarnation inc.
func testRecord(instance string, rank int32, inc uint64) Record {
	return Record{Instance: instance, Rank: rank, Incarnation: inc,
		ControlEndpoint: "tcp://127.0.0.1:" + string(rune('0'+rank%10)) + "5555",
		CurvePublicKey:  "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
		Backend:         "shm", AgentAddr: []byte("agent-" + instance),
		LayoutHash: 0xfeedface12345678, Parallel: messages.Parallel{TP: 2, PP: 1}, TP: rank % 2}
}

var clusters atomic.Int64

// clusterName is a cluster of the test's own (also under -count=N, where
// one etcd serves every run).
func clusterName(t testing.TB) string {
	return fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "-", "#", "-").Replace(t.Name()), clusters.Add(1))
}

// waitEvent reads events until match accepts one, within d; it fails the
// test (listing what came) otherwise.
func waitEvent(t testing.TB, r Registry, d time.Duration, what string, match func(Event) bool) Event {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	var seen []string
	for {
		select {
		case ev, ok := <-r.Events():
			if !ok {
				t.Fatalf("waiting for %s: events closed (err %v) after %v", what, r.Err(), seen)
			}
			if match(ev) {
				return ev
			}
			seen = append(seen, ev.String())
		case <-deadline.C:
			t.Fatalf("no %s within %v; saw %v", what, d, seen)
		}
	}
}

func isUp(instance string, rank int32, inc uint64) func(Event) bool {
	return func(e Event) bool {
		return e.Kind == EventUp && e.Record.Instance == instance && e.Record.Rank == rank && e.Record.Incarnation == inc
	}
}

func isDown(instance string, rank int32, inc uint64) func(Event) bool {
	return func(e Event) bool {
		return e.Kind == EventDown && e.Instance == instance && e.Rank == rank && e.Incarnation == inc
	}
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// poll checks cond every few milliseconds until it holds, within d.
func poll(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("no %s within %v", what, d)
		}
	}
}

// adminRegister writes r as a registration does (the rank's incarnation
// key and its record under lease, in one transaction), bypassing Register.
func adminRegister(t testing.TB, c *clientv3.Client, cluster string, r Record, lease clientv3.LeaseID) {
	t.Helper()
	v, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Txn(ctxFor(t, 10*time.Second)).Then(
		clientv3.OpPut(IncarnationKey(cluster, r.Instance, r.Rank), string(registration{Incarnation: r.Incarnation, Lease: int64(lease)}.encode())),
		clientv3.OpPut(Key(cluster, r.Instance, r.Rank), string(v), clientv3.WithLease(lease))).Commit()
	if err != nil {
		t.Fatal(err)
	}
}
