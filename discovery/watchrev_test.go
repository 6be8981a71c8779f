package discovery

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// scriptedWatcher stands in for the client's Watcher: each Watch call
// reports the revision it starts from and hands the test the channel.
type scriptedWatcher struct {
	clientv3.Watcher
	calls chan scriptedWatch
}

type scriptedWatch struct {
	rev int64
	ch  chan clientv3.WatchResponse
}

func (w *scriptedWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	ch := make(chan clientv3.WatchResponse)
	out := make(chan clientv3.WatchResponse)
	go func() { // the channel closes with ctx, as the client's does
		defer close(out)
		for {
			select {
			case r, ok := <-ch:
				if !ok {
					return
				}
				select {
				case out <- r:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case w.calls <- scriptedWatch{rev: clientv3.OpGet(key, opts...).Rev(), ch: ch}:
	case <-ctx.Done():
	}
	return out
}

// failingKV fails the reads asked to fail.
type failingKV struct {
	clientv3.KV
	fail atomic.Int32
}

func (k *failingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if k.fail.Add(-1) >= 0 {
		return nil, errors.New("scripted: etcd unreachable")
	}
	return k.KV.Get(ctx, key, opts...)
}

// TestEtcdWatchResumesAfterItsLastEvent: a watch response's header
// revision is the store's revision when it was sent, not the revision of
// its last event: etcd catches a watcher that fell behind up in batches
// of 1000 revisions, each sent with the current revision. When the watch
// broke after such a batch and the read that resynchronises failed too,
// the watch resumed after the header's revision, and every event between
// the batch's last and the header's revision was lost for good. It must
// resume after the last event it applied.
func TestEtcdWatchResumesAfterItsLastEvent(t *testing.T) {
	cli := newClient(t)
	defer cli.Close()
	w := &scriptedWatcher{Watcher: cli.Watcher, calls: make(chan scriptedWatch)}
	kv := &failingKV{KV: cli.KV}
	cli.Watcher, cli.KV = w, kv
	cluster := clusterName(t)
	r := newEtcdRegistry(t, cluster, WithClient(cli))
	next := func() scriptedWatch {
		t.Helper()
		select {
		case s := <-w.calls:
			return s
		case <-time.After(waitFor):
			t.Fatal("the registry did not watch")
		}
		return scriptedWatch{}
	}
	first := next()
	// A batch: events up to revision first.rev+19, sent at the store's
	// revision first.rev+1000.
	last := first.rev + 19
	first.ch <- clientv3.WatchResponse{
		Header: &pb.ResponseHeader{Revision: first.rev + 1000},
		Events: []*clientv3.Event{{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{
			Key: []byte(ClusterPrefix(cluster) + "junk"), Value: []byte("x"), ModRevision: last}}},
	}
	waitEvent(t, r, waitFor, "the batch's event", func(e Event) bool { return e.Kind == EventRejected })
	// The watch breaks; the read to resynchronise fails.
	kv.fail.Store(1)
	close(first.ch)
	if again := next(); again.rev != last+1 {
		t.Errorf("the watch resumed at revision %d, want %d (after its last event); the header said %d",
			again.rev, last+1, first.rev+1000)
	}
}
