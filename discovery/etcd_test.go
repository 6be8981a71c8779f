package discovery

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const waitFor = 20 * time.Second

func newEtcdRegistry(t testing.TB, cluster string, opts ...Option) *Etcd {
	t.Helper()
	r, err := NewEtcd(ctxFor(t, 10*time.Second), etcdEndpoints(t), cluster, append([]Option{WithTTL(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// TestEtcdTwoRanksFindEachOther: two registries register and each sees
// the other Up with the record it registered; a graceful Close is a Down
// with reason "left".
func TestEtcdTwoRanksFindEachOther(t *testing.T) {
	cluster := clusterName(t)
	a, b := newEtcdRegistry(t, cluster), newEtcdRegistry(t, cluster)
	ra, rb := testRecord("ctx", 0, 10), testRecord("gen", 0, 20)
	if err := a.Register(ctxFor(t, 10*time.Second), ra); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(ctxFor(t, 10*time.Second), rb); err != nil {
		t.Fatal(err)
	}
	got := waitEvent(t, a, waitFor, "gen/0 up at ctx", isUp("gen", 0, 20))
	if !recordsEqual(got.Record, rb) {
		t.Errorf("ctx sees %+v, want %+v", got.Record, rb)
	}
	got = waitEvent(t, b, waitFor, "ctx/0 up at gen", isUp("ctx", 0, 10))
	if !recordsEqual(got.Record, ra) {
		t.Errorf("gen sees %+v, want %+v", got.Record, ra)
	}
	if p := a.Peers(); len(p) != 1 || p[0].Peer() != rb.Peer() {
		t.Errorf("ctx peers %v, want only gen/0", p)
	}

	// A third registry, started later through the --discovery URL, learns
	// both from the snapshot.
	c, err := Open(ctxFor(t, 10*time.Second), "etcd://"+etcdEndpoints(t)[0], cluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitEvent(t, c, waitFor, "ctx/0 up at a late watcher", isUp("ctx", 0, 10))
	waitEvent(t, c, waitFor, "gen/0 up at a late watcher", isUp("gen", 0, 20))

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	down := waitEvent(t, a, waitFor, "gen/0 down at ctx", isDown("gen", 0, 20))
	if down.Reason != ReasonLeft {
		t.Errorf("down reason %q, want %q", down.Reason, ReasonLeft)
	}
	if _, ok := <-b.Events(); ok {
		t.Error("events still open after Close")
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func recordsEqual(a, b Record) bool {
	ab, aerr := a.Encode()
	bb, berr := b.Encode()
	return aerr == nil && berr == nil && string(ab) == string(bb)
}

// TestEtcdRevokedLeaseIsDown: a rank whose lease is revoked behind its
// back (as etcd does when it expires) is Down "lease expired" at its
// peers, and the rank itself learns it is Lost and withdraws nothing at
// Close.
func TestEtcdRevokedLeaseIsDown(t *testing.T) {
	cluster := clusterName(t)
	a, b := newEtcdRegistry(t, cluster), newEtcdRegistry(t, cluster)
	if err := a.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 1)); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(ctxFor(t, 10*time.Second), testRecord("gen", 0, 1)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, a, waitFor, "gen/0 up", isUp("gen", 0, 1))
	admin := newClient(t)
	defer admin.Close()
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), b.leaseID()); err != nil {
		t.Fatal(err)
	}
	down := waitEvent(t, a, waitFor, "gen/0 down", isDown("gen", 0, 1))
	if down.Reason != ReasonLeaseExpired {
		t.Errorf("reason %q, want %q", down.Reason, ReasonLeaseExpired)
	}
	lost := waitEvent(t, b, waitFor, "gen/0 lost", func(e Event) bool { return e.Kind == EventLost })
	if lost.Instance != "gen" || lost.Rank != 0 || lost.Incarnation != 1 {
		t.Errorf("lost %v, want gen/0#1", lost)
	}
	// Nothing is left to withdraw: Close does not try (it failed revoking
	// a lease etcd no longer has, or waited out its dial timeout for an
	// etcd that was down, and a run that had succeeded exited 1).
	if err := b.Close(); err != nil {
		t.Errorf("Close after Lost: %v, want nil", err)
	}
}

// TestEtcdDeadRankExpires: a rank that dies without revoking (its client
// closed: no keepalive, no leave) is Down "lease expired" at its peers
// once etcd expires the lease, and its incarnation is refused afterwards.
func TestEtcdDeadRankExpires(t *testing.T) {
	cluster := clusterName(t)
	a := newEtcdRegistry(t, cluster)
	if err := a.Register(ctxFor(t, 10*time.Second), testRecord("gen", 0, 1)); err != nil {
		t.Fatal(err)
	}
	victimCli := newClient(t)
	victim := newEtcdRegistry(t, cluster, WithClient(victimCli))
	if err := victim.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 1, 5)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, a, waitFor, "ctx/1 up", isUp("ctx", 1, 5))

	victimCli.Close() // the process dies: no revoke, no leave
	down := waitEvent(t, a, waitFor, "ctx/1 down", isDown("ctx", 1, 5))
	if down.Reason != ReasonLeaseExpired {
		t.Errorf("reason %q, want %q", down.Reason, ReasonLeaseExpired)
	}
	if p := a.Peers(); len(p) != 0 {
		t.Errorf("peers after expiry %v, want none", p)
	}
	// The dead rank's registry reported itself Lost, then stopped.
	lost := waitEvent(t, victim, waitFor, "victim lost", func(e Event) bool { return e.Kind == EventLost })
	if lost.Incarnation != 5 || lost.Reason != ReasonKeepaliveStopped {
		t.Errorf("victim %v, want LOST ctx/1#5: %s", lost, ReasonKeepaliveStopped)
	}
	for ev := range victim.Events() {
		t.Errorf("victim after Lost: %v", ev)
	}
	if !errors.Is(victim.Err(), ErrClosed) {
		t.Errorf("victim err %v, want %v", victim.Err(), ErrClosed)
	}

	// The dead incarnation written back is refused: without a lease (a
	// replayed or hand-made write; a paused process's own lease is gone),
	// and with a live lease at or below the incarnation that went down.
	admin := newClient(t)
	defer admin.Close()
	key := Key(cluster, "ctx", 1)
	put := func(inc uint64, opts ...clientv3.OpOption) {
		t.Helper()
		v, _ := testRecord("ctx", 1, inc).Encode()
		if _, err := admin.Put(ctxFor(t, 10*time.Second), key, string(v), opts...); err != nil {
			t.Fatal(err)
		}
	}
	rejected := func(want error) {
		t.Helper()
		rej := waitEvent(t, a, waitFor, "ctx/1 rejected", func(e Event) bool { return e.Kind == EventRejected })
		if !errors.Is(rej.Err, want) || rej.Key != key || !strings.Contains(rej.Err.Error(), key) {
			t.Errorf("rejected %v, want %v at %s", rej, want, key)
		}
	}
	put(5)
	rejected(ErrInvalidRecord)
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	for _, inc := range []uint64{5, 4} {
		put(inc, clientv3.WithLease(lease.ID))
		rejected(ErrStaleIncarnation)
	}
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), lease.ID); err != nil {
		t.Fatal(err)
	}
	put(5) // without a lease: stays, refused
	rejected(ErrInvalidRecord)
	if p := a.Peers(); len(p) != 0 {
		t.Errorf("peers after stale writes %v, want none", p)
	}
	// A restart with a new incarnation replaces the value no lease holds.
	c := newEtcdRegistry(t, cluster)
	if err := c.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 1, 6)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, a, waitFor, "ctx/1#6 up", isUp("ctx", 1, 6))
}

