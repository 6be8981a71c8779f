package kvxfer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestCloseWithADeadlineAlreadyPast: an engine with nothing live closes
// cleanly even when Close's ctx has already ended (Close(0) from the C
// ABI): nothing was left to drain, so that is no failure to drain.
// (Checked to fail with the ctx's end taken as undrained whatever the
// parents say: 5 of 5 closes failed.)
func TestCloseWithADeadlineAlreadyPast(t *testing.T) {
	l := smallLayout()
	tp1 := kvcache.Parallel{TP: 1, PP: 1}
	for i := range 5 {
		c := startCluster(t, l, tp1, tp1, 1)
		transfer(t, c, l, "before-close", i+1, 64, 32, i%2 == 0)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		for _, e := range append(c.gen, c.ctx...) {
			if err := e.Close(done); err != nil {
				t.Fatalf("round %d: Close with its ctx ended, nothing live: %v", i, err)
			}
		}
	}
}

// TestFinishedRequestsHoldNoTimers: once every request is over, no timer
// of the engine is left armed: a request that waited for destination
// blocks stops its queue deadline when it starts, instead of leaving a
// timer (and, through it, the engine) alive until the deadline. (Checked
// to fail without the stop: one timer per request stayed armed.)
func TestFinishedRequestsHoldNoTimers(t *testing.T) {
	clk := actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))
	l := smallLayout()
	tp1 := kvcache.Parallel{TP: 1, PP: 1}
	c := &cluster{link: control.NewMemLink(), ctxPar: tp1, genPar: tp1}
	for _, inst := range []string{"ctx", "gen"} {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 4 << 20,
			Workers: 1, Link: c.link, TransferTimeout: 20 * time.Second, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		if inst == "ctx" {
			c.ctx = append(c.ctx, e)
		} else {
			c.gen = append(c.gen, e)
		}
	}
	for i := range 3 {
		transfer(t, c, l, "timers-"+string(rune('a'+i)), i+1, 64, 32, i%2 == 0)
	}
	deadline := time.Now().Add(10 * time.Second)
	for clk.Pending() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d timers still armed 10 s after every request ended", clk.Pending())
		}
		time.Sleep(time.Millisecond)
	}
	checkNoLeaks(t, c)
}

// closingLink holds the first RequestData delivered to the context rank
// until that rank's listener begins to close: the link has taken the frame
// (its Send returned nil to the generation side) and delivers it while the
// context engine stops listening.
type closingLink struct {
	*control.MemLink
	closing chan struct{} // closed as the context rank's listener closes
	held    sync.Once
}

func (l *closingLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	if self.From.Instance != "ctx" {
		return l.MemLink.Listen(self, deliver)
	}
	lis, err := l.MemLink.Listen(self, func(f messages.Frame) {
		if _, ok := f.(*messages.RequestData); ok {
			l.held.Do(func() { <-l.closing })
		}
		deliver(f)
	})
	if err != nil {
		return nil, err
	}
	return closingListener{lis, l.closing}, nil
}

type closingListener struct {
	control.Listener
	closing chan struct{}
}

func (l closingListener) Close() error {
	close(l.closing)
	return l.Listener.Close()
}

