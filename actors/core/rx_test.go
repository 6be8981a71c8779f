package core

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// This file drives RxSession.Step directly, with a fake clock.

func ctxPeer(w int) messages.PeerID { return messages.PeerID{Instance: "ctx", Rank: int32(w)} }

var testRxBlocks = [][]kvcache.BlockID{{1, 2}, {3}}

// rxHarness wraps an RxSession with the checks every step must pass: a
// terminal state never changes, Finish at most once and with the state's
// status, Cancel only to writers still pending, ReleaseDest only when every
// writer is quiescent and never for blocks handed to the handle, nothing
// after Stop.
type rxHarness struct {
	t        testing.TB
	s        *RxSession
	now      time.Time
	finishes []Outcome
	releases int
	stopped  bool
}

func newRxHarness(t testing.TB, writers int, deadline time.Duration) *rxHarness {
	cfg := RxConfig{Request: "r1", Epoch: 7, Self: messages.PeerID{Instance: "gen", Rank: 0}, Blocks: testRxBlocks}
	if deadline > 0 {
		cfg.Deadline = testEpoch0.Add(deadline)
	}
	for w := range writers {
		cfg.Writers = append(cfg.Writers, RxWriter{Peer: ctxPeer(w), Worker: w % 2, Bytes: 32,
			Request: &messages.RequestData{RequestID: "r1", Epoch: 7, From: cfg.Self}})
	}
	return &rxHarness{t: t, s: NewRxSession(cfg), now: testEpoch0}
}

func (h *rxHarness) step(msg any) []Effect {
	h.t.Helper()
	before := h.s.State()
	effs := h.s.Step(msg, h.now)
	if h.stopped && len(effs) > 0 {
		h.t.Fatalf("%T after Stop: %s", msg, fmtEffects(effs))
	}
	if before.Terminal() && h.s.State() != before {
		h.t.Fatalf("%T: terminal %v overwritten by %v", msg, before, h.s.State())
	}
	for _, e := range effs {
		switch e := e.(type) {
		case Finish:
			h.finishes = append(h.finishes, e.Outcome)
			if len(h.finishes) > 1 {
				h.t.Fatalf("%T: second Finish %+v", msg, e.Outcome)
			}
			if e.Outcome.Status != h.s.State().Status() || e.Outcome.OK != (h.s.State() == RxReady) {
				h.t.Fatalf("%T: Finish %s ok=%v in state %v", msg, e.Outcome.Status, e.Outcome.OK, h.s.State())
			}
		case SendFrame:
			if _, ok := e.Frame.(*messages.Cancel); ok {
				// A writer whose RequestData was refused for good is
				// told (onSent), though it never got the request.
				w := int(e.To.Rank)
				if h.s.writers[w] != writerPending && !RefusedForGood(h.s.sendErr[w]) {
					h.t.Fatalf("%T: Cancel to writer %d, which is quiescent", msg, w)
				}
			}
		case ReleaseDest:
			h.releases++
			if !h.s.WritersQuiescent() {
				h.t.Fatalf("%T: ReleaseDest with a writer pending", msg)
			}
			if h.s.State() == RxReady {
				h.t.Fatalf("%T: ReleaseDest of blocks handed to the handle", msg)
			}
			if h.releases > 1 {
				h.t.Fatalf("%T: second ReleaseDest", msg)
			}
		case Stop:
			h.stopped = true
		}
	}
	return effs
}

func (h *rxHarness) result(w int, status messages.Status, bytes uint64) []Effect {
	h.t.Helper()
	return h.step(RxFrame{Writer: w, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(w), Status: status, Bytes: bytes}})
}

func (h *rxHarness) cancelAck(w int) []Effect {
	h.t.Helper()
	return h.step(RxFrame{Writer: w, Frame: &messages.CancelAck{RequestID: "r1", Epoch: 7, From: ctxPeer(w)}})
}

func (h *rxHarness) wantState(want RxState) {
	h.t.Helper()
	if got := h.s.State(); got != want {
		h.t.Fatalf("state %v, want %v (err %v)", got, want, h.s.Err())
	}
}

// cancelsTo returns the writers (ranks) a Cancel frame goes to.
func cancelsTo(effs []Effect) []int {
	var out []int
	for _, f := range effectsOf[SendFrame](effs) {
		if c, ok := f.Frame.(*messages.Cancel); ok {
			if c.Epoch != 7 || c.RequestID != "r1" {
				panic(fmt.Sprintf("cancel %+v", c))
			}
			out = append(out, int(f.To.Rank))
		}
	}
	return out
}

func TestRx_ReadyWhenAllWritersSucceed(t *testing.T) {
	h := newRxHarness(t, 2, 10*time.Second)
	effs := h.step(RxBegin{})
	h.wantState(RxReceiving)
	if ts := effectsOf[StartTimer](effs); len(ts) != 1 || !ts[0].At.Equal(testEpoch0.Add(10*time.Second)) {
		t.Fatalf("begin: want the deadline timer: %s", fmtEffects(effs))
	}
	sends := effectsOf[SendRequestData](effs)
	if len(sends) != 2 || sends[0].To != ctxPeer(0) || sends[1].To != ctxPeer(1) || sends[1].Worker != 1 || sends[1].Writer != 1 {
		t.Fatalf("begin: want RequestData to both writers: %s", fmtEffects(effs))
	}
	if effs := h.result(0, messages.StatusSuccess, 32); len(effs) != 0 {
		t.Fatalf("first success: %s", fmtEffects(effs))
	}
	h.wantState(RxReceiving)
	effs = h.step(RxFrame{Writer: 1, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(1),
		Status: messages.StatusSuccess, Bytes: 32, Payload: []byte("tok")}})
	h.wantState(RxReady)
	wantNo(t, "READY", effs, "ReleaseDest", "SendFrame")
	if len(h.finishes) != 1 || !h.s.Stopped() {
		t.Fatalf("finishes %v stopped %v", h.finishes, h.s.Stopped())
	}
	out := h.finishes[0]
	if !out.OK || out.Bytes != 64 || string(out.Payload) != "tok" || !slices.EqualFunc(out.Blocks, testRxBlocks, slices.Equal) {
		t.Fatalf("outcome %+v", out)
	}
}

