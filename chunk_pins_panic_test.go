//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestUntakenChunkUnpinnedWhenAnEffectPanics: a chunk the session does
// not take (here its payload is refused: the generation side is an older
// version) leaves the pins the handle took to the session's shell; when
// one of that step's effects panics (here the Decide), they are still
// released — before, the unpin ran only after the effects returned, the
// chunk's ledger record was consumed, and its blocks stayed pinned for
// good after Done (a review's test, checked to fail without the deferred
// unpin).
func TestUntakenChunkUnpinnedWhenAnEffectPanics(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(string, *kvxfer.Config) {})
	link.older.Store(true)
	ce, ge := c.ctx[0], c.gen[0]
	var fired atomic.Bool
	hook := func(side string, e actors.Effect) bool {
		d, ok := e.(actors.Decide)
		return side == "tx" && ok && d.Err != nil && strings.Contains(d.Err.Error(), "upgrade") && fired.CompareAndSwap(false, true)
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })

	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "leak", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "leak", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	first := kvcache.Chunk{Start: 0, End: 32}
	if err := tx.Chunk(first, first.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	// The stream exists once an op was posted: the next chunk's payload
	// is refused in onChunk (not taken), not at the RequestData.
	waitUntil(t, "an op posted", func() bool { return ce.Stats().OpsPosted > 0 })
	if err := tx.SetPayload(make([]byte, messages.LegacyMaxPayload+1)); err != nil {
		t.Fatal(err)
	}
	last := kvcache.Chunk{Start: 32, End: 64, FirstBlock: 32 / l.TokensPerBlock, Last: true}
	if err := tx.Chunk(last, last.Runs(l.TokensPerBlock, src), nil); err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, tx.Done())
	<-rx.Released()
	if !fired.Load() {
		t.Fatal("hook never fired: proves nothing")
	}
	if o.OK {
		t.Fatalf("tx %s: want the payload refused", o.Status)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ferr := ce.Pools().Free(src)
		if ferr == nil {
			return
		}
		if !errors.Is(ferr, kvcache.ErrBlockPinned) {
			t.Fatalf("free: %v", ferr)
		}
		if time.Now().After(deadline) {
			for g, st := range ce.Pools().Stats() {
				t.Logf("group %d: %d pinned", g, st.Pinned)
			}
			t.Fatalf("source blocks still pinned 10 s after Done: %v", ferr)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}