// TestCloseAnswersFramesTakenWhileClosing: a RequestData the context
// rank's link took as its engine closes (the generation side cancelled
// the request meanwhile) is answered before the engine stops, so the
// generation side has its proof and drains. (Checked to fail without the
// change: the frame reached the engine after its workers stopped, no
// answer left, and the generation side's Close reported the request
// undrained.)
func TestCloseAnswersFramesTakenWhileClosing(t *testing.T) {
	l := smallLayout()
	c := startClusterOn(t, l, tp1, tp1, 1, clusterOpts{link: func(inst string, ml *control.MemLink) control.Link {
		return &closingLink{MemLink: ml, closing: make(chan struct{})}
	}})
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "late", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	rx.Cancel()
	waitOutcome(t, rx.Done())
	if err := c.ctx[0].Close(context.Background()); err != nil {
		t.Fatalf("context rank close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.gen[0].Close(ctx); err != nil {
		t.Fatalf("the context rank closed, yet the generation rank cannot drain: %v (%d blocks quarantined)",
			err, c.gen[0].Pools().Quarantined())
	}
}

// startPool starts an engine of its own link whose pool is poolBytes
// (64 MiB and more: mapped for the engine, unmapped by Close).
func startPool(t *testing.T, poolBytes uint64) *kvxfer.Engine {
	t.Helper()
	l := smallLayout()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: poolBytes,
		Link: control.NewMemLink(), TransferTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestBlockAfterClose: once Close unmapped the pool, Block is nil (before:
// it sliced the unmapped region's nil bytes and panicked).
func TestBlockAfterClose(t *testing.T) {
	e := startPool(t, 64<<20)
	if b := e.Block(0, 0); len(b) == 0 {
		t.Fatal("Block(0, 0) of a live engine is empty")
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b := e.Block(0, 0); b != nil {
		t.Fatalf("Block after Close: %d bytes of an unmapped pool", len(b))
	}
}

// TestBlockAndAllocAfterCloseOfASmallPool: a pool under the size from
// which it is mapped is Go memory, which Close does not unmap; Block is
// nil after Close all the same, as documented, and Pools().Alloc fails
// with ErrClosed. (Checked to fail: with Region.Close marking only the
// regions it unmaps, Block returned the block; without Pools.Close, Alloc
// handed out blocks of a closed engine.)
func TestBlockAndAllocAfterCloseOfASmallPool(t *testing.T) {
	e := startPool(t, 1<<20)
	if b := e.Block(0, 0); len(b) == 0 {
		t.Fatal("Block(0, 0) of a live engine is empty")
	}
	one := make([]int, e.Pools().Groups())
	for g := range one {
		one[g] = 1
	}
	if _, err := e.Pools().Alloc(one); err != nil {
		t.Fatalf("Alloc of a live engine: %v", err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b := e.Block(0, 0); b != nil {
		t.Fatalf("Block after Close: %d bytes, want nil", len(b))
	}
	if ids, err := e.Pools().Alloc(one); !errors.Is(err, actors.ErrClosed) {
		t.Fatalf("Alloc after Close: %v %v, want ErrClosed", ids, err)
	}
}

// TestConcurrentClose: Closes from several goroutines run the close once
// and all return its result (before: each unmapped the pool, a data race
// that -race reports, and a second munmap could fail).
func TestConcurrentClose(t *testing.T) {
	e := startPool(t, 64<<20)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = e.Close(context.Background()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Close %d: %v", i, err)
		}
	}
}

// TestBlockConcurrentWithClose: Engine.Block while Close runs (every
// Engine method is safe for concurrent use) does not race with Close's
// unmapping of the pool: the region's bytes are withdrawn (an atomic flag)
// before the unmap, and Block returns nil from then on. Before, Block read
// the region's slice while Close wrote it (-race reported it). The pool is
// 64 MiB, the size from which it is mapped rather than Go heap.
func TestBlockConcurrentWithClose(t *testing.T) {
	e := startPool(t, 64<<20)
	stop, started := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = e.Block(0, 0) // nil once closed
			if i == 0 {
				close(started)
			}
		}
	})
	<-started // Block runs while Close does
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if b := e.Block(0, 0); b != nil {
		t.Fatalf("Block after Close: %d bytes, want nil", len(b))
	}
}

// TestCloseAtReleasedFindsTheSessionGone: a caller woken by a failed
// receive's Released (the C ABI posts the request's event then) that
// closes the engine at once, with no time left, finds nothing live: the
// receive's session stopped before Released said so. The framework owns
// the blocks and allocates from the pool meanwhile, as a serving process
// does. (Checked to fail with the session saying Released before it told
// its parent it stopped: the close reported "1 sessions still draining:
// [rx:owned]" in 10 rounds of 10.)
func TestCloseAtReleasedFindsTheSessionGone(t *testing.T) {
	l := smallLayout()
	counts := make([]int, len(l.Groups))
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(64, grp.Window, l.TokensPerBlock, 0)
		counts[g] = end - first
	}
	for round := range 10 {
		link := control.NewMemLink()
		start := func(inst string, poolBytes uint64) *kvxfer.Engine {
			e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: poolBytes, Workers: 1,
				Link: link, TransferTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
		ce, ge := start("ctx", 1<<20), start("gen", 128<<20)
		own, err := ge.Pools().Alloc(counts)
		if err != nil {
			t.Fatal(err)
		}
		rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "owned", PromptLen: 64, Context: "ctx", Blocks: own})
		if err != nil {
			t.Fatal(err)
		}
		// The framework takes and gives back every free block meanwhile.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				free := make([]int, len(counts))
				for g, s := range ge.Pools().Stats() {
					free[g] = s.Free
				}
				if ids, err := ge.Pools().Alloc(free); err == nil {
					_ = ge.Pools().Free(ids)
				}
			}
		})
		// The context rank has the request from its RequestData (no Send):
		// it answers the Cancel, the proof that releases the blocks.
		rx.Cancel()
		if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled {
			t.Fatalf("round %d: %s %v, want CANCELLED", round, o.Status, o.Err)
		}
		select {
		case <-rx.Released():
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: not Released within 10 s of the CancelAck", round)
		}
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		err = ge.Close(ended)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: Close with no time left, at the only request's Released: %v, want nil (nothing live)", round, err)
		}
		if err := ce.Close(context.Background()); err != nil {
			t.Fatalf("round %d: context rank close: %v", round, err)
		}
	}
}
