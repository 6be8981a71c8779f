package kvxfer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestSendOnlyContext: context engines started with SendOnly send as any
// other (every byte verified), yet their Hello names no region key (the
// loopback agent registers a send-only pool as a source only,
// rdma.RegisterSource), while a receiving engine's does; Receive on a
// send-only engine is refused with ErrSendOnly naming the request, and
// holds nothing.
func TestSendOnlyContext(t *testing.T) {
	l := smallLayout()
	c := startClusterOn(t, l, kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 2, clusterOpts{ctxSendOnly: true})
	for i, e := range c.ctx {
		if k := e.Hello().Region.Key; len(k) != 0 {
			t.Fatalf("send-only ctx rank %d's Hello names a %d-byte region key, want none", i, len(k))
		}
	}
	if len(c.gen[0].Hello().Region.Key) == 0 {
		t.Fatal("the receiving gen engine's Hello names no region key")
	}
	for i, promptLen := range []int{100, 16} {
		transfer(t, c, l, "send-only-r"+string(rune('0'+i)), i+1, promptLen, 32, i%2 == 0)
	}
	_, err := c.ctx[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "backwards", PromptLen: 16, Context: "gen"})
	if !errors.Is(err, kvxfer.ErrSendOnly) || !contains(err.Error(), "backwards") {
		t.Fatalf("Receive on a send-only engine: %v, want ErrSendOnly naming the request", err)
	}
	checkNoLeaks(t, c)
}
