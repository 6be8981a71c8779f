package node_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestOpenNamesABindInUseBeforeThePool: a node whose tcp endpoint another
// socket holds fails Open with ErrEndpointInUse naming the endpoint
// before it allocates its pool (which for a pool of many GiB takes
// seconds): its log never says the pool was set up. (Checked to fail
// without the check in Open: the pool's "pool revokes" line was logged
// before the bind failed.)
func TestOpenNamesABindInUseBeforeThePool(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, gc := pair(t, shm.Backend)
	gc.Bind = "tcp://" + ln.Addr().String()
	logs := logged(t, &gc)
	_, err = node.Open(context.Background(), gc)
	if !errors.Is(err, zmq.ErrEndpointInUse) || !strings.Contains(err.Error(), gc.Bind) {
		t.Fatalf("Open on a tcp endpoint in use: %v, want ErrEndpointInUse naming %s", err, gc.Bind)
	}
	if logs.Has("pool revokes") {
		t.Fatal("the pool was set up before the endpoint in use was named")
	}
}

// TestOpenNamesAMetricsAddrInUseBeforeThePool: a metrics address another
// socket holds fails Open with ErrConfig naming metrics_addr before the
// pool is set up. (Checked to fail without checkMetricsFree: the pool was
// set up first, and the error named the engine's MetricsAddr.)
func TestOpenNamesAMetricsAddrInUseBeforeThePool(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, gc := pair(t, shm.Backend)
	gc.MetricsAddr = ln.Addr().String()
	logs := logged(t, &gc)
	_, err = node.Open(context.Background(), gc)
	if !errors.Is(err, node.ErrConfig) || !strings.Contains(err.Error(), "metrics_addr = \""+gc.MetricsAddr) {
		t.Fatalf("Open with a metrics address in use: %v, want ErrConfig naming metrics_addr %s", err, gc.MetricsAddr)
	}
	if logs.Has("pool revokes") {
		t.Fatal("the pool was set up before the metrics address in use was named")
	}
}
