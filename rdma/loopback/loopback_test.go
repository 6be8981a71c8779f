package loopback_test

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair builds two agents of a network private to the test.
func pair(t *testing.T) rdmatest.Pair {
	n := loopback.NewNetwork()
	return rdmatest.Pair{
		Sender:   loopback.New(loopback.WithNetwork(n)),
		Receiver: loopback.New(loopback.WithNetwork(n)),
		NewDst:   kvcache.NewHostRegion,
	}
}

func TestConformance(t *testing.T) { rdmatest.Run(t, pair) }

func TestConnectAcrossNetworks(t *testing.T) {
	a := loopback.New(loopback.WithNetwork(loopback.NewNetwork()))
	b := loopback.New(loopback.WithNetwork(loopback.NewNetwork()))
	defer a.Close()
	defer b.Close()
	if _, err := a.Connect(b.Address()); !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Connect to an agent of another network: %v, want ErrPeerGone", err)
	}
}

func TestConnectToClosedAgent(t *testing.T) {
	a, b := loopback.New(), loopback.New() // the process-wide network
	defer a.Close()
	addr := b.Address()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Connect(addr); !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Connect to a closed agent: %v, want ErrPeerGone", err)
	}
}

func TestConnectToSelf(t *testing.T) {
	a := loopback.New()
	defer a.Close()
	r, _ := kvcache.NewHostRegion(256)
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := a.Connect(a.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	copy(r.Bytes(), "hello")
	done := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: reg, Dst: reg.Remote(), Segments: []kvcache.Segment{{Src: 0, Dst: 100, Len: 5}},
		Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := string(r.Bytes()[100:105]); got != "hello" {
		t.Errorf("self-copy landed %q, want %q", got, "hello")
	}
}

func TestErrorsNameTheValue(t *testing.T) {
	a := loopback.New()
	defer a.Close()
	_, err := a.Connect([]byte("loopback:x:00"))
	if err == nil || !errors.Is(err, rdma.ErrBadAddress) {
		t.Fatalf("Connect: %v, want ErrBadAddress", err)
	}
	if want := `"loopback:x:00"`; !contains(err.Error(), want) {
		t.Errorf("error %q does not quote the address %s", err, want)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