func TestRx_NoWritersIsReadyAtOnce(t *testing.T) {
	h := newRxHarness(t, 0, 0)
	effs := h.step(RxBegin{})
	h.wantState(RxReady)
	if !hasEffect[Finish](effs) || !hasEffect[Stop](effs) || hasEffect[ReleaseDest](effs) {
		t.Fatalf("begin: %s", fmtEffects(effs))
	}
}

// TestRx_FailureReleasesOnlyWhenWritersQuiescent: one writer fails; the
// handle hears FAILED at once and every pending writer gets a Cancel, but
// the destination pages are released only when every writer is quiescent —
// by a Result, a CancelAck or its endpoint closing (RxPeerGone).
//
// Guard, removed by hand and seen to fail this test: maybeRelease's
// `!s.WritersQuiescent()` (ReleaseDest at the first failure: the harness's
// "ReleaseDest with a writer pending" fails).
func TestRx_FailureReleasesOnlyWhenWritersQuiescent(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(h *rxHarness, w int) []Effect
	}{
		{"result", func(h *rxHarness, w int) []Effect { return h.result(w, messages.StatusCancelled, 0) }},
		{"cancel-ack", func(h *rxHarness, w int) []Effect { return h.cancelAck(w) }},
		{"peer-gone", func(h *rxHarness, w int) []Effect {
			return h.step(RxPeerGone{Writer: w, Err: errors.New("endpoint closed")})
		}},
		{"late success", func(h *rxHarness, w int) []Effect { return h.result(w, messages.StatusSuccess, 32) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRxHarness(t, 3, 0)
			h.step(RxBegin{})
			h.result(0, messages.StatusSuccess, 32)
			effs := h.step(RxFrame{Writer: 1, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(1),
				Status: messages.StatusFailed, Error: "boom"}})
			h.wantState(RxFailed)
			if !errors.Is(h.s.Err(), ErrPeerFailed) {
				t.Fatalf("err %v", h.s.Err())
			}
			if f := effectsOf[Finish](effs); len(f) != 1 || f[0].Outcome.OK || f[0].Outcome.Blocks != nil {
				t.Fatalf("failure: want Finish FAILED at once: %s", fmtEffects(effs))
			}
			if got := cancelsTo(effs); !slices.Equal(got, []int{2}) {
				t.Fatalf("cancels to %v, want [2] (the only pending writer)", got)
			}
			wantNo(t, "writer 2 pending", effs, "ReleaseDest", "Stop")

			effs = tc.stop(h, 2)
			h.wantState(RxFailed)
			if r := effectsOf[ReleaseDest](effs); len(r) != 1 || !slices.EqualFunc(r[0].Blocks, testRxBlocks, slices.Equal) {
				t.Fatalf("want ReleaseDest once writer 2 is quiescent: %s", fmtEffects(effs))
			}
			if !hasEffect[Stop](effs) || hasEffect[Finish](effs) {
				t.Fatalf("release: %s", fmtEffects(effs))
			}
		})
	}
}

// TestRx_TimeoutThenLateSuccess: the deadline passes: TIMED_OUT at once,
// Cancel to the pending writer; its late SUCCESS makes it quiescent but does
// not change the outcome; only then are the pages released.
func TestRx_TimeoutThenLateSuccess(t *testing.T) {
	h := newRxHarness(t, 2, 10*time.Second)
	h.step(RxBegin{})
	h.result(0, messages.StatusSuccess, 32)
	h.now = h.now.Add(10 * time.Second)
	effs := h.step(RxTimeout{})
	h.wantState(RxTimedOut)
	if !errors.Is(h.s.Err(), ErrTimeout) {
		t.Fatalf("err %v", h.s.Err())
	}
	if got := cancelsTo(effs); !slices.Equal(got, []int{1}) {
		t.Fatalf("cancels to %v, want [1]", got)
	}
	wantNo(t, "timeout with a writer pending", effs, "ReleaseDest", "Stop")
	effs = h.result(1, messages.StatusSuccess, 32)
	h.wantState(RxTimedOut)
	wantNo(t, "late success", effs, "Finish")
	if !hasEffect[ReleaseDest](effs) || !hasEffect[Stop](effs) {
		t.Fatalf("late success: want release: %s", fmtEffects(effs))
	}
	if h.finishes[0].Status != StatusTimedOut || h.finishes[0].OK {
		t.Fatalf("outcome %+v", h.finishes[0])
	}
}

// TestRx_StaleAndDuplicateFrames: a frame of another epoch, a second Result
// from a writer, a frame from an unknown writer or of another kind, and
// frames after the stop are counted and change nothing.
func TestRx_StaleAndDuplicateFrames(t *testing.T) {
	h := newRxHarness(t, 2, 0)
	h.step(RxBegin{})
	stale := func(msg any) {
		t.Helper()
		n := h.s.StaleFrames
		if effs := h.step(msg); len(effs) != 0 {
			t.Fatalf("%T: %s", msg, fmtEffects(effs))
		}
		if h.s.StaleFrames != n+1 {
			t.Fatalf("%T: stale %d, want %d", msg, h.s.StaleFrames, n+1)
		}
	}
	stale(RxFrame{Writer: 0, Frame: &messages.Result{RequestID: "r1", Epoch: 6, Status: messages.StatusFailed}})
	stale(RxFrame{Writer: 0, Frame: &messages.CancelAck{RequestID: "r1", Epoch: 8}})
	stale(RxFrame{Writer: 5, Frame: &messages.Result{RequestID: "r1", Epoch: 7, Status: messages.StatusFailed}})
	stale(RxFrame{Writer: 0, Frame: &messages.Heartbeat{}})
	h.wantState(RxReceiving)
	h.result(0, messages.StatusSuccess, 32)
	stale(RxFrame{Writer: 0, Frame: &messages.Result{RequestID: "r1", Epoch: 7, Status: messages.StatusFailed}})
	h.wantState(RxReceiving)
	h.result(1, messages.StatusSuccess, 32)
	h.wantState(RxReady)
	if h.finishes[0].Bytes != 64 {
		t.Fatalf("bytes %d, want 64 (no duplicate counted)", h.finishes[0].Bytes)
	}
	stale(RxFrame{Writer: 1, Frame: &messages.Result{RequestID: "r1", Epoch: 7, Status: messages.StatusSuccess}})
}

