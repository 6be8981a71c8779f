package kvxfer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Issue 17, writer self-fencing: a context engine with a writer lease of
// 1 s on a fake clock holds its lease on the generation peer from the
// peer's RequestData on; it keeps its request through 0.9 s of silence,
// and once the lease lapses (no heartbeat renewed it) it stops: the
// request fails with ErrPeerGone, the lapse is counted, the generation
// side hears the failure, and nothing leaks.
func TestWriterLeaseLapseFencesWriter(t *testing.T) {
	clk := actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))
	l := smallLayout()
	link := control.NewMemLink()
	c := &cluster{ctxPar: tp1, genPar: tp1}
	for _, inst := range []string{"ctx", "gen"} {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 1 << 20,
			Workers: 1, Link: link, Clock: clk, TransferTimeout: time.Minute, WriterLease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if inst == "ctx" {
			c.ctx = append(c.ctx, e)
		} else {
			c.gen = append(c.gen, e)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.Close(ctx); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
	}
	ctxE, gen := c.ctx[0], c.gen[0]
	src, err := ctxE.Pools().Alloc([]int{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ctxE.Send(context.Background(), kvxfer.SendRequest{ID: "lease", PromptLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "lease", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	// The chunk's KV is never ready: the writer holds the request open.
	chunks, err := kvcache.Chunks(32, 32, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	fence := &kvxfer.ManualFence{}
	if err := tx.Chunk(chunks[0], chunks[0].Runs(l.TokensPerBlock, src), fence); err != nil {
		t.Fatal(err)
	}
	settle(t, clk)
	for range 9 {
		clk.Advance(100 * time.Millisecond)
	}
	settle(t, clk)
	if err := tx.Err(); err != nil {
		t.Fatalf("decided within its lease: %v", err)
	}
	if n := ctxE.Stats().LeasesLapsed; n != 0 {
		t.Fatalf("%d leases lapsed within 0.9 s of a 1 s lease", n)
	}
	// Past the lease: the writer decides at once (its op still waits for
	// the fence, which keeps the source pinned); then the fence fires and
	// nothing is posted.
	deadline := time.Now().Add(10 * time.Second)
	for tx.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatalf("writer not decided 10 s of real time after its lease lapsed (fake time %v)", clk.Now())
		}
		clk.Advance(10 * time.Millisecond)
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	fence.Fire(nil)
	to, ro := advanceUntil(t, clk, tx.Done(), rx.Done())
	if n := ctxE.Stats().OpsPosted; n != 0 {
		t.Fatalf("%d ops posted by a writer whose lease lapsed before its KV was ready", n)
	}
	if to.OK || !errors.Is(to.Err, kvxfer.ErrPeerGone) {
		t.Fatalf("writer after its lease lapsed: %s %v, want a failure by ErrPeerGone", to.Status, to.Err)
	}
	if ro.OK {
		t.Fatalf("receiver READY after the writer fenced itself")
	}
	if n := ctxE.Stats().LeasesLapsed; n != 1 {
		t.Fatalf("LeasesLapsed = %d, want 1", n)
	}
	if err := ctxE.Pools().Free(src); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}
