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
// before); a FAILED Result of that text alone (no kind, as an older
// context rank sends it: TestPromptMismatchKindOnTheWire) makes the
// generation side's error match ErrPromptMismatch (and ErrPeerFailed, not
// ErrMismatch). Callers (the kvxfer command's
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

// TestPromptMismatchKindOnTheWire: the FAILED Result that tells a
// generation rank of a prompt mismatch names ErrorKindPromptMismatch —
// whether the mismatch shows at Send (the stream's Result) or at a
// RequestData after it (the refusal) — and the generation side matches
// ErrPromptMismatch on that kind, whatever the text says. A Result of no
// kind (a context rank that predates it: mixed versions) still matches on
// the old words; one with neither, or with a kind this build does not
// define, does not. (Checked to fail with the kind left unset on the
// context side, and with RxSession matching the words alone.)
func TestPromptMismatchKindOnTheWire(t *testing.T) {
	// At Send: the stream opened for 32 tokens is answered FAILED.
	h, _ := newTxHarness(t, txOpts{})
	h.step(TxPeerRequest{Peer: 1, From: genPeer(1), Epoch: 1, PromptLen: 32, Route: h.route(1), Expected: []int{1, 2}})
	effs := h.step(TxStart{PromptLen: 48})
	h.wantState(TxFailed)
	if r := wantResult(t, effs, 1, messages.StatusFailed); r.ErrorKind != messages.ErrorKindPromptMismatch {
		t.Fatalf("stream's FAILED Result at Send: error kind %v, want PROMPT_MISMATCH (%q)", r.ErrorKind, r.Error)
	}
	// A RequestData after Send, for another length: refused with the kind.
	h2, _ := newTxHarness(t, txOpts{})
	h2.step(TxStart{PromptLen: 48})
	effs = h2.step(TxPeerRequest{Peer: 2, From: genPeer(2), Epoch: 1, PromptLen: 16, Route: h2.route(2), Expected: []int{2}})
	h2.wantState(TxFailed)
	if r := wantResult(t, effs, 2, messages.StatusFailed); r.ErrorKind != messages.ErrorKindPromptMismatch {
		t.Fatalf("refused RequestData after Send: error kind %v, want PROMPT_MISMATCH (%q)", r.ErrorKind, r.Error)
	}
	// Any other failure names no kind.
	h3, _ := newTxHarness(t, txOpts{})
	h3.step(TxStart{PromptLen: 48})
	effs = h3.step(TxPeerRequest{Peer: 1, From: genPeer(1), Epoch: 1, PromptLen: 48, Route: h3.route(1), Expected: []int{2}})
	if r := wantResult(t, effs, 1, messages.StatusFailed); r.ErrorKind != messages.ErrorKindUnspecified {
		t.Fatalf("refused RequestData of a rank not a peer: error kind %v, want UNSPECIFIED (%q)", r.ErrorKind, r.Error)
	}

	for _, tc := range []struct {
		name string
		kind messages.ErrorKind
		text string
		want bool
	}{
		{"kind, reworded text", messages.ErrorKindPromptMismatch, "the prompt lengths differ: 32 and 48 tokens", true},
		{"kind, no text", messages.ErrorKindPromptMismatch, "", true},
		{"no kind, the old words (an older context rank)", messages.ErrorKindUnspecified,
			"actors: mismatch: request r1: generation rank gen/1 planned a prompt of 32 tokens, Send has 48 tokens", true},
		{"neither", messages.ErrorKindUnspecified, "the prompt lengths differ: 32 and 48 tokens", false},
		{"a newer rank's kind, the old words", messages.ErrorKind(7), "planned a prompt of 32 tokens", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rx := newRxHarness(t, 1, 0)
			rx.step(RxBegin{})
			res := &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(0), Status: messages.StatusFailed, Error: tc.text, ErrorKind: tc.kind}
			if err := res.Validate(); err != nil {
				t.Fatalf("the Result is no valid frame: %v", err)
			}
			rx.step(RxFrame{Writer: 0, Frame: res})
			rx.wantState(RxFailed)
			got := rx.s.Err()
			if errors.Is(got, ErrPromptMismatch) != tc.want || !errors.Is(got, ErrPeerFailed) || !strings.Contains(got.Error(), tc.text) {
				t.Fatalf("generation side, FAILED %v %q: %v, want ErrPromptMismatch %v and ErrPeerFailed", tc.kind, tc.text, got, tc.want)
			}
		})
	}
}
