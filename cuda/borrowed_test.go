package cuda

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchEventNoDriver: without a driver library a fence on a caller's
// event fails at once, saying the CUDA driver is missing, and a zero
// handle is refused as a bad handle before anything is loaded; nothing
// crashes. Runs in a child process whose driver library does not exist.
func TestWatchEventNoDriver(t *testing.T) {
	if os.Getenv("KVXFER_CUDA_TEST_CHILD") == "nodriver" {
		if _, err := WatchEvent(0, 0, nil); !errors.Is(err, ErrBadHandle) || !strings.Contains(err.Error(), "handle 0") {
			t.Fatalf("WatchEvent(handle 0) = %v, want ErrBadHandle naming the handle", err)
		}
		if _, err := WatchEvent(-1, 0x1000, nil); !errors.Is(err, ErrBadHandle) || !strings.Contains(err.Error(), "ordinal -1") {
			t.Fatalf("WatchEvent(ordinal -1) = %v, want ErrBadHandle naming the ordinal", err)
		}
		f, err := WatchEvent(0, 0x1000, nil) // never dereferenced: there is no driver
		if f != nil || !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "no CUDA driver") {
			t.Fatalf("WatchEvent without a driver = %v, %v; want ErrNoDevice saying no CUDA driver", f, err)
		}
		fmt.Println("CHILD-OK:", err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchEventNoDriver$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVXFER_CUDA_TEST_CHILD=nodriver", LibraryEnv+"=/nonexistent/libcuda.so.1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CHILD-OK:") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for l := range strings.Lines(string(out)) {
		if strings.HasPrefix(l, "CHILD-OK:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestBorrowedFence: a fence on an event the test owns fires nil once the
// memset recorded before it landed (the bytes are there when it fires);
// the package neither destroys nor records the event, which the owner
// records and watches again afterwards.
func TestBorrowedFence(t *testing.T) {
	d := device(t)
	s := stream(t, d)
	const n = 1 << 16
	m := alloc(t, d, n)
	ev, err := d.NewEvent() // the "framework's" event
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ev.Close(); err != nil {
			t.Errorf("owner's event Close: %v", err)
		}
	}()
	p := NewPoller(20 * time.Microsecond)
	got := make([]byte, n)
	for round, v := range []byte{0x5a, 0xc3} {
		for i := range 8 { // a few stream ops, each delayed by the fake driver
			if err := s.MemsetD8(m.Ptr()+DevicePtr(i*n/8), v, n/8); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Record(ev); err != nil {
			t.Fatalf("round %d: owner records its event: %v", round, err)
		}
		f, err := d.WatchEvent(ev.Handle(), p)
		if err != nil {
			t.Fatal(err)
		}
		if f.Event() != ev.Handle() {
			t.Errorf("fence on %#x, want %#x", f.Event(), ev.Handle())
		}
		var calls atomic.Int32
		landed := make(chan bool, 1)
		f.OnReady(func(err error) {
			if err != nil {
				t.Errorf("round %d: fence fired with %v", round, err)
			}
			if calls.Add(1) == 1 { // the bytes, read as the fence fires
				b := make([]byte, n)
				if err := d.CopyDtoH(b, m.Ptr()); err != nil {
					t.Error(err)
				}
				landed <- bytes.Equal(b, bytes.Repeat([]byte{v}, n))
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("round %d: Wait: %v", round, err)
		}
		cancel()
		if !<-landed {
			t.Fatalf("round %d: fence fired before the memset recorded ahead of it landed", round)
		}
		f.Release(errors.New("late")) // after firing: changes nothing
		if ok, err := f.Fired(); !ok || err != nil {
			t.Errorf("round %d: after Release Fired() = %v, %v; want true, nil", round, ok, err)
		}
		if c := calls.Load(); c != 1 {
			t.Errorf("round %d: callback ran %d times", round, c)
		}
		if ok, err := ev.Query(); !ok || err != nil { // still the owner's, still alive
			t.Fatalf("round %d: owner's event after the fence: %v, %v", round, ok, err)
		}
		if err := d.CopyDtoH(got, m.Ptr()); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{v}, n)) {
			t.Fatalf("round %d: memory after the fence: %v", round, err)
		}
	}
	if _, err := d.WatchEvent(0, p); !errors.Is(err, ErrBadHandle) {
		t.Errorf("WatchEvent(0) = %v, want ErrBadHandle", err)
	}
}

// TestBorrowedFenceRelease: Release of a fence whose event has not
// completed fires it at once with ErrClosed and the reason, exactly once;
// the poller then drops the event without firing again.
func TestBorrowedFenceRelease(t *testing.T) {
	d := device(t)
	s := stream(t, d)
	// 2,000 memsets ahead of the event keep it pending for ≥ 200 ms: on the
	// fake driver each is delayed 100 µs (FAKECUDA_COPY_DELAY_US); on a GPU
	// each sets 256 MiB (≥ 512 GB in all, ≥ 0.1 s at any HBM speed).
	size := uint64(4096)
	if os.Getenv("FAKECUDA_COPY_DELAY_US") == "" {
		size = 256 << 20
	}
	m := alloc(t, d, size)
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	for range 2000 {
		if err := s.MemsetD8(m.Ptr(), 1, size); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	p := NewPoller(20 * time.Microsecond)
	f, err := d.WatchEvent(ev.Handle(), p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f.Fired(); ok {
		t.Fatalf("fence fired (%v) while 2,000 delayed memsets were ahead of its event", err)
	}
	var calls atomic.Int32
	var got atomic.Pointer[error]
	f.OnReady(func(err error) { calls.Add(1); got.Store(&err) })
	reason := errors.New("request cancelled")
	f.Release(reason)
	if c := calls.Load(); c != 1 {
		t.Fatalf("callback ran %d times at Release, want 1", c)
	}
	if e := *got.Load(); !errors.Is(e, ErrClosed) || !errors.Is(e, reason) {
		t.Fatalf("released fence fired with %v, want ErrClosed and the reason", e)
	}
	f.Release(nil) // idempotent
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if ok, err := ev.Query(); !ok || err != nil {
		t.Fatalf("owner's event: %v, %v", ok, err)
	}
	if c := calls.Load(); c != 1 {
		t.Errorf("callback ran %d times, want 1", c)
	}
}
