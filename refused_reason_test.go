package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestRefusedRequestDataNamedOnContextSide: a generation engine whose
// blocks hold another number of tokens than the context engine's asks for
// a request; the context rank refuses its RequestData (layout mismatch)
// and the generation side fails with that reason. The context side must
// learn it too, in either order of Send and RequestData: a Send not bound
// to an instance (a correct peer may still claim it) ends at its deadline
// with an error naming the refused RequestData and the mismatch; a Send
// bound to the refused instance is refused at once with ErrMismatch. The
// context log names the refusal once. (Checked to fail without the fix:
// with the RequestData first, the unbound Send's deadline error said only
// "transfer deadline passed: request r", and the bound Send was taken and
// waited for its deadline.)
func TestRefusedRequestDataNamedOnContextSide(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sendFirst bool
		bound     string
	}{
		{"send-first", true, ""},
		{"requestdata-first", false, ""},
		{"send-first-bound", true, "gen"},
		{"requestdata-first-bound", false, "gen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := smallLayout()
			gl := l
			gl.TokensPerBlock = 32
			link := control.NewMemLink()
			logs := &lockedBuffer{}
			lg := zerolog.New(logs)
			ce, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 1 << 20,
				Workers: 1, Link: link, TransferTimeout: time.Minute, Logger: &lg})
			if err != nil {
				t.Fatal(err)
			}
			ge, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &gl, PoolBytes: 1 << 20,
				Workers: 1, Link: link, TransferTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := ce.Close(ctx); err != nil {
					t.Errorf("close ctx: %v", err)
				}
				if err := ge.Close(ctx); err != nil {
					t.Errorf("close gen: %v", err)
				}
			}()
			send := func() (*kvxfer.TxHandle, error) {
				// A short deadline: an unbound Send waits it out (a correct
				// peer could still ask).
				return ce.Send(context.Background(), kvxfer.SendRequest{ID: "r", PromptLen: 64, Timeout: 500 * time.Millisecond, Generation: tc.bound})
			}
			var tx *kvxfer.TxHandle
			if tc.sendFirst {
				if tx, err = send(); err != nil {
					t.Fatalf("send: %v", err)
				}
			}
			rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx"})
			if err != nil {
				t.Fatal(err)
			}
			if o := waitOutcome(t, rx.Done()); o.OK || o.Err == nil || !strings.Contains(o.Err.Error(), "--tokens-per-block") {
				t.Fatalf("generation side: %s %v, want a failure naming the tokens per block", o.Status, o.Err)
			}
			named := func(err error) bool {
				return err != nil && strings.Contains(err.Error(), "gen/0") && strings.Contains(err.Error(), "refused") &&
					strings.Contains(err.Error(), "the peer's blocks hold 32 tokens, this rank's 16")
			}
			if !tc.sendFirst {
				tx, err = send()
				if tc.bound != "" {
					if tx != nil || !errors.Is(err, kvxfer.ErrMismatch) || !named(err) {
						t.Fatalf("Send bound to the refused instance: %v, want ErrMismatch naming gen/0's refused RequestData and the tokens per block", err)
					}
					if n := logs.lines("RequestData refused"); n != 1 {
						t.Fatalf("context log: %d lines \"RequestData refused\", want 1:\n%s", n, logs.b.String())
					}
					return
				}
				if err != nil {
					t.Fatalf("send: %v", err)
				}
			}
			o := waitOutcome(t, tx.Done())
			switch {
			case tc.bound != "": // the session is the refused instance's: it fails at once, with the reason
				if o.OK || !errors.Is(o.Err, kvxfer.ErrMismatch) || !strings.Contains(o.Err.Error(), "the peer's blocks hold 32 tokens, this rank's 16") {
					t.Fatalf("context side: %s %v, want ErrMismatch naming the tokens per block", o.Status, o.Err)
				}
			default:
				if o.OK || !errors.Is(o.Err, kvxfer.ErrTimeout) || !named(o.Err) {
					t.Fatalf("context side: %s %v, want ErrTimeout naming gen/0's refused RequestData and the tokens per block", o.Status, o.Err)
				}
				if n := logs.lines("RequestData refused"); n != 1 {
					t.Fatalf("context log: %d lines \"RequestData refused\", want 1:\n%s", n, logs.b.String())
				}
			}
		})
	}
}

// TestRefusedRequestDataDisturbsNoOtherInstance: a RequestData refused for
// its layout before Send (instance "bad") is remembered for the deadline's
// error only: an unbound Send after it is still served by a correct
// instance, and a Send bound to another instance is taken.
func TestRefusedRequestDataDisturbsNoOtherInstance(t *testing.T) {
	l := smallLayout()
	tp1 := kvcache.Parallel{TP: 1, PP: 1}
	c := startCluster(t, l, tp1, tp1, 1)
	bl := l
	bl.TokensPerBlock = 32
	bad, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "bad", Layout: &bl, PoolBytes: 1 << 20,
		Workers: 1, Link: c.link, TransferTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := bad.Close(ctx); err != nil {
			t.Errorf("close bad: %v", err)
		}
	}()
	for _, id := range []string{"r", "r2"} {
		rx, err := bad.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		if o := waitOutcome(t, rx.Done()); o.OK || !strings.Contains(fmt.Sprint(o.Err), "--tokens-per-block") {
			t.Fatalf("bad's %s: %s %v, want a failure naming the tokens per block", id, o.Status, o.Err)
		}
	}
	transfer(t, c, l, "r", 1, 64, 32, false) // Send, then gen's RequestData
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "r2", PromptLen: 64, Generation: "gen"})
	if err != nil {
		t.Fatalf("Send bound to gen after bad's refused RequestData: %v", err)
	}
	tx.Cancel()
	if o := waitOutcome(t, tx.Done()); o.OK {
		t.Fatalf("cancelled r2: %s", o.Status)
	}
	checkNoLeaks(t, c)
}