// TestEtcdRegisterRefusesStaleIncarnation: a registration at or below the
// incarnation its key holds is refused; one above it waits until the
// holder's lease goes, then lands.
func TestEtcdRegisterRefusesStaleIncarnation(t *testing.T) {
	cluster := clusterName(t)
	holderCli := newClient(t)
	holder := newEtcdRegistry(t, cluster, WithClient(holderCli))
	if err := holder.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 7)); err != nil {
		t.Fatal(err)
	}
	for _, inc := range []uint64{7, 3} {
		r := newEtcdRegistry(t, cluster)
		err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, inc))
		if !errors.Is(err, ErrStaleIncarnation) {
			t.Errorf("register incarnation %d over 7: %v, want %v", inc, err, ErrStaleIncarnation)
		}
	}
	// A newer incarnation while the old one still holds its lease waits.
	next := newEtcdRegistry(t, cluster)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := next.Register(short, testRecord("ctx", 0, 8)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("register over a live holder: %v, want a wait cut by the deadline", err)
	}
	// The holder dies; the next incarnation lands once its lease expires.
	holderCli.Close()
	watcher := newEtcdRegistry(t, cluster)
	next2 := newEtcdRegistry(t, cluster)
	if err := next2.Register(ctxFor(t, waitFor), testRecord("ctx", 0, 9)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, watcher, waitFor, "ctx/0#9 up", isUp("ctx", 0, 9))
	// A registry that saw incarnation 9 refuses to register 9 itself.
	if err := watcher.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 9)); !errors.Is(err, ErrStaleIncarnation) {
		t.Errorf("register an incarnation the registry saw: %v, want %v", err, ErrStaleIncarnation)
	}
}