// TestRx_InvalidResultFailsButProvesNothing: a writer's Result that failed
// validation (a status this version does not know) fails the request at
// once, naming the writer and the reason, instead of leaving it to the
// deadline; but it is no proof that the writer is done, so the writer is
// asked to stop and the blocks stay quarantined until its CancelAck. One
// of another epoch, or from a writer already done, is stale.
//
// Guard, removed by hand and seen to fail this test: onFrame's
// `if m.Invalid != nil` (the invalid SUCCESS of 32 bytes makes the
// request READY).
func TestRx_InvalidResultFailsButProvesNothing(t *testing.T) {
	h := newRxHarness(t, 2, 10*time.Second)
	h.step(RxBegin{})
	invalid := errors.New("result status 99, want 1..4")
	n := h.s.StaleFrames
	h.step(RxFrame{Writer: 1, Frame: &messages.Result{RequestID: "r1", Epoch: 6, From: ctxPeer(1)}, Invalid: invalid})
	h.wantState(RxReceiving)
	if h.s.StaleFrames != n+1 {
		t.Fatalf("an invalid Result of another epoch: stale %d, want %d", h.s.StaleFrames, n+1)
	}
	h.result(0, messages.StatusSuccess, 32)
	// Decoded, it carries what the writer sent: here a count that would
	// complete the request were the frame valid.
	effs := h.step(RxFrame{Writer: 1, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(1),
		Status: messages.StatusSuccess, Bytes: 32}, Invalid: invalid})
	h.wantState(RxFailed)
	if err := h.s.Err(); !errors.Is(err, ErrMismatch) || !errors.Is(err, invalid) ||
		!strings.Contains(err.Error(), "writer "+ctxPeer(1).String()+" sent an invalid Result") {
		t.Fatalf("err %v, want ErrMismatch naming writer %s's invalid Result and why", err, ctxPeer(1))
	}
	if f := effectsOf[Finish](effs); len(f) != 1 || f[0].Outcome.OK {
		t.Fatalf("want Finish FAILED at once: %s", fmtEffects(effs))
	}
	if got := cancelsTo(effs); !slices.Equal(got, []int{1}) {
		t.Fatalf("cancels to %v, want [1]: the invalid Result proves nothing", got)
	}
	if q := effectsOf[QuarantineDest](effs); len(q) != 1 || !slices.Equal(q[0].Writers, []int{1}) {
		t.Fatalf("want the blocks quarantined for writer 1: %s", fmtEffects(effs))
	}
	wantNo(t, "writer 1 unproven", effs, "ReleaseDest", "Stop")
	effs = h.cancelAck(1)
	if r := effectsOf[ReleaseDest](effs); len(r) != 1 || !r[0].Quarantined || !hasEffect[Stop](effs) {
		t.Fatalf("want the quarantined blocks released on writer 1's CancelAck: %s", fmtEffects(effs))
	}
}

// TestRx_CancelAndPanic: a local cancel is CANCELLED, a recovered panic
// FAILED; both wait for the writers' acknowledgements before releasing; a
// gone writer that already succeeded changes nothing.
func TestRx_CancelAndPanic(t *testing.T) {
	for _, tc := range []struct {
		msg  any
		want RxState
		err  error
	}{
		{RxCancel{}, RxCancelled, ErrCancelled},
		{RxPanic{Err: errors.New("nil map")}, RxFailed, ErrSessionCrashed},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			h := newRxHarness(t, 2, 0)
			h.step(RxBegin{})
			h.result(0, messages.StatusSuccess, 32)
			effs := h.step(tc.msg)
			h.wantState(tc.want)
			if !errors.Is(h.s.Err(), tc.err) {
				t.Fatalf("err %v, want %v", h.s.Err(), tc.err)
			}
			if got := cancelsTo(effs); !slices.Equal(got, []int{1}) {
				t.Fatalf("cancels to %v", got)
			}
			if effs := h.step(RxPeerGone{Writer: 0}); len(effs) != 0 {
				t.Fatalf("gone after success: %s", fmtEffects(effs))
			}
			effs = h.cancelAck(1)
			if !hasEffect[ReleaseDest](effs) {
				t.Fatalf("ack: %s", fmtEffects(effs))
			}
		})
	}
}

// TestRx_PeerGoneFails: a pending writer's endpoint closes: FAILED
// (ErrPeerGone), and it counts as quiescent.
func TestRx_PeerGoneFails(t *testing.T) {
	h := newRxHarness(t, 1, 0)
	h.step(RxBegin{})
	effs := h.step(RxPeerGone{Writer: 0, Err: errors.New("process died")})
	h.wantState(RxFailed)
	if !errors.Is(h.s.Err(), ErrPeerGone) {
		t.Fatalf("err %v", h.s.Err())
	}
	if len(cancelsTo(effs)) != 0 || !hasEffect[ReleaseDest](effs) || !hasEffect[Finish](effs) {
		t.Fatalf("gone: %s", fmtEffects(effs))
	}
}

// TestRx_OneCancelResendChain: a decided session re-sends Cancel to its
// pending writers on one timer chain, whatever asks for it. The deadline
// firing after another outcome used to start a second chain: two Cancels
// and two timers a second for as long as the quarantine lasted.
func TestRx_OneCancelResendChain(t *testing.T) {
	h := newRxHarness(t, 1, 10*time.Second)
	h.s.cfg.CancelResend = time.Second
	h.step(RxBegin{})
	h.step(RxSent{Writer: 0})
	effs := h.step(RxCancel{})
	h.wantState(RxCancelled)
	if got := cancelsTo(effs); !slices.Equal(got, []int{0}) {
		t.Fatalf("cancel: Cancels to %v, want [0]: %s", got, fmtEffects(effs))
	}
	if ts := effectsOf[StartTimer](effs); len(ts) != 1 || ts[0].Kind != TimerDrain {
		t.Fatalf("cancel: want one re-send timer: %s", fmtEffects(effs))
	}
	h.now = h.now.Add(10 * time.Second)
	if effs := h.step(RxTimeout{Kind: TimerDeadline}); len(effectsOf[StartTimer](effs)) != 0 || len(cancelsTo(effs)) != 0 {
		t.Fatalf("the deadline after the cancel: %s, want nothing (the re-send chain is armed)", fmtEffects(effs))
	}
	for i := range 3 {
		h.now = h.now.Add(time.Second)
		effs := h.step(RxTimeout{Kind: TimerDrain})
		if got, ts := cancelsTo(effs), effectsOf[StartTimer](effs); !slices.Equal(got, []int{0}) || len(ts) != 1 || ts[0].Kind != TimerDrain {
			t.Fatalf("re-send %d: %s, want one Cancel and one re-send timer", i, fmtEffects(effs))
		}
	}
	h.cancelAck(0)
	h.now = h.now.Add(time.Second)
	if effs := h.step(RxTimeout{Kind: TimerDrain}); len(effs) != 0 {
		t.Fatalf("re-send timer after the proof: %s, want nothing", fmtEffects(effs))
	}
}

