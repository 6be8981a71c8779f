package discovery

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/etcdlocal"
)

// One embedded etcd serves every test that needs one (each under its own
// cluster name), started on first use and stopped before the leak check.
var testEtcd struct {
	once sync.Once
	srv  *etcdlocal.Server
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testEtcd.srv != nil {
		testEtcd.srv.Close()
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

// etcdEndpoints starts the shared embedded etcd (etcdlocal: quick
// election, so leases down to 1 s) and returns its client endpoints.
func etcdEndpoints(t testing.TB) []string {
	t.Helper()
	testEtcd.once.Do(func() { testEtcd.srv, testEtcd.err = etcdlocal.Start() })
	if testEtcd.err != nil {
		t.Fatalf("embedded etcd: %v", testEtcd.err)
	}
	return []string{testEtcd.srv.Endpoint()}
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
