//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/rdma/faulty"
)

// TestSessionPanicRunningCloseEndpointStillDrains: a write hangs, the
// context side's deadline puts its op in doubt, and the drain grace's
// CloseEndpoint — the only thing that can prove the op over — panics
// once as the session runs it. The restart ran the rest of the effects
// but dropped that one: the op stayed IN_DOUBT for good (the drain timer
// fires once), so the session never drained, its source pins were held
// for the engine's life, Done never came and Close reported it undrained.
// Now the CloseEndpoint runs again after the restart (a panic that escapes
// it came before its stream took it): the close proves the op over, the
// request fails with its deadline, and every source pin goes at Done.
// twice: the run again panics too; the dropped CloseEndpoint is handed to
// its stream anyway (it never reached it), as a dropped EndStream is.
func TestSessionPanicRunningCloseEndpointStillDrains(t *testing.T) {
	for _, panics := range []int32{1, 2} {
		t.Run(fmt.Sprintf("panics=%d", panics), func(t *testing.T) { testSessionPanicRunningCloseEndpoint(t, panics) })
	}
}

func testSessionPanicRunningCloseEndpoint(t *testing.T, panics int32) {
	l := smallLayout()
	var hits atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		_, ok := e.(actors.CloseEndpoint)
		return ok && side == "tx" && hits.Add(1) <= panics
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	var hung atomic.Bool
	ce, ge := faultyPairWith(t, l, 1, nil, faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	_, tx, src := sendCut(t, ce, ge, l, "closepanic", 300*time.Millisecond)
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its CloseEndpoint panicked (%d panics): its op stayed in doubt", hits.Load())
	}
	if n := hits.Load(); n < panics {
		t.Fatalf("%d runs of the CloseEndpoint, want %d panics: the test proves nothing", n, panics)
	}
	if o.OK || !errors.Is(o.Err, kvxfer.ErrTimeout) {
		t.Fatalf("tx %s (%v): want FAILED by its deadline", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("the source blocks after Done: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// TestStreamDroppedCloseEndpointStillDrains: as
// TestSessionPanicRunningCloseEndpointStillDrains, but the peer stream
// panics twice taking the drain's CloseEndpoint and drops it. Before, the
// close never reached the worker: the op stayed IN_DOUBT for good (the
// drain timer fires once), the session never drained, its source pins
// were held for the engine's life, and Done never came. Now a stream that
// drops a CloseEndpoint whose hand-over to its worker never began hands
// it over anyway: the close proves the op over, and the request ends.
func TestStreamDroppedCloseEndpointStillDrains(t *testing.T) {
	l := smallLayout()
	var hits atomic.Int32
	hook := func(e actors.Effect) bool {
		_, ok := e.(actors.CloseEndpoint)
		return ok && hits.Add(1) <= 2
	}
	actors.PanicOnStream.Store(&hook)
	t.Cleanup(func() { actors.PanicOnStream.Store(nil) })
	var hung atomic.Bool
	ce, ge := faultyPairWith(t, l, 1, nil, faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	_, tx, src := sendCut(t, ce, ge, l, "closedrop", 300*time.Millisecond)
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its stream dropped its CloseEndpoint (%d panics): its op stayed in doubt", hits.Load())
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d panics taking the CloseEndpoint, want 2: the test proves nothing", n)
	}
	if o.OK || !errors.Is(o.Err, kvxfer.ErrTimeout) {
		t.Fatalf("tx %s (%v): want FAILED by its deadline", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("the source blocks after Done: %v", err)
	}
	if n := ce.Stats().StreamViolations; n != 0 {
		t.Fatalf("%d stream violations", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// TestSessionPanicTwiceArmingTheDrainTimerStillDrains: as
// TestSessionPanicRunningCloseEndpointStillDrains, but the session panics
// twice as it arms the drain timer (the StartTimer that the deadline's
// ops in doubt wait on): run again once, it panicked again and was
// dropped. Before, nothing ever closed the op's endpoint: it stayed
// IN_DOUBT for good (the deadline fires once), the session never drained,
// its source pins were held, Done never came and Close reported it
// undrained. Now a dropped timer is armed anyway: it touches no page and
// no peer.
func TestSessionPanicTwiceArmingTheDrainTimerStillDrains(t *testing.T) {
	l := smallLayout()
	var hits atomic.Int32
	hook := func(side string, e actors.Effect) bool {
		st, ok := e.(actors.StartTimer)
		return ok && side == "tx" && st.Kind == actors.TimerDrain && hits.Add(1) <= 2
	}
	actors.PanicOnEffect.Store(&hook)
	t.Cleanup(func() { actors.PanicOnEffect.Store(nil) })
	var hung atomic.Bool
	ce, ge := faultyPairWith(t, l, 1, nil, faulty.Hang(func(uint64, *rand.Rand) bool { return hung.CompareAndSwap(false, true) }))
	_, tx, src := sendCut(t, ce, ge, l, "drainpanic", 300*time.Millisecond)
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("no tx outcome 20 s after its drain timer was dropped (%d panics): its op stayed in doubt", hits.Load())
	}
	if n := hits.Load(); n < 2 {
		t.Fatalf("%d runs of the drain's StartTimer, want 2 panics: the test proves nothing", n)
	}
	if o.OK || !errors.Is(o.Err, kvxfer.ErrTimeout) {
		t.Fatalf("tx %s (%v): want FAILED by its deadline", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("the source blocks after Done: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}