// TestRx_AbandonWithNoBlocksStops: a request whose every block is a prefix
// hit holds no destination block, so when its engine closes it owes no one
// a proof and stops even though its writer never answered (the writer's
// engine closed first). It waited forever, and Close reported it as
// undrained (TestReceiveRefusesBadPrefixHits failed 1 run in ~20 under the
// race detector).
func TestRx_AbandonWithNoBlocksStops(t *testing.T) {
	h := newRxHarness(t, 1, time.Minute)
	h.s.cfg.Blocks = [][]kvcache.BlockID{{}, {}}
	h.step(RxBegin{})
	h.step(RxCancel{})
	h.step(RxSent{Writer: 0})
	if h.stopped {
		t.Fatal("stopped before the engine closed, with its writer pending")
	}
	h.step(RxCancel{Reason: ErrClosed})
	h.step(RxAbandon{})
	if !h.stopped {
		t.Fatal("a session holding no blocks did not stop when its engine closed")
	}
	if h.releases != 0 {
		t.Fatal("ReleaseDest with a writer pending")
	}
}

// TestRx_PeerGoneProvesOnlyItsIncarnation: RxPeerGone is a proof about one
// incarnation of the writer. It frees the blocks when it names the
// incarnation the request was addressed to, or when either side is not
// known (0); the death of another incarnation proves nothing and changes
// nothing: the writer stays pending, the request stays live.
//
// Guards, each removed by hand and seen to fail this test: the
// `m.Incarnation == s.cfg.Writers[m.Writer].Incarnation` clause of Step's
// RxPeerGone case ("another incarnation" frees the blocks), and its
// `s.cfg.Writers[m.Writer].Incarnation == 0` clause ("addressed to none"
// never ends).
func TestRx_PeerGoneProvesOnlyItsIncarnation(t *testing.T) {
	for _, tc := range []struct {
		name            string
		addressed, died uint64
		proof           bool
	}{
		{"the addressed incarnation", 5, 5, true},
		{"another incarnation", 5, 4, false},
		{"a later incarnation", 5, 6, false},
		{"incarnation of the death not known", 5, 0, true},
		{"addressed to none", 0, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRxHarness(t, 1, 10*time.Second)
			h.s.cfg.Writers[0].Incarnation = tc.addressed
			h.step(RxBegin{})
			h.step(RxSent{Writer: 0})
			effs := h.step(RxPeerGone{Writer: 0, Err: errors.New("process exited"), Incarnation: tc.died})
			if !tc.proof {
				if len(effs) != 0 {
					t.Fatalf("the death of incarnation %d: %s, want nothing", tc.died, fmtEffects(effs))
				}
				h.wantState(RxReceiving)
				if got := h.s.Unproven(); !slices.Equal(got, []int{0}) {
					t.Fatalf("unproven %v, want [0]", got)
				}
				return
			}
			h.wantState(RxFailed)
			if !errors.Is(h.s.Err(), ErrPeerGone) || !hasEffect[ReleaseDest](effs) || !h.s.Stopped() {
				t.Fatalf("proof: err %v, effects %s", h.s.Err(), fmtEffects(effs))
			}
		})
	}
}

// TestRx_WorkerDeadFailsOnlyItsRequests: a stopped sender worker fails the
// requests whose writers it served, and no other; the writers it served
// are not proven done, so the blocks go to quarantine.
//
// Guard, removed by hand and seen to fail this test: Step's RxWorkerDead
// `w.Worker == m.Worker` (flipped, the wrong requests fail).
func TestRx_WorkerDeadFailsOnlyItsRequests(t *testing.T) {
	for _, tc := range []struct {
		name   string
		worker int
		fails  bool
	}{
		{"its worker", 0, true},
		{"another worker", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRxHarness(t, 1, 10*time.Second) // writer 0 on worker 0
			h.step(RxBegin{})
			h.step(RxSent{Writer: 0})
			effs := h.step(RxWorkerDead{Worker: tc.worker})
			if !tc.fails {
				if len(effs) != 0 {
					t.Fatalf("worker %d stopped: %s, want nothing", tc.worker, fmtEffects(effs))
				}
				h.wantState(RxReceiving)
				return
			}
			h.wantState(RxFailed)
			if !errors.Is(h.s.Err(), ErrWorkerCrashed) || !h.s.Quarantined() || hasEffect[ReleaseDest](effs) {
				t.Fatalf("worker %d stopped: err %v quarantined %v: %s", tc.worker, h.s.Err(), h.s.Quarantined(), fmtEffects(effs))
			}
		})
	}
}

// TestRx_StraySentReportChangesNothing: RxSent answers the RequestData in
// flight to the worker. One that answers none (the RequestData already
// left) is no news: a refusal reported then does not make a writer that
// may be writing "never reached" — the blocks stay quarantined, not freed
// — nor re-send anything.
//
// Guard, removed by hand and seen to fail this test: onSent's
// `s.sent[m.Writer] != deliverySending`.
func TestRx_StraySentReportChangesNothing(t *testing.T) {
	for _, decided := range []bool{false, true} {
		t.Run(fmt.Sprintf("decided=%v", decided), func(t *testing.T) {
			h := newRxHarness(t, 1, 10*time.Second)
			h.step(RxBegin{})
			h.step(RxSent{Writer: 0}) // it left
			if decided {
				h.step(RxCancel{})
				h.wantState(RxCancelled)
				if !h.s.Quarantined() {
					t.Fatal("cancelled with the writer pending: want the blocks quarantined")
				}
			}
			effs := h.step(RxSent{Writer: 0, Err: errors.New("queue full")})
			if len(effs) != 0 {
				t.Fatalf("stray refusal: %s, want nothing", fmtEffects(effs))
			}
			if got := h.s.Unproven(); !slices.Equal(got, []int{0}) || h.s.Stopped() {
				t.Fatalf("stray refusal: unproven %v stopped %v, want [0] false", got, h.s.Stopped())
			}
		})
	}
}