// TestEtcdMalformedValues: values under the prefix that are not records
// of their key are refused, reported with the key named, counted, and
// create no state; the watch carries on.
func TestEtcdMalformedValues(t *testing.T) {
	cluster := clusterName(t)
	a := newEtcdRegistry(t, cluster)
	admin := newClient(t)
	defer admin.Close()
	good, _ := testRecord("gen", 3, 1).Encode()
	bad := map[string]string{
		Key(cluster, "gen", 0):        "not json",
		Key(cluster, "gen", 1):        `{"v":2}`,
		Key(cluster, "gen", 2):        strings.Replace(string(good), `"v":1`, `"v":1,"extra":true`, 1),
		Key(cluster, "other", 3):      string(good), // the key names another rank
		Key(cluster, "gen", 4) + "/x": string(good),
		Key(cluster, "gen", 0)[:len(Key(cluster, "gen", 0))-1] + "07": string(good),
		Key(cluster, "gen", 5): strings.Replace(string(good), `"incarnation":"1"`, `"incarnation":"0"`, 1),
		Key(cluster, "gen", 6): strings.Repeat("x", MaxRecordBytes+1),
	}
	keys := make([]string, 0, len(bad))
	for k := range bad {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := admin.Put(ctxFor(t, 10*time.Second), k, bad[k], clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		ev := waitEvent(t, a, waitFor, "a rejection of "+k, func(e Event) bool { return e.Kind == EventRejected })
		if ev.Key != k || !strings.Contains(ev.Err.Error(), k) {
			t.Errorf("rejected %q (%v), want %q named", ev.Key, ev.Err, k)
		}
	}
	if n := a.Rejected(); n != uint64(len(bad)) {
		t.Errorf("rejected count %d, want %d", n, len(bad))
	}
	if p := a.Peers(); len(p) != 0 {
		t.Errorf("peers %v, want none", p)
	}
	// A registry started now sees the same values in its snapshot.
	b := newEtcdRegistry(t, cluster)
	for range keys {
		waitEvent(t, b, waitFor, "a rejection in the snapshot", func(e Event) bool { return e.Kind == EventRejected })
	}
	// Deleting a malformed key is no Down.
	if _, err := admin.Delete(ctxFor(t, 10*time.Second), Key(cluster, "gen", 0)); err != nil {
		t.Fatal(err)
	}
	// The watch still works.
	adminRegister(t, admin, cluster, testRecord("gen", 3, 1), lease.ID)
	ev := waitEvent(t, a, waitFor, "gen/3 up", func(e Event) bool { return e.Kind != EventRejected })
	if !isUp("gen", 3, 1)(ev) {
		t.Errorf("after deleting a malformed key: %v, want UP gen/3#1 first", ev)
	}
}

// TestEtcdSupersededIncarnation: a newer incarnation written over a live
// one is Down(old, superseded) then Up(new) at peers, and Lost at the old.
func TestEtcdSupersededIncarnation(t *testing.T) {
	cluster := clusterName(t)
	a, old := newEtcdRegistry(t, cluster), newEtcdRegistry(t, cluster)
	if err := old.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 1)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, a, waitFor, "ctx/0#1 up", isUp("ctx", 0, 1))
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("ctx", 0, 2), lease.ID)
	d := waitEvent(t, a, waitFor, "ctx/0#1 down", isDown("ctx", 0, 1))
	if d.Reason != reasonSuperseded(2) {
		t.Errorf("reason %q", d.Reason)
	}
	waitEvent(t, a, waitFor, "ctx/0#2 up", isUp("ctx", 0, 2))
	waitEvent(t, old, waitFor, "lost", func(e Event) bool { return e.Kind == EventLost && e.Incarnation == 1 })
}

// TestEtcdIncarnationKeyOutlivesObservers: an incarnation once
// registered is refused by registries that never saw it — at Register,
// and when its record or registration is written back — because the
// rank's incarnation key still names it under its ended lease.
func TestEtcdIncarnationKeyOutlivesObservers(t *testing.T) {
	cluster := clusterName(t)
	a := newEtcdRegistry(t, cluster)
	if err := a.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 5)); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, inc := range []uint64{5, 4} {
		b := newEtcdRegistry(t, cluster)
		if err := b.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, inc)); !errors.Is(err, ErrStaleIncarnation) {
			t.Errorf("a fresh registry registers incarnation %d after 5: %v, want %v", inc, err, ErrStaleIncarnation)
		}
	}
	c := newEtcdRegistry(t, cluster) // started after incarnation 5 left
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := testRecord("ctx", 0, 5).Encode()
	if _, err := admin.Put(ctxFor(t, 10*time.Second), Key(cluster, "ctx", 0), string(v), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	rej := waitEvent(t, c, waitFor, "incarnation 5 under another lease rejected", func(e Event) bool { return e.Kind == EventRejected })
	if !errors.Is(rej.Err, ErrStaleIncarnation) {
		t.Errorf("rejected %v, want %v", rej, ErrStaleIncarnation)
	}
	adminRegister(t, admin, cluster, testRecord("ctx", 0, 5), lease.ID)
	for range 2 { // the incarnation key, then the record
		rej := waitEvent(t, c, waitFor, "re-registered incarnation 5 rejected", func(e Event) bool { return e.Kind == EventRejected })
		if !errors.Is(rej.Err, ErrStaleIncarnation) {
			t.Errorf("rejected %v, want %v", rej, ErrStaleIncarnation)
		}
	}
	if p := c.Peers(); len(p) != 0 {
		t.Errorf("peers %v, want none", p)
	}
	// The hand-made registration holds the key while its lease lives (a
	// registration under a live lease holds its rank); once it goes, the
	// next incarnation registers.
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), lease.ID); err != nil {
		t.Fatal(err)
	}
	b := newEtcdRegistry(t, cluster)
	if err := b.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 6)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, waitFor, "ctx/0#6 up", isUp("ctx", 0, 6))
}

// TestEtcdOverflowStops: a consumer that does not read stops the
// registry with ErrEventOverflow instead of blocking the watch.
func TestEtcdOverflowStops(t *testing.T) {
	cluster := clusterName(t)
	a := newEtcdRegistry(t, cluster, WithEventQueue(2))
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		v, _ := testRecord("gen", int32(i), 1).Encode()
		if _, err := admin.Put(ctxFor(t, 10*time.Second), Key(cluster, "gen", int32(i)), string(v), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, waitFor, "the registry to fail", func() bool { return a.Err() != nil })
	if !errors.Is(a.Err(), ErrEventOverflow) {
		t.Fatalf("err %v, want %v", a.Err(), ErrEventOverflow)
	}
	for range a.Events() {
	}
}

