package discovery

import (
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// stoppableEtcd is an embedded etcd the test stops and starts again on
// the same ports and data, as an operator restarts etcd.
type stoppableEtcd struct {
	t            *testing.T
	dir          string
	peer, client url.URL
	srv          *embed.Etcd
}

func newStoppableEtcd(t *testing.T) *stoppableEtcd {
	t.Helper()
	var urls []url.URL
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		urls = append(urls, url.URL{Scheme: "http", Host: l.Addr().String()})
		defer l.Close()
	}
	s := &stoppableEtcd{t: t, dir: t.TempDir(), peer: urls[0], client: urls[1]}
	t.Cleanup(s.stop)
	return s
}

func (s *stoppableEtcd) start() {
	s.t.Helper()
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "outage", s.dir
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{s.peer}, []url.URL{s.peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{s.client}, []url.URL{s.client}
	cfg.InitialCluster = cfg.Name + "=" + s.peer.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(waitFor):
		srv.Close()
		s.t.Fatal("etcd not ready")
	}
	s.srv = srv
}

func (s *stoppableEtcd) stop() {
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}

// TestEtcdReopenAfterAnOutageLongerThanTheTTL: etcd stops for longer
// than a rank's TTL, so the rank's client gives its lease up (Lost,
// keepalive stopped), then etcd comes back — with every lease it held,
// renewed for a TTL, as etcd does on restart. The rank is closed and
// opened again, as a node that lost its membership must be: its Close
// withdraws its old record now that etcd answers, and the new
// incarnation registers at once. The Close withdrew nothing after the
// Lost, and every rank of the cluster, reopened, waited a whole TTL
// behind its own dead record, named as held by a live lease.
func TestEtcdReopenAfterAnOutageLongerThanTheTTL(t *testing.T) {
	const ttl = 3 * time.Second
	etcd := newStoppableEtcd(t)
	etcd.start()
	eps := []string{etcd.client.Host}
	cluster := clusterName(t)
	a, err := NewEtcd(ctxFor(t, 10*time.Second), eps, cluster, WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Register(ctxFor(t, 10*time.Second), testRecord("ctx", 0, 1)); err != nil {
		t.Fatal(err)
	}
	etcd.stop()
	lost := waitEvent(t, a, waitFor, "ctx/0 Lost", func(e Event) bool { return e.Kind == EventLost })
	if lost.Reason != ReasonKeepaliveStopped {
		t.Fatalf("Lost %q, want %q", lost.Reason, ReasonKeepaliveStopped)
	}
	etcd.start()
	if err := a.Close(); err != nil {
		t.Fatalf("Close after the Lost, etcd back: %v", err)
	}
	var held atomic.Int32
	b, err := NewEtcd(ctxFor(t, 10*time.Second), eps, cluster, WithTTL(ttl), WithOnHeld(func(Record) { held.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Register(ctxFor(t, waitFor), testRecord("ctx", 0, 2)); err != nil {
		t.Fatal(err)
	}
	if n := held.Load(); n != 0 {
		t.Errorf("the reopened rank found its rank held %d times (by its own closed incarnation's record)", n)
	}
}