// TestRx_ResendBackoffIsBounded: a refused RequestData is sent again after
// resendFirst, the delay doubling up to resendMax and staying there.
//
// Guard, removed by hand and seen to fail this test: onSent's
// `min(..., resendMax)`.
func TestRx_ResendBackoffIsBounded(t *testing.T) {
	h := newRxHarness(t, 1, time.Hour)
	h.step(RxBegin{})
	want := []time.Duration{20, 40, 80, 160, 320, 640, 1000, 1000, 1000}
	for i, d := range want {
		d *= time.Millisecond
		effs := h.step(RxSent{Writer: 0, Err: errors.New("not connected")})
		ts := effectsOf[StartTimer](effs)
		if len(ts) != 1 || ts[0].Kind != TimerResend || !ts[0].At.Equal(h.now.Add(d)) {
			t.Fatalf("refusal %d: want a re-send after %v: %s", i, d, fmtEffects(effs))
		}
		h.now = ts[0].At
		if sends := effectsOf[SendRequestData](h.step(RxTimeout{Kind: TimerResend})); len(sends) != 1 || sends[0].Writer != 0 {
			t.Fatalf("re-send %d: %v", i, sends)
		}
	}
	h.wantState(RxReceiving)
}

// TestRx_ReadyPayloadIsTheFirstWritersWhateverTheOrder: when context
// ranks set different payloads, READY hands over the first writer's (in
// the request's writer order) whichever Result came last — it took the
// last one to arrive, so the payload depended on timing.
func TestRx_ReadyPayloadIsTheFirstWritersWhateverTheOrder(t *testing.T) {
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			h := newRxHarness(t, 3, 10*time.Second)
			h.step(RxBegin{})
			for _, w := range order {
				var payload []byte
				if w > 0 { // writer 0 sends none
					payload = []byte(fmt.Sprintf("tok-%d", w))
				}
				h.step(RxFrame{Writer: w, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(w),
					Status: messages.StatusSuccess, Bytes: 32, Payload: payload}})
			}
			h.wantState(RxReady)
			if len(h.finishes) != 1 || string(h.finishes[0].Payload) != "tok-1" {
				t.Fatalf("outcome %+v, want writer 1's payload tok-1", h.finishes)
			}
		})
	}
}

// TestRx_ReadyKeepsTheOnlyPayload: READY hands over the payload a writer
// sent; another writer's Result without one does not erase it, whatever
// the order.
//
// Guard, removed by hand and seen to fail this test: onFrame's
// `len(f.Payload) > 0`.
func TestRx_ReadyKeepsTheOnlyPayload(t *testing.T) {
	for _, first := range []int{0, 1} {
		t.Run(fmt.Sprintf("payload from writer %d", first), func(t *testing.T) {
			h := newRxHarness(t, 2, 10*time.Second)
			h.step(RxBegin{})
			for _, w := range []int{first, 1 - first} {
				var payload []byte
				if w == first {
					payload = []byte("tok")
				}
				h.step(RxFrame{Writer: w, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(w),
					Status: messages.StatusSuccess, Bytes: 32, Payload: payload}})
			}
			h.wantState(RxReady)
			if len(h.finishes) != 1 || string(h.finishes[0].Payload) != "tok" {
				t.Fatalf("outcome %+v, want payload tok", h.finishes)
			}
		})
	}
}

// TestRx_ResultStatusNamesItsSentinel: a writer's CANCELLED Result ends
// the request CANCELLED with an error wrapping ErrPeerCancelled (the
// peer cancelled it), a FAILED one FAILED with ErrPeerFailed; each names
// the writer and the status. (Checked to fail: before, a CANCELLED Result
// wrapped ErrPeerFailed only.)
func TestRx_ResultStatusNamesItsSentinel(t *testing.T) {
	for _, tc := range []struct {
		status      messages.Status
		state       RxState
		want, other error
	}{
		{messages.StatusCancelled, RxCancelled, ErrPeerCancelled, ErrPeerFailed},
		{messages.StatusFailed, RxFailed, ErrPeerFailed, ErrPeerCancelled},
	} {
		h := newRxHarness(t, 1, 0)
		h.step(RxBegin{})
		h.result(0, tc.status, 0)
		h.wantState(tc.state)
		err := h.s.Err()
		if !errors.Is(err, tc.want) || errors.Is(err, tc.other) ||
			!strings.Contains(err.Error(), ctxPeer(0).String()) || !strings.Contains(err.Error(), tc.status.String()) {
			t.Fatalf("%s Result: %v, want %v (not %v) naming %s and %s", tc.status, err, tc.want, tc.other, ctxPeer(0), tc.status)
		}
	}
}

// TestRx_SuccessWithAnotherByteCountIsNeverReady: READY is exact
// (DESIGN.md §3): a writer's SUCCESS reporting more bytes than this rank
// planned fails the request as surely as one reporting fewer, naming both
// counts. The writer is done (a Result is its terminal frame), so the
// blocks are released, not quarantined.
//
// Guard, changed by hand and seen to fail this test: onFrame's
// `f.Bytes != want` (as `f.Bytes < want`: a SUCCESS of 33 or 64 bytes
// where 32 were planned made the request READY).
func TestRx_SuccessWithAnotherByteCountIsNeverReady(t *testing.T) {
	for _, got := range []uint64{0, 31, 33, 64} {
		t.Run(fmt.Sprint(got), func(t *testing.T) {
			h := newRxHarness(t, 2, 10*time.Second)
			h.step(RxBegin{})
			h.result(0, messages.StatusSuccess, 32)
			effs := h.result(1, messages.StatusSuccess, got)
			h.wantState(RxFailed)
			if err := h.s.Err(); !errors.Is(err, ErrMismatch) ||
				!strings.Contains(err.Error(), fmt.Sprintf("SUCCESS with %d bytes written, this rank planned 32", got)) {
				t.Fatalf("err %v, want ErrMismatch naming %d and 32 bytes", err, got)
			}
			if f := effectsOf[Finish](effs); len(f) != 1 || f[0].Outcome.OK || f[0].Outcome.Blocks != nil {
				t.Fatalf("want Finish FAILED without blocks: %s", fmtEffects(effs))
			}
			if r := effectsOf[ReleaseDest](effs); len(r) != 1 || r[0].Quarantined || !hasEffect[Stop](effs) {
				t.Fatalf("every writer is done: want the blocks released: %s", fmtEffects(effs))
			}
			wantNo(t, "every writer done", effs, "QuarantineDest", "SendFrame")
		})
	}
}

