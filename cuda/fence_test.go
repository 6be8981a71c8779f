package cuda

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHostFence: callbacks registered before and after firing each run
// exactly once with the fence's error; a second Fire changes nothing.
func TestHostFence(t *testing.T) {
	boom := errors.New("boom")
	f := NewHostFence()
	var got []error
	var mu sync.Mutex
	record := func(err error) { mu.Lock(); got = append(got, err); mu.Unlock() }
	f.OnReady(record)
	f.OnReady(record)
	if ok, _ := f.Fired(); ok {
		t.Fatal("fresh fence reports fired")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := f.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on an unfired fence: %v, want the context's deadline", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- f.Wait(context.Background()) }()
	f.Fire(boom)
	f.Fire(nil)
	f.OnReady(record)
	if err := <-waited; !errors.Is(err, boom) {
		t.Errorf("Wait = %v, want boom", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("%d callbacks, want 3", len(got))
	}
	for i, err := range got {
		if !errors.Is(err, boom) {
			t.Errorf("callback %d got %v, want boom", i, err)
		}
	}
	if ok, err := f.Fired(); !ok || !errors.Is(err, boom) {
		t.Errorf("Fired() = %v, %v", ok, err)
	}
	n := 0
	FiredFence(nil).OnReady(func(err error) {
		if err == nil {
			n++
		}
	})
	if n != 1 {
		t.Errorf("FiredFence(nil): callback ran %d times at once, want 1", n)
	}
}

// TestHostFenceConcurrent: OnReady racing Fire from many goroutines calls
// each callback exactly once.
func TestHostFenceConcurrent(t *testing.T) {
	for range 50 {
		f := NewHostFence()
		var calls atomic.Int32
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { f.OnReady(func(error) { calls.Add(1) }) })
		}
		wg.Go(func() { f.Fire(nil) })
		wg.Wait()
		if c := calls.Load(); c != 8 {
			t.Fatalf("%d callbacks ran, want 8", c)
		}
	}
}

// gate is a Waitable that completes when opened.
type gate struct {
	open atomic.Bool
	err  error
}

func (g *gate) Query() (bool, error) {
	if !g.open.Load() {
		return false, nil
	}
	return true, g.err
}

// TestQueueOrder: callbacks of one queue run in Add order, one at a time,
// whatever order their waits complete in; a failed wait passes its error.
func TestQueueOrder(t *testing.T) {
	p := NewPoller(20 * time.Microsecond)
	q := p.NewQueue()
	const n = 6
	gates := make([]*gate, n)
	order := make(chan int, n+1)
	var running atomic.Int32
	for i := range gates {
		gates[i] = &gate{}
		if i == 3 {
			gates[i].err = errors.New("failed")
		}
		if err := q.Add(gates[i], func(err error) {
			if running.Add(1) != 1 {
				t.Errorf("callbacks of one queue overlap")
			}
			if (i == 3) != (err != nil) {
				t.Errorf("wait %d: %v", i, err)
			}
			order <- i
			running.Add(-1)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Add(nil, func(error) { order <- n }); err != nil { // a marker
		t.Fatal(err)
	}
	for i := n - 1; i >= 0; i-- { // complete in reverse
		gates[i].open.Store(true)
		if i > 0 {
			time.Sleep(100 * time.Microsecond) // let the poller see a not-ready head
		}
	}
	for want := 0; want <= n; want++ {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("callback %d ran in position %d", got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("callback %d never ran", want)
		}
	}
	if q.Len() != 0 {
		t.Errorf("Len = %d after every wait completed", q.Len())
	}
}

// TestQueueClose: Close waits for a callback in progress, then runs the
// rest with its error, in order, on the caller; later Adds are refused.
func TestQueueClose(t *testing.T) {
	p := NewPoller(0)
	if p.Interval() != DefaultPollInterval {
		t.Errorf("NewPoller(0).Interval() = %v", p.Interval())
	}
	q := p.NewQueue()
	entered, unblock := make(chan struct{}), make(chan struct{})
	if err := q.Add(nil, func(error) { close(entered); <-unblock }); err != nil {
		t.Fatal(err)
	}
	<-entered
	closing := errors.New("closing")
	var got []error
	for range 3 {
		if err := q.Add(&gate{}, func(err error) { got = append(got, err) }); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan struct{})
	go func() { q.Close(closing); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a callback of the queue was running")
	case <-time.After(20 * time.Millisecond):
	}
	close(unblock)
	<-closed
	if len(got) != 3 {
		t.Fatalf("%d pending callbacks ran at Close, want 3", len(got))
	}
	for _, err := range got {
		if !errors.Is(err, closing) {
			t.Errorf("pending callback got %v, want the Close error", err)
		}
	}
	if err := q.Add(nil, func(error) { t.Error("callback of a refused Add ran") }); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v, want ErrClosed", err)
	}
	q.Close(closing) // idempotent
}
