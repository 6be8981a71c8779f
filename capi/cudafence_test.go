package capi

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/cudatest"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestChunkCUDAWithoutDriver: a chunk behind a CUDA event is refused with
// ErrInvalidArgument naming cu_event when the handle is 0, and (where no
// CUDA driver is usable) with ErrUnsupported naming the missing driver;
// a refused chunk leaves the request going: a plain chunk then completes
// it. The driver case is skipped where a driver is present (test/gpu
// covers that side).
func TestChunkCUDAWithoutDriver(t *testing.T) {
	base := HandleCount()
	p, d := open(t, "capi-cu-p"), open(t, "capi-cu-d")
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "cu", PromptLen: 32, Context: "capi-cu-p"}})
	if err != nil {
		t.Fatal(err)
	}
	tx, th, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "cu", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	runs := []kvcache.BlockRun{{First: 0, IDs: src}}
	if err := tx.ChunkCUDA(0, 32, true, runs, 0, 0); Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "cu_event is 0") {
		t.Fatalf("ChunkCUDA(cu_event 0) = %v (%v), want INVALID_ARGUMENT naming cu_event", err, Code(err))
	}
	if err := tx.ChunkCUDA(0, 32, true, runs, 0x1000, -1); Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "device -1") {
		t.Fatalf("ChunkCUDA(device -1) = %v (%v), want INVALID_ARGUMENT naming the device", err, Code(err))
	}
	if cuda.Init() == nil {
		t.Log("a CUDA driver is present: its absence is not tested here")
	} else {
		err := tx.ChunkCUDA(0, 32, true, runs, 0x1000, 0) // no driver: the handle is never used
		if Code(err) != ErrUnsupported || !strings.Contains(err.Error(), "no CUDA driver") {
			t.Fatalf("ChunkCUDA without a driver = %v (%v), want UNSUPPORTED naming the missing CUDA driver", err, Code(err))
		}
		t.Logf("without a driver: %v", err)
	}
	if _, err := tx.Chunk(0, 32, true, runs, false); err != nil {
		t.Fatalf("plain chunk after the refused ones: %v", err)
	}
	if ev := waitFor(t, p, th); ev.Outcome != OutcomeDone {
		t.Fatalf("tx %+v", ev)
	}
	if ev := waitFor(t, d, rh); ev.Outcome != OutcomeReady {
		t.Fatalf("rx %+v", ev)
	}
	closeBoth(t, p, d)
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// TestChunkCUDACloseReleasesEvent (on the fake driver, in a child
// process): Close does not wait for a borrowed CUDA event that has not
// completed: it stops watching it, failing its chunk with the engine's
// closing, and leaves the event to its owner, who still queries and
// destroys it.
func TestChunkCUDACloseReleasesEvent(t *testing.T) {
	if !onFakeDriver(t, "TestChunkCUDACloseReleasesEvent", "FAKECUDA_COPY_DELAY_US=100") {
		return
	}
	base := HandleCount()
	dev, s := fakeStream(t)
	m, err := dev.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	// The engines first, then the event: its ≥ 200 ms pending start
	// after the (on a loaded machine, slow) opens, and cover only the
	// chunk's hand-over and the check below.
	p, _, err := Open(`{"instance":"capi-cu-p2",`+tinyLayout+`,"pool_bytes":65536,"workers":2,"metrics_addr":"127.0.0.1:0"}`, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := open(t, "capi-cu-d2")
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "cu2", PromptLen: 32, Context: "capi-cu-p2"}}); err != nil {
		t.Fatal(err)
	}
	tx, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "cu2", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := dev.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	for range 2000 { // 100 µs each on the fake driver: the event stays pending ≥ 200 ms
		if err := s.MemsetD8(m.Ptr(), 7, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.ChunkCUDA(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, uint64(ev.Handle()), 0); err != nil {
		t.Fatal(err)
	}
	tx.mu.Lock()
	watched := append([]*cuda.BorrowedFence(nil), tx.events...)
	tx.mu.Unlock()
	if len(watched) != 1 || watched[0].Event() != ev.Handle() {
		t.Fatalf("request watches %v, want one fence on event %#x", watched, ev.Handle())
	}
	if fired, err := watched[0].Fired(); fired {
		t.Fatalf("fence fired (%v) with 2,000 delayed memsets ahead of its event", err)
	}
	waitTxPastInit(t, p)
	closeBoth(t, p, d)
	fired, ferr := watched[0].Fired()
	if !fired || !errors.Is(ferr, cuda.ErrClosed) || !errors.Is(ferr, ErrEngineClosed) {
		t.Fatalf("after Close the event's fence is %v, %v; want released with the engine's closing", fired, ferr)
	}
	if _, qerr := ev.Query(); qerr != nil {
		t.Fatalf("the owner's event after Close: %v; want it still usable", qerr)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := ev.Close(); err != nil {
		t.Fatalf("the owner destroys its event: %v", err)
	}
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
	fmt.Println("CHILD-OK:", ferr)
}

// onFakeDriver reports whether this process is test's child on the fake
// CUDA driver. Otherwise it builds the driver (skipping test when it
// cannot), runs test in a child process on it with env added, fails test
// unless the child printed CHILD-OK, and returns false.
func onFakeDriver(t *testing.T, test string, env ...string) bool {
	t.Helper()
	if os.Getenv("KVXFER_CAPI_TEST_CHILD") == test {
		return true
	}
	out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, "^"+test+"$", append([]string{"KVXFER_CAPI_TEST_CHILD=" + test}, env...)...)
	if err != nil || !strings.Contains(out, "CHILD-OK") {
		t.Fatalf("child on the fake driver: %v\n%s", err, out)
	}
	return false
}

// fakeStream opens device 0 and a stream of it, closed when test ends.
func fakeStream(t *testing.T) (*cuda.Device, *cuda.Stream) {
	t.Helper()
	dev, err := cuda.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return dev, s
}

// TestChunkCUDAAfterEventsReleased (on the fake driver, in a child
// process): a chunk behind a CUDA event handed while the engine's close
// releases its requests' events — here after it, the interleaving the
// close can produce — is not left watched: nobody would release it, and
// kvxfer would go on querying the caller's event after the close returned.
func TestChunkCUDAAfterEventsReleased(t *testing.T) {
	if !onFakeDriver(t, "TestChunkCUDAAfterEventsReleased") {
		return
	}
	dev, s := fakeStream(t)
	p, d := open(t, "capi-cu-p3"), open(t, "capi-cu-d3")
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "cu3", PromptLen: 32, Context: "capi-cu-p3"}}); err != nil {
		t.Fatal(err)
	}
	tx, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "cu3", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := dev.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	tx.releaseEvents(fmt.Errorf("%w: engine closing (the test's)", ErrEngineClosed))
	if err := tx.ChunkCUDA(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, uint64(ev.Handle()), 0); err != nil {
		t.Fatal(err)
	}
	tx.mu.Lock()
	left := len(tx.events)
	tx.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d fence(s) watched after the request's events were released, want 0", left)
	}
	closeBoth(t, p, d)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("CHILD-OK")
}