// TestRx_ReaddressedRequestData: RxAddress says the shell did not send a
// writer's RequestData because the writer restarted (its Hello names
// another incarnation). On a live request it goes again, addressed to the
// new incarnation, whose answers count from then on and the old one's do
// not; on a decided request it never left, so the writer is quiescent and
// the blocks go back; an RxAddress for a RequestData that already left
// (RxSent without error) is stray and changes nothing — the writer may be
// writing, addressed as it was.
//
// Guards, each removed by hand and seen to fail this test: onAddress's
// `s.sent[m.Writer] != deliverySending` (a stray RxAddress re-sends the
// RequestData; on a decided request it frees the blocks of a writer that
// got its RequestData), and its `if s.state.Terminal()` branch (a decided
// request sends its RequestData after the outcome and keeps its blocks
// waiting for an answer to it).
func TestRx_ReaddressedRequestData(t *testing.T) {
	const was, now = 3, 9
	newH := func(t *testing.T) *rxHarness {
		h := newRxHarness(t, 1, 10*time.Second)
		rd := *h.s.cfg.Writers[0].Request
		rd.ToIncarnation = was
		h.s.cfg.Writers[0].Request, h.s.cfg.Writers[0].Incarnation = &rd, was
		h.step(RxBegin{})
		return h
	}
	success := func(from uint64) RxFrame {
		return RxFrame{Writer: 0, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(0),
			Status: messages.StatusSuccess, Bytes: 32, Incarnations: messages.Incarnations{FromIncarnation: from}}}
	}
	t.Run("live", func(t *testing.T) {
		h := newH(t)
		old := h.s.cfg.Writers[0].Request
		effs := h.step(RxAddress{Writer: 0, Incarnation: now})
		sends := effectsOf[SendRequestData](effs)
		if len(sends) != 1 || sends[0].Writer != 0 || sends[0].Frame.ToIncarnation != now {
			t.Fatalf("want the RequestData again, addressed to incarnation %d: %s", now, fmtEffects(effs))
		}
		if old.ToIncarnation != was {
			t.Fatalf("the RequestData handed out before was changed in place: to %d", old.ToIncarnation)
		}
		h.step(RxSent{Writer: 0})
		if effs := h.step(success(was)); len(effs) != 0 || h.s.StaleFrames != 1 {
			t.Fatalf("a SUCCESS of incarnation %d: %s, stale %d; want nothing, 1", was, fmtEffects(effs), h.s.StaleFrames)
		}
		h.wantState(RxReceiving)
		h.step(success(now))
		h.wantState(RxReady)
	})
	t.Run("decided", func(t *testing.T) {
		h := newH(t)
		h.step(RxCancel{})
		h.wantState(RxCancelled)
		if !h.s.Quarantined() {
			t.Fatal("cancelled with the RequestData handed to a worker: want the blocks quarantined")
		}
		effs := h.step(RxAddress{Writer: 0, Incarnation: now})
		wantNo(t, "RxAddress after the outcome", effs, "SendRequestData", "SendFrame")
		if got := h.s.Unproven(); len(got) != 0 {
			t.Fatalf("unproven %v: the RequestData never left, want none", got)
		}
		if r := effectsOf[ReleaseDest](effs); len(r) != 1 || !r[0].Quarantined || !h.s.Stopped() {
			t.Fatalf("want the quarantined blocks released: %s", fmtEffects(effs))
		}
	})
	for _, decided := range []bool{false, true} {
		t.Run(fmt.Sprintf("stray/decided=%v", decided), func(t *testing.T) {
			h := newH(t)
			h.step(RxSent{Writer: 0}) // it left, addressed to incarnation was
			if decided {
				h.step(RxCancel{})
				h.wantState(RxCancelled)
			}
			if effs := h.step(RxAddress{Writer: 0, Incarnation: now}); len(effs) != 0 {
				t.Fatalf("stray RxAddress: %s, want nothing", fmtEffects(effs))
			}
			if got := h.s.Unproven(); !slices.Equal(got, []int{0}) || h.s.Stopped() {
				t.Fatalf("stray RxAddress: unproven %v stopped %v, want [0] false", got, h.s.Stopped())
			}
			if w := h.s.cfg.Writers[0]; w.Incarnation != was || w.Request.ToIncarnation != was {
				t.Fatalf("stray RxAddress readdressed the writer: %d, RequestData to %d", w.Incarnation, w.Request.ToIncarnation)
			}
			h.step(success(was))
			if decided {
				if !h.s.Stopped() || h.releases != 1 {
					t.Fatalf("the writer's Result: stopped %v releases %d, want true 1", h.s.Stopped(), h.releases)
				}
				return
			}
			h.wantState(RxReady)
		})
	}
}