// TestEtcdRegisterCutShortByAFailureNamesIt: a registry that fails while
// its Register waits (here the event queue overflows: the rank's key is
// held, and a peer restarts over and over while nothing reads Events)
// fails that Register naming why, as a Register started after the
// failure does. It said only "registry closed … cut short … context
// canceled": no Close was called, and the cause was in Err alone.
func TestEtcdRegisterCutShortByAFailureNamesIt(t *testing.T) {
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("gen", 0, 1), lease.ID) // a live holder
	held := make(chan struct{}, 1)
	a := newEtcdRegistry(t, cluster, WithEventQueue(2), WithOnHeld(func(Record) {
		select {
		case held <- struct{}{}:
		default:
		}
	}))
	regErr := make(chan error, 1)
	go func() { regErr <- a.Register(ctxFor(t, waitFor), testRecord("gen", 0, 5)) }()
	receive(t, held, waitFor, "Register to wait for the holder")
	for inc := uint64(1); a.Err() == nil; inc++ {
		if inc > 1000 {
			t.Fatal("the registry took 1000 restarts of a peer without overflowing its queue of 2")
		}
		adminRegister(t, admin, cluster, testRecord("gen", 1, inc), lease.ID) // a Down and an Up each
	}
	err = receive(t, regErr, waitFor, "Register to return")
	t.Logf("Register: %v", err)
	if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrEventOverflow) {
		t.Errorf("Register of a registry that overflowed meanwhile: %v, want %v and %v", err, ErrClosed, ErrEventOverflow)
	}
}

// leaseID exposes the registry's lease to tests.
func (e *Etcd) leaseID() clientv3.LeaseID {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// TestEtcdRegisterRefusesBelowLiveRecord: with the rank's incarnation key
// deleted (by hand: etcd's compaction keeps a key's latest value, and the
// key has no lease to expire), a registration below the incarnation that
// holds the rank's record under a live lease is refused, naming both
// incarnations and the key, and the live record stays.
func TestEtcdRegisterRefusesBelowLiveRecord(t *testing.T) {
	cluster := clusterName(t)
	holder := newEtcdRegistry(t, cluster)
	if err := holder.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 7)); err != nil {
		t.Fatal(err)
	}
	admin := newClient(t)
	defer admin.Close()
	key := Key(cluster, "ctx", 0)
	if _, err := admin.Delete(ctxFor(t, 10*time.Second), IncarnationKey(cluster, "ctx", 0)); err != nil {
		t.Fatal(err)
	}
	for _, inc := range []uint64{7, 3} {
		r := newEtcdRegistry(t, cluster) // started after the deletion: its table names no incarnation
		err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, inc))
		if !errors.Is(err, ErrStaleIncarnation) {
			t.Fatalf("register incarnation %d under a live 7: %v, want %v", inc, err, ErrStaleIncarnation)
		}
		for _, w := range []string{key, "holds incarnation 7", fmt.Sprintf("incarnation %d is not above", inc)} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not name %q", err, w)
			}
		}
	}
	g, err := admin.Get(ctxFor(t, 10*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || g.Kvs[0].Lease != int64(holder.leaseID()) {
		t.Fatalf("%s after the refused registrations: %v, want incarnation 7 under its lease %x", key, g.Kvs, holder.leaseID())
	}
	if r, _, err := decodeRecord(g.Kvs[0].Value); err != nil || r.Incarnation != 7 {
		t.Fatalf("%s holds %v (%v), want incarnation 7", key, r, err)
	}
}

// gatedLease holds the answer to the first Grant until release is closed
// or the Grant's context ends: a Register caught between its lease and
// its record, where a concurrent Close finds it.
type gatedLease struct {
	clientv3.Lease
	once    sync.Once
	granted chan clientv3.LeaseID // the first Grant's lease, once etcd granted it
	release chan struct{}
}

func (g *gatedLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := g.Lease.Grant(ctx, ttl)
	first := false
	g.once.Do(func() { first = true })
	if err != nil || !first {
		return resp, err
	}
	g.granted <- resp.ID
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	return resp, nil // granted: what a Grant answered just as Close began looks like
}

// receive waits for a value on ch within d.
func receive[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	select {
	case v := <-ch:
		return v
	case <-deadline.C:
		t.Fatalf("no %s within %v", what, d)
		panic("unreachable")
	}
}

// TestEtcdCloseDuringRegister: Close of a registry built WithClient while
// its Register is in flight (the lease granted, the record not yet
// written) returns only once Register has: Register fails with ErrClosed,
// its lease is revoked, no record is left, no goroutine runs on; and a
// Register after Close is ErrClosed too.
func TestEtcdCloseDuringRegister(t *testing.T) {
	cluster := clusterName(t)
	cli := newClient(t)
	defer cli.Close()
	gate := &gatedLease{Lease: cli.Lease, granted: make(chan clientv3.LeaseID, 1), release: make(chan struct{})}
	cli.Lease = gate
	r := newEtcdRegistry(t, cluster, WithClient(cli))

	regErr := make(chan error, 1)
	go func() { regErr <- r.Register(ctxFor(t, waitFor), testRecord("ctx", 0, 1)) }()
	lease := receive(t, gate.granted, waitFor, "lease granted to Register")
	closeErr := make(chan error, 1)
	go func() { closeErr <- r.Close() }()
	var err error
	select {
	case <-closeErr:
		// Register's goroutine sends its error only after Register
		// returned, so regErr may still be empty here (a loaded machine
		// showed it): the registry's own count says whether it returned.
		if n := r.registering.Load(); n != 0 {
			t.Errorf("Close returned while %d Register was still in flight", n)
			close(gate.release)
		}
		err = receive(t, regErr, waitFor, "Register to return")
	case err = <-regErr:
		receive(t, closeErr, waitFor, "Close to return")
	}
	t.Logf("Register: %v", err)
	if !errors.Is(err, ErrClosed) {
		t.Errorf("Register cut short by Close: %v, want %v", err, ErrClosed)
	}
	key := Key(cluster, "ctx", 0)
	g, gerr := cli.Get(ctxFor(t, 10*time.Second), key)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if len(g.Kvs) != 0 {
		t.Errorf("after Close: %s = %s under lease %x, want no record", key, g.Kvs[0].Value, g.Kvs[0].Lease)
	}
	ttl, terr := cli.TimeToLive(ctxFor(t, 10*time.Second), lease)
	if terr != nil {
		t.Fatal(terr)
	}
	if ttl.TTL != -1 {
		t.Errorf("after Close: lease %x of the cut-short Register has %d s to live, want it revoked", lease, ttl.TTL)
	}
	if err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 2)); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v, want %v", err, ErrClosed)
	}
	// The package's TestMain checks every goroutine at the end (goleak);
	// here, that none of the registry's own outlives its Close.
	poll(t, waitFor, "the registry's goroutines to end", func() bool { return etcdGoroutines() == "" })
}

