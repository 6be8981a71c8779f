package discovery

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// One embedded etcd serves every test that needs one (each under its own
// cluster name), started on first use and stopped before the leak check.
var testEtcd struct {
	once sync.Once
	srv  *embed.Etcd
	dir  string
	eps  []string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testEtcd.srv != nil {
		testEtcd.srv.Close()
		os.RemoveAll(testEtcd.dir)
	}
	if code == 0 {
		// No ignore list: etcd's server and client leave no goroutine
		// behind once closed.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// freeURLs picks n distinct free ports on 127.0.0.1 (all listeners are
// held until every port is picked, so the ports differ).
func freeURLs(n int) ([]url.URL, error) {
	var out []url.URL
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, url.URL{Scheme: "http", Host: l.Addr().String()})
	}
	return out, nil
}

// etcdEndpoints starts the shared embedded etcd (quick election: 10 ms
// ticks, 100 ms election timeout, so leases down to 1 s) and returns its
// client endpoints.
func etcdEndpoints(t testing.TB) []string {
	t.Helper()
	testEtcd.once.Do(func() {
		// A port picked free may be taken by another process before etcd
		// binds it: try a few times.
		for range 5 {
			testEtcd.err = startEtcd()
			if testEtcd.err == nil || !strings.Contains(testEtcd.err.Error(), "address already in use") {
				return
			}
		}
	})
	if testEtcd.err != nil {
		t.Fatalf("embedded etcd: %v", testEtcd.err)
	}
	return testEtcd.eps
}

// newClient dials the embedded etcd; the test closes it.
func newClient(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: etcdEndpoints(t), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func startEtcd() error {
	dir, err := os.MkdirTemp("", "kvxfer-discovery-etcd")
	if err != nil {
		return err
	}
	urls, err := freeURLs(2)
	if err != nil {
		return err
	}
	peer, client := urls[0], urls[1]
	cfg := embed.NewConfig()
	cfg.Name = "discovery-test"
	cfg.Dir = dir
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		srv.Close()
		os.RemoveAll(dir)
		return fmt.Errorf("embedded etcd not ready after 30 s")
	}
	testEtcd.srv, testEtcd.dir, testEtcd.eps = srv, dir, []string{client.Host}
	return nil
}
