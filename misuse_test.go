package kvxfer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestCancelledContextNamesRequest: Send and Receive with a context
// already cancelled are refused wrapping its error and naming the
// request, and open nothing: the id is free for a live call after.
func TestCancelledContextNamesRequest(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.ctx[0].Send(done, kvxfer.SendRequest{ID: "gone-tx", PromptLen: 16})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "gone-tx") {
		t.Fatalf("send with a cancelled context: %v, want context.Canceled naming gone-tx", err)
	}
	_, err = c.gen[0].Receive(done, kvxfer.ReceiveRequest{ID: "gone-rx", PromptLen: 16, Context: "ctx"})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "gone-rx") {
		t.Fatalf("receive with a cancelled context: %v, want context.Canceled naming gone-rx", err)
	}
	transfer(t, c, l, "gone-tx", 1, 16, 16, true)
	transfer(t, c, l, "gone-rx", 2, 16, 16, false)
	checkNoLeaks(t, c)
}