// etcdGoroutines returns the stacks of the goroutines running an Etcd
// method (its watch, its keepalive), "" when none does.
func etcdGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "discovery.(*Etcd).") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestEtcdRegisterNamesTheHolder: a Register that finds its rank held by
// an older incarnation under a live lease (another process running as the
// same rank) says so through WithOnHeld, with the holder's record, before
// it waits; it completes once the holder leaves. The wait was silent (the
// second process of one rank logged nothing until it was stopped).
func TestEtcdRegisterNamesTheHolder(t *testing.T) {
	cluster := clusterName(t)
	first := newEtcdRegistry(t, cluster)
	if err := first.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 1)); err != nil {
		t.Fatal(err)
	}
	held := make(chan Record, 4)
	second := newEtcdRegistry(t, cluster, WithOnHeld(func(r Record) { held <- r }))
	done := make(chan error, 1)
	go func() { done <- second.Register(ctxFor(t, time.Minute), testRecord("ctx", 0, 2)) }()
	select {
	case r := <-held:
		if r.Incarnation != 1 || r.ControlEndpoint != testRecord("ctx", 0, 1).ControlEndpoint {
			t.Errorf("held by %v, want incarnation 1 at its endpoint", r)
		}
	case err := <-done:
		t.Fatalf("Register of a rank held by a live incarnation returned %v before naming the holder", err)
	case <-time.After(waitFor):
		t.Fatal("Register did not name the live incarnation holding its rank")
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Register once the holder left: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Register did not complete once the holder left")
	}
}