// TestRx_RequestDataWaitsForTheRestartedWritersHello: a writer restarts
// while its request's RequestData is re-sent (refused while no incarnation
// listened). The new incarnation takes frames before its Hello is read on
// this side (the control plane still knows none: the old one said
// goodbye), and the RequestData, addressed to the old incarnation, is
// checked against the Hello just then. It used to leave (the shell let a
// frame addressed to a known incarnation go without a Hello): the new
// incarnation dropped it as stale, the session took it as delivered and
// never sent it again, and the request was lost at its deadline, its
// blocks quarantined. It waits for a Hello instead (Addressing refuses
// it), so the Hello read after the next backoff re-addresses it
// (RxAddress) and it reaches the new incarnation, addressed to it.
//
// This drives the session and Addressing as the shell does, one step at a
// time, the timers fired in order on the fake clock. Checked: with
// Addressing's refusal limited to frames addressed to no incarnation (as
// it was), this test fails (the RequestData reached the new incarnation
// addressed to the old one, and nothing was sent again).
func TestRx_RequestDataWaitsForTheRestartedWritersHello(t *testing.T) {
	const was, now = 3, 9
	h := newRxHarness(t, 1, 10*time.Second)
	rd := *h.s.cfg.Writers[0].Request
	rd.ToIncarnation = was
	h.s.cfg.Writers[0].Request, h.s.cfg.Writers[0].Incarnation = &rd, was
	// The control plane as the shell sees it: no Hello known (incarnation
	// was said goodbye), while incarnation now takes every frame that
	// leaves (reached: the incarnation each was addressed to).
	var hello *messages.Hello
	helloErr := fmt.Errorf("%w: ctx/0 said goodbye", ErrPeerGone)
	var reached []uint64
	var timers []StartTimer
	var shell func(effs []Effect)
	shell = func(effs []Effect) {
		for _, e := range effs {
			switch e := e.(type) {
			case StartTimer:
				timers = append(timers, e)
			case SendRequestData:
				if m := Addressing(e, hello, helloErr); m != nil {
					shell(h.step(m))
					continue
				}
				reached = append(reached, e.Frame.ToIncarnation)
				shell(h.step(RxSent{Writer: e.Writer}))
			}
		}
	}
	shell(h.step(RxBegin{}))
	// Incarnation now's Hello is read here from now on.
	hello, helloErr = &messages.Hello{From: ctxPeer(0), Incarnation: now}, nil
	for len(timers) > 0 && !h.s.State().Terminal() && !slices.Contains(reached, now) {
		slices.SortStableFunc(timers, func(a, b StartTimer) int { return a.At.Compare(b.At) })
		next := timers[0]
		timers = timers[1:]
		h.now = next.At
		shell(h.step(RxTimeout{Kind: next.Kind}))
	}
	if !slices.Equal(reached, []uint64{now}) {
		t.Fatalf("RequestData reached the new incarnation addressed to %v, want once to %d (state %v, err %v, quarantined %v)",
			reached, now, h.s.State(), h.s.Err(), h.s.Quarantined())
	}
	h.wantState(RxReceiving)
	if w := h.s.cfg.Writers[0]; w.Incarnation != now {
		t.Fatalf("the writer is addressed as incarnation %d, want %d", w.Incarnation, now)
	}
	h.step(RxFrame{Writer: 0, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(0),
		Status: messages.StatusSuccess, Bytes: 32, Incarnations: messages.Incarnations{FromIncarnation: now}}})
	h.wantState(RxReady)
}

// TestRx_AddressingUnknownHelloWaits: Addressing with no Hello known
// refuses the frame (it waits), whatever it is addressed to; a Hello of
// the frame's incarnation lets it go; another incarnation's re-addresses
// it; a Hello without an incarnation (an older peer) lets it go.
func TestRx_AddressingUnknownHelloWaits(t *testing.T) {
	gone := fmt.Errorf("%w: ctx/0", ErrPeerGone)
	for _, c := range []struct {
		to   uint64
		h    *messages.Hello
		err  error
		want any
	}{
		{to: 0, err: gone, want: RxSent{}},
		{to: 3, err: gone, want: RxSent{}},
		{to: 3, h: &messages.Hello{Incarnation: 3}, want: nil},
		{to: 3, h: &messages.Hello{Incarnation: 9}, want: RxAddress{Writer: 1, Incarnation: 9}},
		{to: 0, h: &messages.Hello{Incarnation: 9}, want: RxAddress{Writer: 1, Incarnation: 9}},
		{to: 3, h: &messages.Hello{}, want: nil},
	} {
		e := SendRequestData{Writer: 1, To: ctxPeer(0), Frame: &messages.RequestData{Incarnations: messages.Incarnations{ToIncarnation: c.to}}}
		got := Addressing(e, c.h, c.err)
		switch want := c.want.(type) {
		case RxSent:
			if s, ok := got.(RxSent); !ok || s.Writer != 1 || !errors.Is(s.Err, ErrPeerGone) {
				t.Errorf("to %d, Hello %v err %v: %#v, want RxSent{Writer: 1} wrapping ErrPeerGone", c.to, c.h, c.err, got)
			}
		default:
			if got != want {
				t.Errorf("to %d, Hello %v err %v: %#v, want %#v", c.to, c.h, c.err, got, want)
			}
		}
	}
}

// TestRx_CancelResendBacksOff: a writer that never answers a Cancel (its
// context rank silenced the request: TxTable.Silence) used to be sent
// one every CancelResend for as long as the session lived. The re-sends
// keep CancelResend's period for the first cancelFastFor — a Cancel the
// writer holds for a tombstone slot (TxTable.Cancel's hold) is answered
// within a period of a slot aging, which takes at most CancelTombMinAge —
// and then back off, doubling up to cancelResendMax.
func TestRx_CancelResendBacksOff(t *testing.T) {
	h := newRxHarness(t, 1, 0)
	h.s.cfg.CancelResend = time.Second
	h.step(RxBegin{})
	h.step(RxSent{Writer: 0})
	first := h.now
	effs := h.step(RxCancel{})
	if got := cancelsTo(effs); !slices.Equal(got, []int{0}) {
		t.Fatalf("cancel: Cancels to %v, want [0]: %s", got, fmtEffects(effs))
	}
	var gaps []time.Duration
	cancels := 1
	for h.now.Sub(first) < time.Hour {
		ts := effectsOf[StartTimer](effs)
		if len(ts) != 1 || ts[0].Kind != TimerDrain {
			t.Fatalf("after %v: want one re-send timer: %s", h.now.Sub(first), fmtEffects(effs))
		}
		gaps = append(gaps, ts[0].At.Sub(h.now))
		h.now = ts[0].At
		effs = h.step(RxTimeout{Kind: TimerDrain})
		if got := cancelsTo(effs); !slices.Equal(got, []int{0}) {
			t.Fatalf("re-send after %v: Cancels to %v, want [0]: %s", h.now.Sub(first), got, fmtEffects(effs))
		}
		cancels++
	}
	at, prev := time.Duration(0), time.Duration(0)
	for i, g := range gaps {
		if at < 2*CancelTombMinAge && g != time.Second {
			t.Fatalf("re-send %d, %v after the first Cancel, comes %v later; want every %v while a tombstone hold may last",
				i, at, g, time.Second)
		}
		if g < prev || g > 30*time.Second {
			t.Fatalf("re-send %d, %v after the first Cancel: gap %v after %v: want non-decreasing, at most 30s", i, at, g, prev)
		}
		at, prev = at+g, g
	}
	if last := gaps[len(gaps)-1]; last != 30*time.Second {
		t.Fatalf("after an hour the re-sends come every %v (%d Cancels), want every 30s", last, cancels)
	}
	if cancels > 200 {
		t.Fatalf("%d Cancels in an hour to a writer that never answers, want at most 200", cancels)
	}
	h.cancelAck(0)
	h.wantState(RxCancelled)
	if !h.s.Stopped() {
		t.Fatal("the CancelAck after the back-off did not release the blocks")
	}
}

