package discovery

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
// resume after the last event it applied (as it now does after any break
// but a compaction, with no read at all).
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
	// The watch breaks; a read of the prefix, were one made, fails.
	kv.fail.Store(1)
	close(first.ch)
	if again := next(); again.rev != last+1 {
		t.Errorf("the watch resumed at revision %d, want %d (after its last event); the header said %d",
			again.rev, last+1, first.rev+1000)
	}
}

// countingKV counts the reads of one key (a prefix).
type countingKV struct {
	clientv3.KV
	key   string
	reads atomic.Int32
}

func (k *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if key == k.key {
		k.reads.Add(1)
	}
	return k.KV.Get(ctx, key, opts...)
}

// noLeader is what etcd sends a watch that requires a leader
// (WithRequireLeader, as the registry's) when it has none for a while:
// every such watch of every rank is cancelled at once.
var noLeader = clientv3.WatchResponse{Canceled: true, CancelReason: "etcdserver: no leader"}

// TestEtcdWatchCancelledWithoutCompactionResumes: a watch that etcd
// cancels without compaction (no leader for a while) resumes where it
// was — etcd still holds every event after it — instead of every rank of
// the cluster reading the whole prefix (every record and every
// incarnation key ever written) at the same moment, as etcd comes back.
func TestEtcdWatchCancelledWithoutCompactionResumes(t *testing.T) {
	cli := newClient(t)
	defer cli.Close()
	w := &scriptedWatcher{Watcher: cli.Watcher, calls: make(chan scriptedWatch)}
	cluster := clusterName(t)
	kv := &countingKV{KV: cli.KV, key: ClusterPrefix(cluster)}
	cli.Watcher, cli.KV = w, kv
	newEtcdRegistry(t, cluster, WithClient(cli))
	first := receive(t, w.calls, waitFor, "the registry's watch")
	before := kv.reads.Load()
	for i := range 3 { // cancelled again as it resumes: still no leader
		prev := first
		if i > 0 {
			prev = receive(t, w.calls, waitFor, "the registry's watch again")
		}
		prev.ch <- noLeader
		close(prev.ch)
	}
	again := receive(t, w.calls, waitFor, "the registry's watch once etcd has a leader")
	if n := kv.reads.Load() - before; n != 0 {
		t.Errorf("a watch cancelled without compaction read the whole prefix %d times before watching again", n)
	}
	if again.rev != first.rev {
		t.Errorf("the watch resumed at revision %d, want %d", again.rev, first.rev)
	}
}

// relayWatcher runs the client's real watches through the test: each
// watch waits for the test to start it, and the test can cancel it as
// etcd does when it loses its leader (what etcd had not sent yet is not
// delivered).
type relayWatcher struct {
	clientv3.Watcher
	calls chan relayWatch
}

type relayWatch struct {
	rev   int64
	start chan struct{} // closed by the test: the watch runs
	brk   chan struct{} // closed by the test: etcd cancels it
}

