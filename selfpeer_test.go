package kvxfer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestOwnInstanceAsPeerRefused: a Receive whose Context is the engine's
// own instance (or a Send whose Generation is) was taken, and waited out
// its whole timeout holding its blocks: no engine sends to or receives
// from its own instance. Both are now refused at once with ErrBadRequest
// naming the request and the peer and saying it is this engine itself;
// nothing is held, and transfers between the two instances still run.
// Checked to fail without the fix (both calls returned a handle).
func TestOwnInstanceAsPeerRefused(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "self-rx", PromptLen: 16, Context: "gen"})
	if rx != nil {
		rx.Cancel()
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !containsAll(err.Error(), []string{"self-rx", `Context "gen"`, "this engine itself"}) {
		t.Fatalf("receive from its own instance: %v, want ErrBadRequest naming the request, Context gen and the engine itself", err)
	}
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "self-tx", PromptLen: 16, Generation: "ctx"})
	if tx != nil {
		tx.Cancel()
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !containsAll(err.Error(), []string{"self-tx", `Generation "ctx"`, "this engine itself"}) {
		t.Fatalf("send to its own instance: %v, want ErrBadRequest naming the request, Generation ctx and the engine itself", err)
	}
	if st := c.gen[0].Pools().Stats(); st[0].Receiving != 0 || st[0].Used != 0 {
		t.Fatalf("a refused receive holds blocks: %+v", st[0])
	}
	transfer(t, c, l, "self-rx", 1, 16, 16, true)
	checkNoLeaks(t, c)
}

// TestRequestIDNotUTF8Refused: a request id that is not valid UTF-8 is
// refused at Send and Receive with ErrBadRequest naming it. Before, the
// engine took it, and between nodes every frame naming the request failed
// to encode (proto3 strings are UTF-8): both sides waited for the
// transfer deadline, holding pins and blocks. (The C ABI had its own
// check; this is the Go API's.)
func TestRequestIDNotUTF8Refused(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	const id = "req-\xff"
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 16, Context: "ctx"})
	if rx != nil {
		rx.Cancel()
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !containsAll(err.Error(), []string{`"req-\xff"`, "not valid UTF-8"}) {
		t.Fatalf("receive with id %q: %v, want ErrBadRequest naming it", id, err)
	}
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 16, Generation: "gen"})
	if tx != nil {
		tx.Cancel()
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !containsAll(err.Error(), []string{`"req-\xff"`, "not valid UTF-8"}) {
		t.Fatalf("send with id %q: %v, want ErrBadRequest naming it", id, err)
	}
	if st := c.gen[0].Pools().Stats(); st[0].Receiving != 0 || st[0].Used != 0 {
		t.Fatalf("a refused receive holds blocks: %+v", st[0])
	}
	checkNoLeaks(t, c)
}
