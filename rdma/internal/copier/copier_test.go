package copier

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLease(t *testing.T) {
	var l Lease
	if l.State() != Live || l.Acquire() != Live || l.Acquire() != Live || l.InFlight() != 2 {
		t.Fatalf("fresh lease: state %v, in flight %d", l.State(), l.InFlight())
	}
	if l.TryRetire() {
		t.Fatal("TryRetire with 2 in flight succeeded")
	}
	l.Release()
	l.Release()
	if !l.TryRetire() || l.State() != Retired || l.Acquire() != Retired || l.InFlight() != 0 {
		t.Fatalf("after retire: state %v, in flight %d", l.State(), l.InFlight())
	}
	if l.TryRetire() {
		t.Error("second TryRetire succeeded")
	}
	l.Renew()
	if l.Acquire() != Live {
		t.Fatal("renewed lease not live")
	}
	l.ForceRetire(true)
	if l.State() != Gone || l.Acquire() != Gone || l.InFlight() != 1 {
		t.Fatalf("force-retired: state %v, in flight %d", l.State(), l.InFlight())
	}
	l.Release()
	l.Reset(false)
	if l.State() != Live || l.InFlight() != 0 {
		t.Fatalf("reset: state %v, in flight %d", l.State(), l.InFlight())
	}
}

func TestCheckSegments(t *testing.T) {
	for _, c := range []struct {
		segs []kvcache.Segment
		bad  int // -1: none
	}{
		{nil, -1},
		{[]kvcache.Segment{{Src: 0, Dst: 0, Len: 100}, {Src: 100, Dst: 100, Len: 0}}, -1},
		{[]kvcache.Segment{{Src: 0, Dst: 0, Len: 101}}, 0},
		{[]kvcache.Segment{{Src: 0, Dst: 0, Len: 1}, {Src: 0, Dst: 50, Len: 51}}, 1},
		{[]kvcache.Segment{{Src: math.MaxUint64, Dst: 0, Len: 2}}, 0},
		{[]kvcache.Segment{{Src: 1, Dst: 1, Len: math.MaxUint64}}, 0},
	} {
		err := CheckSegments(c.segs, 100, 100)
		var se *rdma.SegmentError
		switch {
		case c.bad < 0 && err != nil:
			t.Errorf("%v: %v, want nil", c.segs, err)
		case c.bad >= 0 && (!errors.As(err, &se) || se.Index != c.bad || !errors.Is(err, rdma.ErrOutOfRange)):
			t.Errorf("%v: %v, want segment %d out of range", c.segs, err, c.bad)
		}
	}
}

func recvErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("no completion")
		return nil
	}
}

func TestCopyInOrder(t *testing.T) {
	c := New("test")
	defer c.Close()
	src := bytes.Repeat([]byte("abcdefgh"), 1<<18) // 2 MiB: more than one chunk
	dst := make([]byte, len(src))
	var order []int
	done := make(chan error, 3)
	for i, segs := range [][]kvcache.Segment{
		{{Src: 0, Dst: 0, Len: uint64(len(src))}},
		{{Src: 1, Dst: 0, Len: 1}},
	} {
		if err := c.Post(Job{Src: src, Dst: dst, Segs: segs, Done: func(err error) { order = append(order, i); done <- err }}); err != nil {
			t.Fatal(err)
		}
	}
	c.Flush(func(err error) { order = append(order, 2); done <- err })
	for range 3 {
		if err := recvErr(t, done); err != nil {
			t.Fatal(err)
		}
	}
	if len(order) != 3 || order[0] != 0 || order[1] != 1 || order[2] != 2 {
		t.Errorf("completion order %v, want [0 1 2]", order)
	}
	if dst[0] != 'b' || !bytes.Equal(dst[1:], src[1:]) {
		t.Errorf("copy result wrong")
	}
}

// TestCloseFailsQueuedJobs: jobs queued behind a blocked one complete with
// ErrEndpointClosed, their leases released, nothing copied; Post and Flush
// after Close are refused.
func TestCloseFailsQueuedJobs(t *testing.T) {
	c := New("test")
	src, dst := []byte("xxxx"), make([]byte, 4)
	entered, unblock := make(chan struct{}), make(chan struct{})
	if err := c.Post(Job{Src: src, Dst: dst, Done: func(error) { close(entered); <-unblock }}); err != nil {
		t.Fatal(err)
	}
	<-entered
	var l Lease
	l.Acquire()
	done := make(chan error, 2)
	if err := c.Post(Job{Src: src, Dst: dst, Segs: []kvcache.Segment{{Len: 4}}, Done: func(err error) { done <- err }, Leases: [2]*Lease{&l}}); err != nil {
		t.Fatal(err)
	}
	c.Flush(func(err error) { done <- err })
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	deadline := time.Now().Add(30 * time.Second)
	for !c.Closed() { // Close sets the flag, then waits for the goroutine
		select {
		case <-closed:
			t.Fatal("Close returned while a Done was still running")
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("Close did not start")
		}
	}
	close(unblock)
	<-closed
	for range 2 {
		if err := recvErr(t, done); !errors.Is(err, rdma.ErrEndpointClosed) {
			t.Errorf("queued job/flush: %v, want ErrEndpointClosed", err)
		}
	}
	if l.InFlight() != 0 {
		t.Errorf("lease of a failed job still holds %d", l.InFlight())
	}
	if !bytes.Equal(dst, make([]byte, 4)) {
		t.Errorf("a job failed at Close copied: %q", dst)
	}
	if err := c.Post(Job{Done: func(err error) { t.Errorf("Done(%v) after a refused Post", err) }}); !errors.Is(err, rdma.ErrEndpointClosed) {
		t.Errorf("Post after Close: %v", err)
	}
	var flushErr error
	c.Flush(func(err error) { flushErr = err })
	if !errors.Is(flushErr, rdma.ErrEndpointClosed) {
		t.Errorf("Flush after Close: %v, want ErrEndpointClosed at once", flushErr)
	}
	c.Close() // idempotent
}

// TestFlushWhileClosingKeepsItsPlace: a Flush made while Close runs (the
// goroutine still completing jobs posted earlier) calls done after those
// jobs, in its place (package rdma: a flush's done is a proof that every
// batch posted before it completed), not at once on the caller's
// goroutine. Job 1's Done waits for the test — against the rule that Done
// must not block — to hold the goroutine mid-queue, as a descheduled
// copier or a chunk still copying would.
func TestFlushWhileClosingKeepsItsPlace(t *testing.T) {
	c := New("test")
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	entered, hold := make(chan struct{}), make(chan struct{})
	if err := c.Post(Job{Done: func(error) { close(entered); <-hold; note("job1") }}); err != nil {
		t.Fatal(err)
	}
	job2 := make(chan struct{})
	if err := c.Post(Job{Done: func(error) { note("job2"); close(job2) }}); err != nil {
		t.Fatal(err)
	}
	<-entered
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	deadline := time.Now().Add(10 * time.Second)
	for !c.Closed() {
		if time.Now().After(deadline) {
			t.Fatal("Close never started")
		}
		runtime.Gosched()
	}
	flushed := make(chan error, 1)
	c.Flush(func(err error) { note("flush"); flushed <- err })
	close(hold)
	<-job2
	<-closed
	if err := <-flushed; !errors.Is(err, rdma.ErrEndpointClosed) {
		t.Fatalf("flush after Close: %v, want ErrEndpointClosed", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 3 || order[2] != "flush" {
		t.Fatalf("completion order %v, want [job1 job2 flush]: the flush's done ran before jobs posted earlier completed", order)
	}
}
