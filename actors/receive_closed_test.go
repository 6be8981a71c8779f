package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestReceiveAfterCloseRefused: a Receive (or Send) on a closed engine is
// refused with ErrClosed at once instead of waiting forever on a stopped
// supervisor, and the caller's blocks are not lent: they free at once.
// Before the fix, Receive lent the blocks and hung on its reply.
func TestReceiveAfterCloseRefused(t *testing.T) {
	r := startTestRank(t, "gen-closed", control.NewMemLink())
	blocks, err := r.e.Pools().Alloc([]int{2})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	rxErr := make(chan error, 1)
	go func() {
		_, err := r.e.Receive(RxRequest{ID: "after-close", PromptLen: 32, Context: "ctx",
			ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Blocks: blocks, Deadline: time.Now().Add(time.Minute)})
		rxErr <- err
	}()
	if err := wait(t, "Receive's answer", rxErr); !errors.Is(err, ErrClosed) {
		t.Fatalf("Receive after Close: %v, want ErrClosed", err)
	}
	if err := r.e.FreeBlocks(blocks); err != nil {
		t.Fatalf("caller's blocks after the refused Receive: %v", err)
	}
	txErr := make(chan error, 1)
	go func() {
		_, err := r.e.Send(TxRequest{ID: "after-close", PromptLen: 32, Deadline: time.Now().Add(time.Minute)})
		txErr <- err
	}()
	if err := wait(t, "Send's answer", txErr); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Close: %v, want ErrClosed", err)
	}
}

// TestReceiveRacingClose: a Receive racing Close answers (opened, and
// then cancelled by the close, or refused) and never strands the caller's
// blocks.
func TestReceiveRacingClose(t *testing.T) {
	for i := range 8 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			r := startTestRank(t, "gen-race", control.NewMemLink())
			blocks, err := r.e.Pools().Alloc([]int{2})
			if err != nil {
				t.Fatal(err)
			}
			closed := make(chan error, 1)
			go func() { closed <- r.e.Close(context.Background()) }()
			type answer struct {
				h   *RxHandle
				err error
			}
			rx := make(chan answer, 1)
			go func() {
				h, err := r.e.Receive(RxRequest{ID: "racing", PromptLen: 32, Context: "ctx",
					ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Blocks: blocks, Deadline: time.Now().Add(time.Minute)})
				rx <- answer{h, err}
			}()
			a := wait(t, "Receive's answer", rx)
			if a.err != nil && !errors.Is(a.err, ErrClosed) {
				t.Fatalf("Receive racing Close: %v, want nil or ErrClosed", a.err)
			}
			if err := wait(t, "Close", closed); err != nil {
				t.Fatal(err)
			}
			if a.h != nil {
				wait(t, "the cancelled receive's Done", a.h.Done())
				wait(t, "the cancelled receive's Released", a.h.Released())
			}
			if err := r.e.FreeBlocks(blocks); err != nil {
				t.Fatalf("caller's blocks after Close: %v", err)
			}
		})
	}
}
