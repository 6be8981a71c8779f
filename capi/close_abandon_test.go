package capi

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/messages"
)

// closeWithin runs e.Close(timeout) and returns its error, failing the
// test if it has not returned by the deadline (a hang).
func closeWithin(t *testing.T, e *Engine, timeout time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- e.Close(timeout) }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout + 30*time.Second):
		t.Fatalf("kvxfer_engine_close(%v) has not returned %v after it", timeout, 30*time.Second)
		return nil
	}
}

// TestCloseWithAbandonedReceives: kvxfer_engine_close returns whatever the
// receives it abandons (it hung: its request watchers waited for a
// Released that an abandoned session never gives). A receive with no
// destination block (every block a prefix hit) whose writer never
// answered: OK. A receive whose writer was suspected and never proved its
// writes over: KVXFER_ERR_TIMEOUT naming the request, its blocks
// quarantined — the caller's memory must stay allocated, as the header
// says of a timeout.
func TestCloseWithAbandonedReceives(t *testing.T) {
	t.Run("no destination blocks", func(t *testing.T) {
		_, d := openClosed(t, "abandon-hits-p"), open(t, "abandon-hits-d")
		if _, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32,
			Context: "abandon-hits-p", PrefixHitBlocks: []int{2}}}); err != nil {
			t.Fatal(err)
		}
		if err := closeWithin(t, d, 5*time.Second); err != nil {
			t.Fatalf("close: %v, want OK (nothing of the request's can be written)", err)
		}
	})
	t.Run("suspected writer", func(t *testing.T) {
		// The writer's answers are held back: it cannot prove anything.
		_, d, link := heldPair(t, "abandon-susp-p", "abandon-susp-d")
		if _, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32,
			Context: "abandon-susp-p"}}); err != nil {
			t.Fatal(err)
		}
		link.waitRequestData(t, 1)
		link.held.Store(true)
		d.Inner().PeerDownBecause(messages.PeerID{Instance: "abandon-susp-p"}, "missed its heartbeats")
		err := closeWithin(t, d, 5*time.Second)
		var ce *Error
		if !errors.As(err, &ce) || ce.Code != ErrTimeout || !strings.Contains(err.Error(), "[r]") || !strings.Contains(err.Error(), "quarantined") {
			t.Fatalf("close: %v, want KVXFER_ERR_TIMEOUT naming request r, its blocks quarantined", err)
		}
	})
}
