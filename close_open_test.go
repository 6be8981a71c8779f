package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestOpenWhileClosingNamesRequest: a Send or Receive that reaches the
// engine while Close drains (a chunk's fence holds a session) is refused
// with ErrClosed naming the request, as one after Close is.
func TestOpenWhileClosingNamesRequest(t *testing.T) {
	l := smallLayout()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "closing", Layout: &l, PoolBytes: 1 << 20, Workers: 1,
		Link: control.NewMemLink(), TransferTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	src, err := e.Pools().Alloc([]int{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.Send(context.Background(), kvxfer.SendRequest{ID: "held", PromptLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	fence := &kvxfer.ManualFence{}
	c := kvcache.Chunk{Start: 0, End: 16, Last: true}
	if err := tx.Chunk(c, c.Runs(l.TokensPerBlock, src), fence); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close(context.Background()) }()
	// Close drains until the fence fires: every open from now on is
	// refused, by the supervisors once they took Close's request.
	check := func(what string, open func(id string) error) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			id := fmt.Sprintf("%s-%d", what, i)
			err := open(id)
			if err != nil {
				if !errors.Is(err, kvxfer.ErrClosed) || !strings.Contains(err.Error(), id) {
					t.Fatalf("%s %s while closing: %v, want ErrClosed naming the request", what, id, err)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still taken 10s into Close", what)
			}
			time.Sleep(time.Millisecond) // poll with a deadline
		}
	}
	check("send", func(id string) error {
		_, err := e.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: 16})
		return err
	})
	check("receive", func(id string) error {
		_, err := e.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 16, Context: "nobody"})
		return err
	})
	fence.Fire(nil)
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	if o := waitOutcome(t, tx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("held request: %v %v, want CANCELLED by Close", o.Status, o.Err)
	}
}
