package core

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// TestPromptMismatchIsASentinel: a request whose generation rank planned
// another prompt length than Send's fails on the context side with an
// error that matches ErrPromptMismatch (and ErrMismatch, its text as
// before); the FAILED Result that tells the generation rank carries only
// that text, and the generation side's error matches ErrPromptMismatch
// (and ErrPeerFailed, not ErrMismatch). Callers (the kvxfer command's
// roles) test with errors.Is instead of searching the text for words of
// it. Another FAILED Result matches no ErrPromptMismatch. (Checked to
// fail without the tag in promptMismatch and in RxSession's Result.)
func TestPromptMismatchIsASentinel(t *testing.T) {
	h, _ := newTxHarness(t, txOpts{})
	h.step(TxPeerRequest{Peer: 1, From: genPeer(1), Epoch: 1, PromptLen: 32, Route: h.route(1), Expected: []int{1}})
	h.step(TxStart{PromptLen: 48})
	h.wantState(TxFailed)
	err := h.s.Err()
	const words = "planned a prompt of 32 tokens, Send has 48 tokens"
	if !errors.Is(err, ErrPromptMismatch) || !errors.Is(err, ErrMismatch) ||
		!strings.HasPrefix(err.Error(), ErrMismatch.Error()+": request ") || !strings.Contains(err.Error(), words) ||
		strings.Contains(err.Error(), ErrPromptMismatch.Error()) {
		t.Fatalf("context side: %v, want ErrPromptMismatch and ErrMismatch, its text %q", err, words)
	}

	for _, tc := range []struct {
		text string
		want bool
	}{
		{messages.TruncateText(err.Error(), messages.MaxErrorLen), true},
		{"boom", false},
	} {
		rx := newRxHarness(t, 1, 0)
		rx.step(RxBegin{})
		rx.step(RxFrame{Writer: 0, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(0), Status: messages.StatusFailed, Error: tc.text}})
		rx.wantState(RxFailed)
		got := rx.s.Err()
		if errors.Is(got, ErrPromptMismatch) != tc.want || !errors.Is(got, ErrPeerFailed) || errors.Is(got, ErrMismatch) ||
			!strings.Contains(got.Error(), tc.text) {
			t.Fatalf("generation side, FAILED %q: %v, want ErrPromptMismatch %v, ErrPeerFailed, no ErrMismatch", tc.text, got, tc.want)
		}
	}
}