func (w *relayWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	rw := relayWatch{rev: clientv3.OpGet(key, opts...).Rev(), start: make(chan struct{}), brk: make(chan struct{})}
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		select {
		case w.calls <- rw:
		case <-ctx.Done():
			return
		}
		select {
		case <-rw.start:
		case <-ctx.Done():
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		in := w.Watcher.Watch(wctx, key, opts...)
		for {
			select {
			case r, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- r:
				case <-ctx.Done():
					return
				}
			case <-rw.brk:
				select {
				case out <- noLeader:
				case <-ctx.Done():
				}
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// TestEtcdWatchResumeDeliversWhatHappenedMeanwhile: what was written
// while the watch was cancelled (no leader) is delivered once the watch
// resumes — exactly once, in the order of etcd's revisions — and what the
// watch delivered before it was cancelled is not delivered again. A
// value no peer accepts is Rejected each time it is applied: the
// Rejected events count the deliveries.
func TestEtcdWatchResumeDeliversWhatHappenedMeanwhile(t *testing.T) {
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	cli := newClient(t)
	defer cli.Close()
	w := &relayWatcher{Watcher: cli.Watcher, calls: make(chan relayWatch)}
	kv := &countingKV{KV: cli.KV, key: ClusterPrefix(cluster)}
	cli.Watcher, cli.KV = w, kv
	r := newEtcdRegistry(t, cluster, WithClient(cli))
	first := receive(t, w.calls, waitFor, "the registry's watch")
	close(first.start)

	lease := func() clientv3.LeaseID {
		l, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
		if err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	junk := func(name string) int64 {
		p, err := admin.Put(ctxFor(t, 10*time.Second), ClusterPrefix(cluster)+name, "x")
		if err != nil {
			t.Fatal(err)
		}
		return p.Header.Revision
	}
	isRejected := func(name string) func(Event) bool {
		return func(e Event) bool { return e.Kind == EventRejected && e.Key == ClusterPrefix(cluster)+name }
	}
	la := lease()
	adminRegister(t, admin, cluster, testRecord("ctx", 0, 1), la)
	waitEvent(t, r, waitFor, "ctx/0#1 up", isUp("ctx", 0, 1))
	last := junk("junk-before")
	waitEvent(t, r, waitFor, "junk-before rejected", isRejected("junk-before"))
	before := kv.reads.Load()

	close(first.brk) // etcd lost its leader
	again := receive(t, w.calls, waitFor, "the registry's watch again")
	if again.rev != last+1 {
		t.Errorf("the watch resumed at revision %d, want %d (after the last event it delivered)", again.rev, last+1)
	}
	// Meanwhile (the watch is down): a value no peer accepts, a rank
	// registers, another's lease ends.
	junk("junk-meanwhile")
	adminRegister(t, admin, cluster, testRecord("gen", 0, 2), lease())
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), la); err != nil {
		t.Fatal(err)
	}
	close(again.start) // etcd has a leader again
	junk("junk-after")

	var got []string
	waitEvent(t, r, waitFor, "junk-after rejected", func(e Event) bool {
		got = append(got, e.String())
		return isRejected("junk-after")(e)
	})
	want := []string{
		"REJECTED " + ClusterPrefix(cluster) + "junk-meanwhile",
		"UP gen/0#2",
		"DOWN ctx/0#1: " + ReasonLeaseExpired,
		"REJECTED " + ClusterPrefix(cluster) + "junk-after",
	}
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = strings.HasPrefix(got[i], want[i])
	}
	if !ok {
		t.Errorf("after the watch resumed: %q\nwant (prefixes) %q", got, want)
	}
	if n := kv.reads.Load() - before; n != 0 {
		t.Errorf("the watch read the whole prefix %d times to resume", n)
	}
}

// TestEtcdWatchCompactedReadsThePrefixOnce: a watch whose revision etcd
// compacted away (events this registry never saw are gone) is the one
// break that reads the prefix: once, after a random wait bounded by
// retryMax, then watching from the revision after that read. etcd says
// so with the compaction's revision, or as a cancellation's reason.
func TestEtcdWatchCompactedReadsThePrefixOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp func(compacted int64) clientv3.WatchResponse
	}{
		{"CompactRevision", func(rev int64) clientv3.WatchResponse {
			return clientv3.WatchResponse{Canceled: true, CompactRevision: rev}
		}},
		{"CancelReason", func(int64) clientv3.WatchResponse {
			return clientv3.WatchResponse{Canceled: true, CancelReason: rpctypes.ErrCompacted.Error()}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := newClient(t)
			defer cli.Close()
			w := &scriptedWatcher{Watcher: cli.Watcher, calls: make(chan scriptedWatch)}
			cluster := clusterName(t)
			kv := &countingKV{KV: cli.KV, key: ClusterPrefix(cluster)}
			cli.Watcher, cli.KV = w, kv
			var bounds []time.Duration
			var mu sync.Mutex
			jitter := func(o *options) {
				o.jitter = func(bound time.Duration) time.Duration {
					mu.Lock()
					bounds = append(bounds, bound)
					mu.Unlock()
					return 0
				}
			}
			newEtcdRegistry(t, cluster, WithClient(cli), jitter)
			first := receive(t, w.calls, waitFor, "the registry's watch")
			before := kv.reads.Load()
			// Unseen by the (scripted) watch, then compacted away.
			put, err := cli.Put(ctxFor(t, 10*time.Second), ClusterPrefix(cluster)+"junk", "x")
			if err != nil {
				t.Fatal(err)
			}
			first.ch <- tc.resp(put.Header.Revision)
			close(first.ch)
			again := receive(t, w.calls, waitFor, "the registry's watch after the compaction")
			if n := kv.reads.Load() - before; n != 1 {
				t.Errorf("a compacted watch read the prefix %d times, want 1", n)
			}
			if again.rev <= put.Header.Revision {
				t.Errorf("the watch resumed at revision %d, want one after the read (above %d)", again.rev, put.Header.Revision)
			}
			want := buildOptions([]Option{WithTTL(time.Second)}).retryMax()
			mu.Lock()
			defer mu.Unlock()
			if len(bounds) != 1 || bounds[0] != want {
				t.Errorf("waits before the read bounded by %v, want one bounded by %v", bounds, want)
			}
		})
	}
}

