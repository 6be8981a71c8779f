package core

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// TestRx_FrameRefusedFailsAtOnce: a RequestData the control plane refuses
// for the frame itself (control.ErrFrameRefused: larger than the frame
// limit the writer's Hello said) is refused again however often it is
// re-sent, so the request fails at once, naming the request, the writer
// and the refusal, instead of re-sending until its deadline and failing
// as a timeout. The writer that never got the frame is quiescent; the
// other, which did, gets a Cancel, and the blocks are released only after
// its CancelAck. The refused writer is told too (a Cancel whose reason
// names the refusal), so that its Send ends now rather than at its
// deadline. A refusal about the connection (queue full) is still
// re-sent.
func TestRx_FrameRefusedFailsAtOnce(t *testing.T) {
	h := newRxHarness(t, 2, 10*time.Second)
	h.step(RxBegin{})
	h.step(RxSent{Writer: 0})
	if effs := h.step(RxSent{Writer: 1, Err: fmt.Errorf("%w: not connected", control.ErrQueueFull)}); !hasEffect[StartTimer](effs) {
		t.Fatalf("a queue-full refusal: %s, want a re-send timer", fmtEffects(effs))
	}
	h.wantState(RxReceiving)
	h.now = h.now.Add(time.Second)
	effs := h.step(RxTimeout{Kind: TimerResend})
	if len(effectsOf[SendRequestData](effs)) != 1 {
		t.Fatalf("re-send: %s, want writer 1's RequestData", fmtEffects(effs))
	}
	refused := fmt.Errorf("%w: 2035 bytes exceeds the peer's MaxFrameBytes 1024", control.ErrFrameRefused)
	effs = h.step(RxSent{Writer: 1, Err: refused})
	h.wantState(RxFailed)
	err := h.s.Err()
	if !errors.Is(err, ErrFrameUnsent) || !errors.Is(err, control.ErrFrameRefused) ||
		!strings.Contains(err.Error(), "request r1: RequestData for writer ctx/1 refused: ") ||
		!strings.Contains(err.Error(), "2035 bytes exceeds the peer's MaxFrameBytes 1024") {
		t.Fatalf("err %v, want ErrFrameUnsent naming the request, the writer and the refusal", err)
	}
	if got := cancelsTo(effs); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("refused: Cancels to %v, want [0 1]: %s", got, fmtEffects(effs))
	}
	for _, f := range effectsOf[SendFrame](effs) {
		if c := f.Frame.(*messages.Cancel); f.To == ctxPeer(1) && !strings.Contains(c.Reason, "exceeds the peer's MaxFrameBytes 1024") {
			t.Fatalf("writer 1's Cancel says %q, want the refusal", c.Reason)
		}
	}
	if hasEffect[ReleaseDest](effs) || h.releases != 0 {
		t.Fatalf("blocks released while writer 0 may still write: %s", fmtEffects(effs))
	}
	// Writer 1 never got the request: it owes no proof, and its
	// answer to the Cancel frees nothing while writer 0 may write.
	if effs := h.cancelAck(1); hasEffect[ReleaseDest](effs) {
		t.Fatalf("writer 1's CancelAck: %s, want no release while writer 0 may write", fmtEffects(effs))
	}
	if effs := h.cancelAck(0); !hasEffect[ReleaseDest](effs) {
		t.Fatalf("writer 0's CancelAck: %s, want ReleaseDest", fmtEffects(effs))
	}
}

// TestTx_PeerCancelBeforeRequestNamesItsReason: a Cancel that reaches a
// context rank before the RequestData it cancels (the generation side
// could not send that RequestData: larger than this rank's frame limit)
// fails the session at once, naming the Cancel's reason.
func TestTx_PeerCancelBeforeRequestNamesItsReason(t *testing.T) {
	h, _ := newTxHarness(t, txOpts{})
	h.start(32, time.Minute)
	const why = `actors: control frame not sent: request r1: RequestData for writer ctx/0 refused: 2035 bytes exceeds the peer's MaxFrameBytes 1024`
	h.step(TxPeerCancel{Peer: 1, From: genPeer(1), Epoch: 1, Reason: why})
	h.wantState(TxCancelled)
	if err := h.s.Err(); !errors.Is(err, ErrPeerCancelled) || !strings.Contains(err.Error(), fmt.Sprintf("before its RequestData arrived (its reason: %q)", why)) {
		t.Fatalf("err %v, want ErrPeerCancelled naming the Cancel's reason", err)
	}
}
