package shm_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// deadWriterEnv makes the test binary, re-executed, the writer of
// TestDeadWritersBatchesAreReleased; its value is "<address> <key hex>
// <len>" of the receiver's region.
const deadWriterEnv = "KVXFER_SHM_DEAD_WRITER"

// heldLine: the writer holds a batch in flight.
const heldLine = "KVXFER-SHM HELD"

// TestDeadWriterChild is the writer: batch A's Done blocks the endpoint's
// copier, so batch B, accepted behind it, stays in flight (its lease and
// its writer slot counted) until stdin closes — or the parent kills it.
func TestDeadWriterChild(t *testing.T) {
	spec := os.Getenv(deadWriterEnv)
	if spec == "" {
		t.Skip("runs only as TestDeadWritersBatchesAreReleased's child")
	}
	f := strings.Fields(spec)
	if len(f) != 3 {
		t.Fatalf("bad %s %q", deadWriterEnv, spec)
	}
	key, err := hex.DecodeString(f[1])
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	dst := rdma.RemoteRegion{Key: key, Len: n}

	a := shm.New()
	defer a.Close()
	ep, err := a.Connect([]byte(f[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	src, err := kvcache.NewHostRegion(n)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := a.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	stdinClosed := make(chan struct{})
	go func() {
		os.Stdin.Read(make([]byte, 1)) // EOF when the parent is done with us
		close(stdinClosed)
	}()
	entered := make(chan struct{})
	if err := ep.Post(rdma.Batch{Src: reg, Dst: dst, Segments: []kvcache.Segment{{Len: n}}, Done: func(error) {
		close(entered)
		<-stdinClosed
	}}); err != nil {
		t.Fatal(err)
	}
	rdmatest.Recv(t, entered, "batch A's Done")
	if err := ep.Post(rdma.Batch{Src: reg, Dst: dst, Segments: []kvcache.Segment{{Len: n}}}); err != nil {
		t.Fatal(err)
	}
	fmt.Println(heldLine)
	<-stdinClosed
}

// TestDeadWritersBatchesAreReleased: a writer process holds a batch in
// flight into the receiver's region. While it lives — running or stopped —
// the receiver's Deregister reports the region busy; once it is SIGKILLed
// (it can write no more) Deregister succeeds and the region closes: the
// receiver releases the dead writer's batches, counted in its writer slot.
// (Before writer slots, the region stayed busy for ever.)
func TestDeadWritersBatchesAreReleased(t *testing.T) {
	if os.Getenv(deadWriterEnv) != "" {
		t.Skip("parent only")
	}
	const n = 1 << 20
	r, c, err := shm.NewRegion("", n)
	if err != nil {
		t.Fatal(err)
	}
	a := shm.New()
	closed := false
	t.Cleanup(func() {
		a.Close()
		if !closed {
			c.Close()
		}
	})
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	rr := reg.Remote()
	child := rdmatest.StartChild(t, "TestDeadWriterChild",
		fmt.Sprintf("%s=%s %s %d", deadWriterEnv, a.Address(), hex.EncodeToString(rr.Key), rr.Len))
	child.Expect(t, heldLine)

	if err := a.Deregister(reg); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Fatalf("Deregister with a live writer's batch in flight: %v, want ErrRegionBusy", err)
	}
	child.Stop(t) // stopped is alive: it may resume and write
	if err := a.Deregister(reg); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Fatalf("Deregister with a stopped writer's batch in flight: %v, want ErrRegionBusy", err)
	}
	if err := child.Process().Kill(); err != nil {
		t.Fatal(err)
	}
	child.Reap(t)
	if err := a.Deregister(reg); err != nil {
		t.Fatalf("Deregister after the writer was killed with a batch in flight: %v, want nil", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("region Close: %v", err)
	}
	closed = true
}