// TestRx_SuspectOfAnEarlierIncarnationLeavesAReaddressedWriter: a Down of
// a writer's incarnation (Engine.PeerIncarnationDown: its process exited,
// no proof) suspects only requests addressed to that incarnation or an
// earlier one. The rx parent's table may still name the earlier one when
// the session has already re-addressed the writer (a Misaddressed taken,
// or RxAddress here) and sent the RequestData to the writer's next
// incarnation (its Readdress on its way to the parent):
// the session must leave that writer alone, or the restarted writer's
// request fails for its predecessor's exit (the simulator's
// FaultIncarnationDown found it).
func TestRx_SuspectOfAnEarlierIncarnationLeavesAReaddressedWriter(t *testing.T) {
	const was, now = 3, 9
	for _, tc := range []struct {
		name     string
		down     uint64
		suspects bool
	}{
		{"the predecessor's Down", was, false},
		{"an earlier one's", was - 1, false},
		{"the addressed incarnation's", now, true},
		{"a later one's", now + 1, true},
		{"any incarnation (heartbeats)", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRxHarness(t, 1, 10*time.Second)
			rd := *h.s.cfg.Writers[0].Request
			rd.ToIncarnation = was
			h.s.cfg.Writers[0].Request, h.s.cfg.Writers[0].Incarnation = &rd, was
			h.step(RxBegin{})
			effs := h.step(RxAddress{Writer: 0, Incarnation: now})
			if sends := effectsOf[SendRequestData](effs); len(sends) != 1 || sends[0].Frame.ToIncarnation != now {
				t.Fatalf("not re-addressed: %s", fmtEffects(effs))
			}
			h.step(RxSent{Writer: 0})
			effs = h.step(RxSuspect{Writer: 0, Err: errors.New("exited (pidfd)"), Incarnation: tc.down})
			if !tc.suspects {
				if len(effs) != 0 {
					t.Fatalf("the Down of incarnation %d: %s, want nothing", tc.down, fmtEffects(effs))
				}
				h.wantState(RxReceiving)
				return
			}
			h.wantState(RxFailed)
			if !errors.Is(h.s.Err(), ErrPeerGone) || !h.s.Quarantined() {
				t.Fatalf("suspected: err %v, quarantined %v", h.s.Err(), h.s.Quarantined())
			}
		})
	}
}

// TestRx_HeardAgainIsWaitedForAtClose: a writer suspected of missed
// heartbeats that the control plane hears again as the engine closes, in
// the incarnation it was addressed to (RxHeard), may still answer: it is
// sent the Cancel again at once, RxAbandon waits for it, and its
// CancelAck releases the blocks from quarantine. Heard in another
// incarnation, or an unknown one, or suspected on its incarnation's Down
// (an exit), the session stops at RxAbandon, its blocks quarantined, as
// before. Nothing is released before the proof. (Checked to fail with
// RxHeard ignored: the session stopped at RxAbandon with the writer's
// answer on its way.)
func TestRx_HeardAgainIsWaitedForAtClose(t *testing.T) {
	const inc = 5
	for _, tc := range []struct {
		name    string
		downInc uint64 // the RxSuspect's incarnation (0: missed heartbeats)
		heard   uint64 // the RxHeard's
		waits   bool
	}{
		{"heartbeats, heard in its incarnation", 0, inc, true},
		{"heartbeats, heard in a later one", 0, inc + 1, false},
		{"heartbeats, incarnation unknown", 0, 0, false},
		{"its incarnation's exit, heard", inc, inc, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRxHarness(t, 1, time.Minute)
			h.s.cfg.Writers[0].Incarnation = inc
			h.step(RxBegin{})
			h.step(RxSent{Writer: 0})
			h.step(RxSuspect{Writer: 0, Err: errors.New("missed its heartbeats"), Incarnation: tc.downInc})
			h.wantState(RxFailed)
			if !h.s.Quarantined() {
				t.Fatal("suspected, not quarantined")
			}
			effs := h.step(RxHeard{Writer: 0, Incarnation: tc.heard})
			if got := cancelsTo(effs); tc.waits && !slices.Equal(got, []int{0}) || !tc.waits && len(got) != 0 {
				t.Fatalf("RxHeard: Cancels to %v (%s), want one to the writer: %v", got, fmtEffects(effs), tc.waits)
			}
			h.step(RxCancel{Reason: ErrClosed})
			h.step(RxAbandon{})
			if !tc.waits {
				if !h.stopped || h.releases != 0 {
					t.Fatalf("stopped %v, released %d: want stopped, blocks quarantined", h.stopped, h.releases)
				}
				return
			}
			if h.stopped || h.releases != 0 {
				t.Fatalf("stopped %v, released %d at RxAbandon: want it waiting for the writer heard again", h.stopped, h.releases)
			}
			effs = h.cancelAck(0)
			rel := effectsOf[ReleaseDest](effs)
			if !h.stopped || len(rel) != 1 || !rel[0].Quarantined {
				t.Fatalf("CancelAck: %s, want the quarantined blocks released and the session stopped", fmtEffects(effs))
			}
		})
	}
}
