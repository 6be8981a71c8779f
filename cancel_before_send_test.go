package kvxfer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// rdSeenLink closes seen once the context rank's listener has been handed
// its first RequestData.
type rdSeenLink struct {
	*control.MemLink
	seen chan struct{}
	once sync.Once
}

func (l *rdSeenLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	if self.From.Instance != "ctx" {
		return l.MemLink.Listen(self, deliver)
	}
	return l.MemLink.Listen(self, func(f messages.Frame) {
		deliver(f)
		if _, ok := f.(*messages.RequestData); ok {
			l.once.Do(func() { close(l.seen) })
		}
	})
}

// TestCancelBeforeSendIsPeerCancelled: the generation side first
// (DESIGN.md §2): the Receive's RequestData reaches the context rank
// before Send and opens a session there, then the generation instance
// cancels. A later Send is refused with ErrPeerCancelled, as Engine.Send
// says, so that prefill stops; before, the session's plain tombstone made
// it ErrBadRequest "already sent", which the caller never did.
func TestCancelBeforeSendIsPeerCancelled(t *testing.T) {
	l := smallLayout()
	delivered := make(chan struct{})
	c := startClusterOn(t, l, tp1, tp1, 2, clusterOpts{link: func(inst string, ml *control.MemLink) control.Link {
		return &rdSeenLink{MemLink: ml, seen: delivered}
	}})
	ctxE, genE := c.ctx[0], c.gen[0]
	rx, err := genE.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-delivered:
	case <-time.After(10 * time.Second):
		t.Fatal("the RequestData never reached the context rank")
	}
	rx.Cancel()
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("rx: %v %v, want CANCELLED", o.Status, o.Err)
	}
	select {
	case <-rx.Released(): // the context rank acknowledged the cancel
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled Receive was never released")
	}
	// The context rank's session acknowledged; it may still be stopping,
	// and a Send then adopts it, failed by the same cancel.
	tx, err := ctxE.Send(context.Background(), kvxfer.SendRequest{ID: "r", PromptLen: 64})
	if err == nil {
		err = waitOutcome(t, tx.Done()).Err
	}
	if !errors.Is(err, kvxfer.ErrPeerCancelled) {
		t.Fatalf("Send after the generation instance cancelled: %v (ErrBadRequest %v), want ErrPeerCancelled",
			err, errors.Is(err, kvxfer.ErrBadRequest))
	}
}

// TestCancelOfQueuedReceiveReachesContext: a Receive cancelled while it
// waits for destination blocks (the generation pool is full) tells the
// context side, as a started one's Cancel does: a live Send ends at once
// with ErrPeerCancelled, and a Send after the cancel is refused with it.
// Before, the queued request ended only on the generation side: the Send
// held its session and its pins until the transfer deadline (20 s here),
// then failed as timed out, and a later Send was accepted.
func TestCancelOfQueuedReceiveReachesContext(t *testing.T) {
	l := smallLayout()
	for _, sendFirst := range []bool{true, false} {
		name := map[bool]string{true: "send-then-cancel", false: "cancel-then-send"}[sendFirst]
		t.Run(name, func(t *testing.T) {
			c := startCluster(t, l, tp1, tp1, 2) // TransferTimeout 20 s
			ctxE, genE := c.ctx[0], c.gen[0]
			held := holdFreeBlocks(t, genE) // the Receive must queue for blocks
			defer func() { _ = genE.FreeBlocks(held) }()
			var tx *kvxfer.TxHandle
			var err error
			if sendFirst {
				if tx, err = ctxE.Send(context.Background(), kvxfer.SendRequest{ID: "r", PromptLen: 64}); err != nil {
					t.Fatal(err)
				}
			}
			rx, err := genE.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the receive queued for blocks", func() bool { return genE.Stats().WaitingForBlocks == 1 })
			rx.Cancel()
			if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled {
				t.Fatalf("rx: %v %v, want CANCELLED", o.Status, o.Err)
			}
			if !sendFirst {
				// The Cancel may still be on its way: a Send before it
				// arrives is accepted, then cancelled by it.
				tx, err = ctxE.Send(context.Background(), kvxfer.SendRequest{ID: "r", PromptLen: 64})
				if errors.Is(err, kvxfer.ErrPeerCancelled) {
					return
				}
				if err != nil {
					t.Fatalf("Send after the generation instance cancelled: %v, want ErrPeerCancelled", err)
				}
			}
			// Well before the 20 s transfer deadline (waitOutcome waits up
			// to 30 s: the deadline would end it as FAILED, timed out).
			if o := waitOutcome(t, tx.Done()); !errors.Is(o.Err, kvxfer.ErrPeerCancelled) {
				t.Fatalf("tx: %v %v, want ErrPeerCancelled", o.Status, o.Err)
			}
		})
	}
}
