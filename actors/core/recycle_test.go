package core

import (
	"testing"
	"time"
	"unsafe"
)

// stoppedTx is a session cancelled before any peer and released.
func stoppedTx(t *testing.T) *txHarness {
	h, _ := newTxHarness(t, txOpts{})
	h.start(32, time.Minute)
	h.chunk(0, 32, true)
	h.step(TxCancel{})
	h.fence(0)
	h.wantReleased(TxCancelled, ErrCancelled)
	return h
}

// TestRecycleReusesEffects: a step after Recycle emits into the handed
// back slice's storage (its old effects cleared first), and emits what it
// would have emitted into a new one.
func TestRecycleReusesEffects(t *testing.T) {
	h := stoppedTx(t)
	cancel := TxPeerCancel{Peer: 1, From: genPeer(1), Epoch: 1}
	first := h.s.Step(cancel, h.now)
	h.s.Unreturned()
	if len(first) != 1 {
		t.Fatalf("a Cancel after the stop: %s, want its CancelAck", fmtEffects(first))
	}
	want := fmtEffects(first)
	h.s.Recycle(first)
	if first[:cap(first)][0] != nil {
		t.Fatalf("Recycle left the effect it was handed in the slice: %v", first[:1])
	}
	again := h.s.Step(cancel, h.now)
	h.s.Unreturned()
	if unsafe.SliceData(again) != unsafe.SliceData(first) {
		t.Fatal("the step after Recycle did not reuse the slice handed back")
	}
	if got := fmtEffects(again); got != want {
		t.Fatalf("after Recycle: %s, want %s", got, want)
	}
	// A step's slice is its caller's until handed back.
	kept := h.s.Step(cancel, h.now)
	h.s.Unreturned()
	if unsafe.SliceData(kept) == unsafe.SliceData(again) {
		t.Fatal("a step reused a slice not handed back")
	}
}

// TestRecycleSavesTheEffectsSlice pins the allocation Recycle saves: the
// same step, its slice handed back each time, allocates one object fewer
// (the slice) than with a new slice each time (the CancelAck and its
// boxing remain).
func TestRecycleSavesTheEffectsSlice(t *testing.T) {
	h := stoppedTx(t)
	cancel := TxPeerCancel{Peer: 1, From: genPeer(1), Epoch: 1}
	var m any = cancel // boxed once, outside the runs
	fresh := testing.AllocsPerRun(100, func() {
		h.s.Step(m, h.now)
		h.s.Unreturned()
	})
	recycled := testing.AllocsPerRun(100, func() {
		h.s.Recycle(h.s.Step(m, h.now))
		h.s.Unreturned()
	})
	if recycled != fresh-1 {
		t.Fatalf("a step allocates %v objects with its slice recycled, %v without: want one fewer", recycled, fresh)
	}
}

// TestRxRecycleReusesEffects: as TestRecycleReusesEffects, for RxSession.
func TestRxRecycleReusesEffects(t *testing.T) {
	s := NewRxSession(RxConfig{Request: "r1"})
	handed := make([]Effect, 1, 4)
	handed[0] = Stop{}
	s.Recycle(handed)
	if handed[0] != nil {
		t.Fatalf("Recycle left the effect it was handed in the slice: %v", handed[0])
	}
	next := s.Step(RxBegin{}, testEpoch0)
	s.Unreturned()
	if unsafe.SliceData(next) != unsafe.SliceData(handed) {
		t.Fatalf("the step after Recycle did not reuse the slice handed back (%s)", fmtEffects(next))
	}
}
