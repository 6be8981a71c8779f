package discovery

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdClusterLargerThanTheQueueStarts: a rank that starts in a
// cluster of more ranks than the event queue's bound (DefaultEventQueue,
// the bound every node runs with) reads one Up per rank and registers,
// while its consumer reads every event as it comes: the bound is on a
// consumer that falls behind, not on the size of the cluster.
func TestEtcdClusterLargerThanTheQueueStarts(t *testing.T) {
	const ranks = DefaultEventQueue + 1
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Revoke(ctxFor(t, 10*time.Second), lease.ID)
	var ops []clientv3.Op
	flush := func() {
		if _, err := admin.Txn(ctxFor(t, 10*time.Second)).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := range int32(ranks) {
		r := testRecord("gen", i, 1)
		v, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops,
			clientv3.OpPut(IncarnationKey(cluster, r.Instance, r.Rank), string(registration{Incarnation: 1, Lease: int64(lease.ID)}.encode())),
			clientv3.OpPut(Key(cluster, r.Instance, r.Rank), string(v), clientv3.WithLease(lease.ID)))
		if len(ops) == 100 {
			flush()
		}
	}
	flush()

	r, err := NewEtcd(ctxFor(t, 10*time.Second), etcdEndpoints(t), cluster, WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ups := 0
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	for ups < ranks {
		select {
		case ev, ok := <-r.Events():
			if !ok {
				t.Fatalf("events closed after %d of %d Ups: %v", ups, ranks, r.Err())
			}
			if ev.Kind != EventUp {
				t.Fatalf("after %d Ups: %s", ups, ev)
			}
			ups++
		case <-deadline.C:
			t.Fatalf("%d of %d Ups within %v", ups, ranks, waitFor)
		}
	}
	if err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 1)); err != nil {
		t.Fatal(err)
	}
}
