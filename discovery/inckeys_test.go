package discovery

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdRestartsLeaveOneIncarnationKey: a rank registered and closed
// many times leaves one key under the cluster's prefix, its incarnation
// key, naming the last incarnation: the key is per rank, rewritten by each
// registration, so restarts do not grow the prefix (nor a full read of it).
func TestEtcdRestartsLeaveOneIncarnationKey(t *testing.T) {
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	count := func() []string {
		t.Helper()
		g, err := admin.Get(ctxFor(t, 10*time.Second), ClusterPrefix(cluster), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range g.Kvs {
			keys = append(keys, string(kv.Key))
		}
		return keys
	}
	const n = 20
	for i := range n {
		r := newEtcdRegistry(t, cluster)
		if err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, uint64(100+i))); err != nil {
			t.Fatalf("registration %d: %v", i, err)
		}
		if i%2 == 1 { // a crash: the lease ends without a leave
			r.mu.Lock()
			l := r.lease
			r.mu.Unlock()
			if _, err := admin.Revoke(ctxFor(t, 10*time.Second), l); err != nil {
				t.Fatal(err)
			}
			_ = r.Close()
		} else if err := r.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
		if keys := count(); len(keys) != 1 || keys[0] != IncarnationKey(cluster, "ctx", 0) {
			t.Fatalf("after %d restarts the prefix holds %q, want only %s", i+1, keys, IncarnationKey(cluster, "ctx", 0))
		}
	}
	g, err := admin.Get(ctxFor(t, 10*time.Second), IncarnationKey(cluster, "ctx", 0))
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("reading the incarnation key: %v %v", g, err)
	}
	reg, err := decodeRegistration(g.Kvs[0].Value)
	if err != nil || reg.Incarnation != 100+n-1 {
		t.Fatalf("incarnation key names %+v (%v), want incarnation %d", reg, err, 100+n-1)
	}
	b := newEtcdRegistry(t, cluster)
	if err := b.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 100+n-2)); err == nil {
		t.Fatalf("incarnation %d registered after %d", 100+n-2, 100+n-1)
	}
}