// TestEtcdWatchRetriesWaitAtRandom: every retry of a broken watch waits
// a random time first, so that ranks whose watches etcd cancelled
// together (a lost leader) do not all come back at the same moment. The
// bound starts at watchRetryMin, doubles with each retry that finds etcd
// no better (the watch delivered nothing), up to retryMax, and starts
// again once a watch delivered something. The waits drawn are spread
// over the bound.
func TestEtcdWatchRetriesWaitAtRandom(t *testing.T) {
	cli := newClient(t)
	defer cli.Close()
	w := &scriptedWatcher{Watcher: cli.Watcher, calls: make(chan scriptedWatch)}
	cli.Watcher = w
	cluster := clusterName(t)
	bounds := make(chan time.Duration, 16)
	jitter := func(o *options) {
		o.jitter = func(bound time.Duration) time.Duration { bounds <- bound; return 0 }
	}
	r := newEtcdRegistry(t, cluster, WithClient(cli), jitter)
	top := buildOptions([]Option{WithTTL(time.Second)}).retryMax()
	s := receive(t, w.calls, waitFor, "the registry's watch")
	var got []time.Duration
	for range 5 {
		s.ch <- noLeader
		close(s.ch)
		got = append(got, receive(t, bounds, waitFor, "a wait before the retry"))
		s = receive(t, w.calls, waitFor, "the registry's watch again")
	}
	// A watch that delivered an event: the next retry starts over.
	s.ch <- clientv3.WatchResponse{Events: []*clientv3.Event{{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{
		Key: []byte(ClusterPrefix(cluster) + "junk"), Value: []byte("x"), ModRevision: s.rev}}}}
	waitEvent(t, r, waitFor, "the event", func(e Event) bool { return e.Kind == EventRejected })
	s.ch <- noLeader
	close(s.ch)
	got = append(got, receive(t, bounds, waitFor, "a wait before the retry"))
	want := []time.Duration{watchRetryMin, 2 * watchRetryMin, 4 * watchRetryMin, min(8*watchRetryMin, top), min(16*watchRetryMin, top), watchRetryMin}
	if !slices.Equal(got, want) {
		t.Errorf("waits bounded by %v, want %v", got, want)
	}

	// The waits themselves: within the bound, and not one delay every
	// rank shares.
	o := buildOptions(nil)
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := o.jitter(time.Second)
		if d < 0 || d >= time.Second {
			t.Fatalf("a wait of %v drawn within a bound of 1s", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Errorf("1000 waits drawn within 1s took %d values, want them spread", len(seen))
	}
	if d := o.jitter(0); d != 0 {
		t.Errorf("a wait of %v drawn within a bound of 0", d)
	}
}
