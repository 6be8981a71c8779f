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

// TestCloseWithAPeerWriteInFlightIsUnproven: agent B's Close cannot stop
// a batch that agent A's endpoint accepted into B's region: A's copier
// copies it on B's memory once it gets to it. While it may, B's Close must
// not return nil (its owner would unmap the memory under the copy): it
// returns rdma.ErrCloseUnproven naming the registration, and nil once the
// batch has completed. The copier is held deterministically by an earlier
// batch's Done, which runs on the same goroutine, in post order. Before
// the fix B's Close returned nil with the batch still queued.
func TestCloseWithAPeerWriteInFlightIsUnproven(t *testing.T) {
	n := loopback.NewNetwork()
	a, b := loopback.New(loopback.WithNetwork(n)), loopback.New(loopback.WithNetwork(n))
	defer a.Close()
	src, _ := kvcache.NewHostRegion(4096)
	dst, _ := kvcache.NewHostRegion(4096)
	defer src.Close()
	sreg, err := a.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	dreg, err := b.Register(dst)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := a.Connect(b.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	copy(src.Bytes(), "late")
	seg := []kvcache.Segment{{Src: 0, Dst: 0, Len: 4}}
	holding, hold := make(chan struct{}), make(chan struct{})
	if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(), Segments: seg, Done: func(error) {
		close(holding)
		<-hold // the copier waits here: the next batch stays queued
	}}); err != nil {
		t.Fatal(err)
	}
	late := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(), Segments: []kvcache.Segment{{Src: 0, Dst: 8, Len: 4}},
		Done: func(err error) { late <- err }}); err != nil {
		t.Fatal(err)
	}
	<-holding

	err = b.Close()
	if !errors.Is(err, rdma.ErrCloseUnproven) {
		close(hold)
		t.Fatalf("B's Close with A's batch into its region queued: %v, want ErrCloseUnproven (the copy may still land in its memory)", err)
	}
	if !contains(err.Error(), "registration 1 (1 batches in flight)") {
		t.Errorf("B's Close: %q does not name the registration still written", err)
	}
	close(hold)
	if err := <-late; err != nil {
		t.Fatalf("the queued batch: Done(%v), want nil (accepted before B closed)", err)
	}
	if got := string(dst.Bytes()[8:12]); got != "late" {
		t.Errorf("the queued batch landed %q, want %q", got, "late")
	}
	if err := b.Close(); err != nil {
		t.Errorf("B's Close again, the batch completed: %v, want nil", err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