// TestEtcdRegisterWaitsAcrossCompaction: a Register waiting for an older
// incarnation's lease to go keeps waiting quietly once etcd compacted past
// the holder's key (etcd's auto-compaction does, while a duplicate process
// or a crashed run holds the rank): its watch from the key's revision is
// refused as compacted. It looped (read, transaction, watch refused) as
// fast as etcd answered, naming the holder through WithOnHeld each time,
// for as long as the holder lived.
func TestEtcdRegisterWaitsAcrossCompaction(t *testing.T) {
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	// A crashed holder: its record under a lease nobody renews.
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 2)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("ctx", 0, 1), lease.ID)
	// Two writes after it, then compact up to the second: the revision
	// after the holder's key is compacted (a compaction at R keeps R).
	var put *clientv3.PutResponse
	for range 2 {
		if put, err = admin.Put(ctxFor(t, 10*time.Second), "/compaction-marker/"+cluster, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Compact(ctxFor(t, 10*time.Second), put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	var held atomic.Int32
	r := newEtcdRegistry(t, cluster, WithOnHeld(func(Record) { held.Add(1) }))
	if err := r.Register(ctxFor(t, waitFor), testRecord("ctx", 0, 2)); err != nil {
		t.Fatalf("Register once the holder's lease expired: %v", err)
	}
	// The holder's key changed once (its lease expired): one wait.
	if n := held.Load(); n != 1 {
		t.Errorf("Register named the holder %d times while it waited, want once", n)
	}
}

// TestEtcdCloseAfterOverflowWithdraws: a registered registry stopped by
// ErrEventOverflow still withdraws its record at Close: peers see it
// leave at once. It withdrew nothing, and its keepalive had stopped with
// it, so its record stayed for a TTL (an hour with a long
// --discovery-ttl) as a member nobody answered for, and a restart of the
// rank waited that long for it to go.
func TestEtcdCloseAfterOverflowWithdraws(t *testing.T) {
	cluster := clusterName(t)
	a := newEtcdRegistry(t, cluster, WithEventQueue(2))
	if err := a.Register(ctxFor(t, 10*time.Second), testRecord("gen", 0, 1)); err != nil {
		t.Fatal(err)
	}
	b := newEtcdRegistry(t, cluster, WithTTL(time.Minute))
	waitEvent(t, b, waitFor, "gen/0 up", isUp("gen", 0, 1))
	admin := newClient(t)
	defer admin.Close()
	// A rank restarting while a does not read: an Up and a Down each
	// time (the cluster does not grow, so the bound does not either).
	for inc := range uint64(8) {
		lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
		if err != nil {
			t.Fatal(err)
		}
		adminRegister(t, admin, cluster, testRecord("ctx", 0, inc+1), lease.ID)
		if _, err := admin.Revoke(ctxFor(t, 10*time.Second), lease.ID); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, waitFor, "the registry to fail", func() bool { return a.Err() != nil })
	if !errors.Is(a.Err(), ErrEventOverflow) {
		t.Fatalf("err %v, want %v", a.Err(), ErrEventOverflow)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close after the overflow: %v", err)
	}
	down := waitEvent(t, b, waitFor, "gen/0 down", isDown("gen", 0, 1))
	if down.Reason != ReasonLeft {
		t.Errorf("gen/0 down %q after its registry's Close, want %q", down.Reason, ReasonLeft)
	}
}

// stoppableLease ends the keepalive channels it hands out once stop is
// closed, as the client does when it gives up renewing a lease (etcd
// unreachable for a TTL): the registry's keepalive stops while etcd
// still holds its lease and its record.
type stoppableLease struct {
	clientv3.Lease
	stop chan struct{}
}

func (l *stoppableLease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	ka, err := l.Lease.KeepAlive(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make(chan *clientv3.LeaseKeepAliveResponse)
	go func() {
		defer close(out)
		for {
			select {
			case r, ok := <-ka:
				if !ok {
					return
				}
				select {
				case out <- r:
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				}
			case <-l.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestEtcdNoDownOfSelfAfterLost: a registry whose keepalive stopped
// reports its record Lost; when etcd then deletes the record (its lease
// expired), that is no Down of this rank: it never had an Up, and its
// Lost was said. A Down of this very rank followed (after the Lost, from
// the watch), and Peers listed the rank itself.
func TestEtcdNoDownOfSelfAfterLost(t *testing.T) {
	cluster := clusterName(t)
	cli := newClient(t)
	defer cli.Close()
	sl := &stoppableLease{Lease: cli.Lease, stop: make(chan struct{})}
	cli.Lease = sl
	r := newEtcdRegistry(t, cluster, WithClient(cli))
	if err := r.Register(ctxFor(t, 10*time.Second), testRecord("gen", 0, 1)); err != nil {
		t.Fatal(err)
	}
	close(sl.stop) // the keepalive gives up; etcd still holds the record
	waitEvent(t, r, waitFor, "gen/0 lost", func(e Event) bool { return e.Kind == EventLost })
	if p := r.Peers(); len(p) != 0 {
		t.Errorf("peers %v after Lost, want none (this rank is not its own peer)", p)
	}
	admin := newClient(t)
	defer admin.Close()
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), r.leaseID()); err != nil { // etcd expires the lease
		t.Fatal(err)
	}
	// A marker after the deletion: events are delivered in order.
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("ctx", 0, 1), lease.ID)
	waitEvent(t, r, waitFor, "ctx/0 up, no event about gen/0 before it", func(e Event) bool {
		if e.Kind != EventRejected && (e.Instance == "gen" || e.Record.Instance == "gen") {
			t.Errorf("%v after this rank's Lost, want no event about it", e)
		}
		return isUp("ctx", 0, 1)(e)
	})
}

// TestEtcdResyncDownsRankWhoseKeyHoldsARefusedValue: while the watch was
// broken (and its events compacted away), a live rank's lease expired and
// the rank registered again with a record this registry refuses (a newer
// build's record of a version this one does not read). The resynchronisation must put the rank that
// was up Down: its key holds no record of it. It stayed up for good.
func TestEtcdResyncDownsRankWhoseKeyHoldsARefusedValue(t *testing.T) {
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	l1, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("gen", 1, 1), l1.ID)

	cli := newClient(t)
	defer cli.Close()
	w := &scriptedWatcher{Watcher: cli.Watcher, calls: make(chan scriptedWatch)}
	cli.Watcher = w
	r := newEtcdRegistry(t, cluster, WithClient(cli))
	waitEvent(t, r, waitFor, "gen/1#1 up", isUp("gen", 1, 1))
	first := receive(t, w.calls, waitFor, "the registry's watch")

	// Unseen by the (scripted) watch: gen/1#1 expires, gen/1#2 registers.
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), l1.ID); err != nil {
		t.Fatal(err)
	}
	l2, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := testRecord("gen", 1, 2).Encode()
	newer := strings.Replace(string(v), `"v":1,`, `"v":2,"zone":"b",`, 1)
	if _, err := admin.Txn(ctxFor(t, 10*time.Second)).Then(
		clientv3.OpPut(IncarnationKey(cluster, "gen", 1), string(registration{Incarnation: 2, Lease: int64(l2.ID)}.encode())),
		clientv3.OpPut(Key(cluster, "gen", 1), newer, clientv3.WithLease(l2.ID))).Commit(); err != nil {
		t.Fatal(err)
	}
	// etcd compacted the watch's revision away: the registry reads the
	// prefix again, then watches anew.
	first.ch <- clientv3.WatchResponse{Canceled: true, CompactRevision: first.rev + 1}
	close(first.ch)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		select {
		case <-w.calls:
		case <-done:
		}
	}()
	waitEvent(t, r, waitFor, "gen/1#1 down", isDown("gen", 1, 1))
	if p := r.Peers(); len(p) != 0 {
		t.Errorf("peers %v, want none", p)
	}
}

