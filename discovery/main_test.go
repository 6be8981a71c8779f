package discovery

import (
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/etcdlocal"
)

// One embedded etcd serves every test that needs one (each under its own
// cluster name), started on first use and stopped before the leak check.
var testEtcd etcdlocal.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	testEtcd.Close()
	if pkiOnce.dir != "" { // testPKI's, shared by the tests that ran
		if err := os.RemoveAll(pkiOnce.dir); err != nil {
			fmt.Fprintf(os.Stderr, "removing the test PKI: %v\n", err)
		}
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
	srv, err := testEtcd.Get()
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	return []string{srv.Endpoint()}
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