// TestEtcdRegisterWaitsForLiveHolderWithoutIncarnationKey: with the
// rank's incarnation key deleted (by hand), a Register above the
// incarnation holding the rank's record under a live lease waits for it
// to go, as it does with the key in place, instead of pushing the live
// holder out (it replaced the record at once: the holder — a second
// process of the rank, or a previous run still up — was Lost).
func TestEtcdRegisterWaitsForLiveHolderWithoutIncarnationKey(t *testing.T) {
	cluster := clusterName(t)
	holder := newEtcdRegistry(t, cluster)
	if err := holder.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 7)); err != nil {
		t.Fatal(err)
	}
	admin := newClient(t)
	defer admin.Close()
	if _, err := admin.Delete(ctxFor(t, 10*time.Second), IncarnationKey(cluster, "ctx", 0)); err != nil {
		t.Fatal(err)
	}
	held := make(chan Record, 4)
	next := newEtcdRegistry(t, cluster, WithOnHeld(func(r Record) { held <- r }))
	done := make(chan error, 1)
	go func() { done <- next.Register(ctxFor(t, time.Minute), testRecord("ctx", 0, 8)) }()
	select {
	case r := <-held:
		if r.Incarnation != 7 {
			t.Errorf("held by %v, want incarnation 7", r)
		}
	case err := <-done:
		t.Fatalf("Register over a live holder (incarnation key deleted) returned %v without waiting for it", err)
	case <-time.After(waitFor):
		t.Fatal("Register neither waited for the live holder nor returned")
	}
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, done, waitFor, "Register once the holder left"); err != nil {
		t.Fatalf("Register once the holder left: %v", err)
	}
}

// TestEtcdRegisterWaitsForALaterBuildsHolder: the rank's key holds a
// record this build cannot read (a later build's record version) under
// the very lease its incarnation key names: the live registration of a
// later build's process of the rank (a duplicate, or a rollback started
// before the upgraded run's lease ended). A Register of a higher
// incarnation waits for it to go, as for any live holder; it replaced
// the record at once, as it replaces garbage, and the live holder was
// pushed out of its key (Lost) by a process that should have waited.
func TestEtcdRegisterWaitsForALaterBuildsHolder(t *testing.T) {
	cluster := clusterName(t)
	admin := newClient(t)
	defer admin.Close()
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	key := Key(cluster, "ctx", 0)
	later := `{"v":2,"state":"up","instance":"ctx","rank":0,"incarnation":"7","endpoints":["tcp://127.0.0.1:5555"]}`
	if _, err := admin.Txn(ctxFor(t, 10*time.Second)).Then(
		clientv3.OpPut(IncarnationKey(cluster, "ctx", 0), string(registration{Incarnation: 7, Lease: int64(lease.ID)}.encode())),
		clientv3.OpPut(key, later, clientv3.WithLease(lease.ID))).Commit(); err != nil {
		t.Fatal(err)
	}
	held := make(chan Record, 4)
	r := newEtcdRegistry(t, cluster, WithOnHeld(func(h Record) { held <- h }))
	done := make(chan error, 1)
	go func() { done <- r.Register(ctxFor(t, time.Minute), testRecord("ctx", 0, 8)) }()
	select {
	case h := <-held:
		if h.Peer() != (Record{Instance: "ctx"}).Peer() || h.Incarnation != 7 {
			t.Errorf("held by %v, want ctx/0#7", h)
		}
	case err := <-done:
		g, _ := admin.Get(ctxFor(t, 10*time.Second), key)
		t.Fatalf("Register over a later build's live holder returned %v without waiting for it; %s now holds %v", err, key, g.Kvs)
	case <-time.After(waitFor):
		t.Fatal("Register neither waited for the live holder nor returned")
	}
	g, err := admin.Get(ctxFor(t, 10*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || string(g.Kvs[0].Value) != later || g.Kvs[0].Lease != int64(lease.ID) {
		t.Fatalf("%s while the holder lives: %v, want its record under its lease", key, g.Kvs)
	}
	// The holder goes: the Register completes.
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), lease.ID); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, done, waitFor, "Register once the holder went"); err != nil {
		t.Fatalf("Register once the holder went: %v", err)
	}
}

// TestEtcdRegisterKeepsAnIncarnationKeyItCannotRead: a rank's incarnation
// key whose value this build cannot decode (a later build's version, or a
// value damaged by hand) is never overwritten: it may name an incarnation
// above the one registering, and rewriting it dropped that protection (a
// downgrade past a later format let a reused incarnation back). Register
// fails naming the key and what it could not decode, and writes nothing.
func TestEtcdRegisterKeepsAnIncarnationKeyItCannotRead(t *testing.T) {
	admin := newClient(t)
	defer admin.Close()
	for _, v := range []string{
		`{"v":2,"incarnation":"100","lease":"5","epoch":"3"}`,
		`{"v":1,"incarnation":100,"lease":"5"}`,
		`not json`,
	} {
		cluster := clusterName(t)
		incKey := IncarnationKey(cluster, "ctx", 0)
		if _, err := admin.Put(ctxFor(t, 10*time.Second), incKey, v); err != nil {
			t.Fatal(err)
		}
		r := newEtcdRegistry(t, cluster)
		err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 50))
		t.Logf("Register: %v", err)
		if !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("Register over %s = %s: %v, want %v", incKey, v, err, ErrInvalidRecord)
		}
		if err != nil && (!strings.Contains(err.Error(), incKey) || !strings.Contains(err.Error(), "cannot decode")) {
			t.Errorf("error %q does not name %s and what it could not decode", err, incKey)
		}
		g, gerr := admin.Get(ctxFor(t, 10*time.Second), ClusterPrefix(cluster), clientv3.WithPrefix())
		if gerr != nil {
			t.Fatal(gerr)
		}
		if len(g.Kvs) != 1 || string(g.Kvs[0].Key) != incKey || string(g.Kvs[0].Value) != v {
			t.Errorf("after the refused Register, %s holds %v, want only %s = %s", ClusterPrefix(cluster), g.Kvs, incKey, v)
		}
	}
}

// lostReplyKV commits the first transaction that succeeds once armed,
// then answers it with an error, as a connection lost after etcd
// committed the write does.
type lostReplyKV struct {
	clientv3.KV
	armed atomic.Bool
}

func (k *lostReplyKV) Txn(ctx context.Context) clientv3.Txn {
	return &lostReplyTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type lostReplyTxn struct {
	clientv3.Txn
	kv *lostReplyKV
}

func (t *lostReplyTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *lostReplyTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *lostReplyTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *lostReplyTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil && resp.Succeeded && t.kv.armed.CompareAndSwap(true, false) {
		return nil, errors.New("scripted: the connection to etcd broke after the commit")
	}
	return resp, err
}

// unrevokableLease fails every Revoke, as an etcd out of reach does.
type unrevokableLease struct{ clientv3.Lease }

func (unrevokableLease) Revoke(context.Context, clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	return nil, errors.New("scripted: etcd unreachable")
}

// TestEtcdFailedRegisterIsNoPeer: a Register whose write etcd committed
// but whose reply was lost fails, and cannot revoke its lease (etcd out of
// reach just then): its record stays in etcd until the lease's TTL. Its
// own registry must never list it as a peer nor report it (no Up, no
// Down): the registry listed its own rank as a peer until the TTL.
func TestEtcdFailedRegisterIsNoPeer(t *testing.T) {
	cluster := clusterName(t)
	cli := newClient(t)
	defer cli.Close()
	kv := &lostReplyKV{KV: cli.KV}
	cli.KV, cli.Lease = kv, unrevokableLease{cli.Lease}
	r := newEtcdRegistry(t, cluster, WithClient(cli), WithTTL(time.Minute))
	kv.armed.Store(true)
	if err := r.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 1)); err == nil {
		t.Fatal("Register whose reply was lost returned nil")
	} else {
		t.Logf("Register: %v", err)
	}
	admin := newClient(t)
	defer admin.Close()
	key := Key(cluster, "ctx", 0)
	g, err := admin.Get(ctxFor(t, 10*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || g.Kvs[0].Lease == 0 {
		t.Fatalf("%s after the failed Register: %v, want its record under its unrevoked lease", key, g.Kvs)
	}
	ghostLease := clientv3.LeaseID(g.Kvs[0].Lease)
	noSelf := func(e Event) {
		if e.Instance == "ctx" || e.Record.Instance == "ctx" {
			t.Errorf("%v: an event about the rank whose Register failed", e)
		}
	}
	lease, err := admin.Grant(ctxFor(t, 10*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	// Markers: events come in revision order, so by a marker's Up the
	// registry applied everything written before it.
	adminRegister(t, admin, cluster, testRecord("gen", 0, 1), lease.ID)
	waitEvent(t, r, waitFor, "gen/0 up", func(e Event) bool { noSelf(e); return isUp("gen", 0, 1)(e) })
	if p := r.Peers(); len(p) != 1 || p[0].Instance != "gen" {
		t.Errorf("peers %v, want gen/0 only (not the rank whose Register failed)", p)
	}
	// The lease ends (its TTL): the record goes; that is no Down either.
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), ghostLease); err != nil {
		t.Fatal(err)
	}
	adminRegister(t, admin, cluster, testRecord("gen", 1, 1), lease.ID)
	waitEvent(t, r, waitFor, "gen/1 up", func(e Event) bool { noSelf(e); return isUp("gen", 1, 1)(e) })
	if p := r.Peers(); len(p) != 2 {
		t.Errorf("peers %v, want gen/0 and gen/1", p)
	}
}
