package kvxfer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
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

// TestImpossibleInstanceNamesRefused: a Receive whose Context, or a Send
// whose Generation, names an instance no engine can have (Start refuses
// the name: too long, not valid UTF-8, a control character) is refused at
// once, naming the field, instead of waiting out its timeout holding
// blocks; the ids stay free. Start's own refusal quotes a long name cut
// short, and refuses a name no frame can carry with ErrConfig. (Checked to
// fail without the UTF-8 check, found in a review: "ctx\xff" was taken,
// held 7 blocks until its deadline, and Start over zmq failed without
// ErrConfig.)
func TestImpossibleInstanceNamesRefused(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	long := strings.Repeat("x", messages.MaxInstanceLen+1)
	for _, name := range []string{long, "ctx\n", "c\x00tx", "ctx\xff"} {
		_, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "named-rx", PromptLen: 16, Context: name})
		if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "named-rx: Context ") {
			t.Fatalf("receive from instance %.20q: %v, want ErrBadRequest naming the request and Context", name, err)
		}
		_, err = c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "named-tx", PromptLen: 16, Generation: name})
		if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "named-tx: Generation ") {
			t.Fatalf("send to instance %.20q: %v, want ErrBadRequest naming the request and Generation", name, err)
		}
	}
	if st := c.gen[0].Pools().Stats(); st[0].Receiving != 0 || st[0].Used != 0 {
		t.Fatalf("refused receives hold blocks: %+v", st[0])
	}
	transfer(t, c, l, "named-rx", 1, 16, 16, true)
	transfer(t, c, l, "named-tx", 2, 16, 16, false)
	checkNoLeaks(t, c)

	huge := strings.Repeat("y", 1<<20)
	_, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: huge, Layout: &l, PoolBytes: 1 << 20})
	if !errors.Is(err, kvxfer.ErrConfig) || !strings.Contains(err.Error(), "is 1048576 bytes, at most 128") || len(err.Error()) > 1024 {
		t.Fatalf("start as a 1 MiB instance name: %d-byte error %.200q, want ErrConfig naming its length, cut short", len(err.Error()), err)
	}
	_, err = kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx\xff", Layout: &l, PoolBytes: 1 << 20})
	if !errors.Is(err, kvxfer.ErrConfig) || !strings.Contains(err.Error(), `"ctx\xff" is not valid UTF-8`) {
		t.Fatalf("start as an instance name that is not UTF-8: %v, want ErrConfig naming it", err)
	}
}

// TestPromptLenPastWireRefused: a prompt longer than the 32 bits
// RequestData carries is refused at Send and at Receive, naming the
// request and the length, instead of reaching the other side cut.
func TestPromptLenPastWireRefused(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	const n = 1<<32 + 16 // 16 once cut to 32 bits
	_, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "long-tx", PromptLen: n})
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "long-tx") || !strings.Contains(err.Error(), "prompt length 4294967312") {
		t.Fatalf("send of a %d-token prompt: %v, want ErrBadRequest naming the request and the length", n, err)
	}
	_, err = c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "long-rx", PromptLen: n, Context: "ctx"})
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "long-rx") || !strings.Contains(err.Error(), "prompt length 4294967312") {
		t.Fatalf("receive of a %d-token prompt: %v, want ErrBadRequest naming the request and the length", n, err)
	}
	transfer(t, c, l, "long-tx", 1, 16, 16, true)
	transfer(t, c, l, "long-rx", 2, 16, 16, false)
	checkNoLeaks(t, c)
}

// TestTracePathInUseRefused: a second engine of the process given the
// trace file another one writes is refused at Start, naming TracePath,
// rather than truncating it under the first; the first's trace is whole,
// and the path is free again once the first closed.
func TestTracePathInUseRefused(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	path := filepath.Join(t.TempDir(), "engine.jsonl")
	start := func(inst string) (*kvxfer.Engine, error) {
		return kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 1 << 20, Link: link, TracePath: path})
	}
	first, err := start("first")
	if err != nil {
		t.Fatal(err)
	}
	second, err := start("second")
	if err == nil {
		_ = second.Close(context.Background())
	}
	if !errors.Is(err, kvxfer.ErrConfig) || !strings.Contains(err.Error(), "TracePath") {
		t.Fatalf("second engine on the first's trace file: %v, want ErrConfig naming TracePath", err)
	}
	if err := first.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"first`) || strings.Contains(string(b), `"second`) {
		t.Fatalf("the first engine's trace names another engine, or not itself:\n%.400s", b)
	}
	third, err := start("third")
	if err != nil {
		t.Fatalf("the path once its engine closed: %v", err)
	}
	if err := third.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// TestCallerUnpinLeavesEnginePins: Pools' Unpin and UnpinRuns drop only
// pins the caller took with Pin: the pins a chunk's admission took stay
// until Done (DESIGN.md §3), so a source block a write may still read
// cannot be unpinned and freed by a caller that undoes a pin it never
// took. Nothing changes on a refusal; the caller's own pins work as before.
func TestCallerUnpinLeavesEnginePins(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	e := c.ctx[0]
	pools := e.Pools()
	src, err := pools.Alloc([]int{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.Send(context.Background(), kvxfer.SendRequest{ID: "pinned", PromptLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	ch := kvcache.Chunk{Start: 0, End: 16, Last: true}
	runs := ch.Runs(l.TokensPerBlock, src)
	fence := &kvxfer.ManualFence{} // the op waits for it, admitted: its source stays pinned
	if err := tx.Chunk(ch, runs, fence); err != nil {
		t.Fatal(err)
	}
	if err := pools.Unpin(0, src[0]); !errors.Is(err, kvcache.ErrNotPinned) {
		t.Fatalf("caller's Unpin of a block only the engine pinned: %v, want ErrNotPinned", err)
	}
	if err := pools.UnpinRuns(runs); !errors.Is(err, kvcache.ErrNotPinned) {
		t.Fatalf("caller's UnpinRuns of blocks only the engine pinned: %v, want ErrNotPinned", err)
	}
	// The caller's own pin on top of the engine's comes off alone.
	if err := pools.Pin(0, src[0]); err != nil {
		t.Fatal(err)
	}
	if err := pools.Unpin(0, src[0]); err != nil {
		t.Fatalf("caller's Unpin of its own pin: %v", err)
	}
	if err := pools.Unpin(0, src[0]); !errors.Is(err, kvcache.ErrNotPinned) {
		t.Fatalf("caller's second Unpin: %v, want ErrNotPinned", err)
	}
	if err := pools.Free(src); !errors.Is(err, kvcache.ErrBlockPinned) {
		t.Fatalf("free of a chunk's source before Done: %v, want ErrBlockPinned", err)
	}
	tx.Cancel()
	fence.Fire(nil)
	if o := waitOutcome(t, tx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("tx: %v %v, want CANCELLED", o.Status, o.Err)
	}
	if err := pools.Free(src); err != nil {
		t.Fatalf("free of the source after Done: %v", err)
	}
	checkNoLeaks(t, c)
}

// TestCheckPeerNilHello: CheckPeer of no Hello (a lookup that found none)
// is an error wrapping ErrMismatch, not a nil-pointer panic.
func TestCheckPeerNilHello(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	if err := c.ctx[0].CheckPeer(nil); !errors.Is(err, kvxfer.ErrMismatch) || !strings.Contains(err.Error(), "nil") {
		t.Fatalf("CheckPeer(nil): %v, want ErrMismatch saying there is no Hello", err)
	}
	if err := c.ctx[0].CheckPeer(c.gen[0].Hello()); err != nil {
		t.Fatalf("CheckPeer of a matching peer: %v", err)
	}
}

// TestBadContextParallelRefusedAtReceive: a Receive whose ContextParallel
// does not fit the layout (a TP that does not divide the KV heads, a
// negative or half-set one, a PP past the layers) is refused by the call,
// wrapping ErrBadRequest and kvcache.ErrBadParallelism and naming the
// request and the value, instead of returning a handle whose request
// fails later; it holds no block, and the id stays free. (Checked to fail:
// without the check, Receive returns a handle and the request fails
// FAILED afterwards.)
func TestBadContextParallelRefusedAtReceive(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	for _, p := range []kvcache.Parallel{{TP: 3, PP: 1}, {TP: -1, PP: 1}, {TP: 0, PP: 2}, {TP: 1, PP: 0}, {TP: 1, PP: 5},
		// A split with a PP that splits nothing: refused too, not a
		// panic (kvcache.Parallel.Normal, before the check, sized a
		// slice by PP).
		{TP: 1, PP: -1, Stages: "1"}, {TP: 1, PP: 1 << 62, Stages: "1"}} {
		h, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "par-rx", PromptLen: 16, Context: "ctx", ContextParallel: p})
		if h != nil {
			h.Cancel()
			<-h.Done()
		}
		if !errors.Is(err, kvxfer.ErrBadRequest) || !errors.Is(err, kvcache.ErrBadParallelism) ||
			!strings.Contains(err.Error(), "par-rx") || !strings.Contains(err.Error(), "ContextParallel "+p.String()) {
			t.Fatalf("receive from a context of parallelism %v: %v, want ErrBadRequest and ErrBadParallelism naming the request and ContextParallel %v", p, err, p)
		}
	}
	if st := c.gen[0].Pools().Stats(); st[0].Receiving != 0 || st[0].Used != 0 {
		t.Fatalf("refused receives hold blocks: %+v", st[0])
	}
	transfer(t, c, l, "par-rx", 1, 16, 16, true)
	checkNoLeaks(t, c)
}

// TestNegativeRequestTimeoutRefused: a Send or Receive whose Timeout is
// negative (a time left computed past its end) is refused, naming the
// request and the value, instead of being taken as "no override" and
// given the whole Config.TransferTimeout; nothing is opened and the ids
// stay free. (Checked to fail: without the check both calls return a
// handle.)
func TestNegativeRequestTimeoutRefused(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "neg-tx", PromptLen: 16, Timeout: -time.Second})
	if tx != nil {
		tx.Cancel()
		<-tx.Done()
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "neg-tx") || !strings.Contains(err.Error(), "Timeout -1s") {
		t.Fatalf("send with Timeout -1s: %v, want ErrBadRequest naming the request and the timeout", err)
	}
	rx, err := c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: "neg-rx", PromptLen: 16, Context: "ctx", Timeout: -time.Second})
	if rx != nil {
		rx.Cancel()
		<-rx.Done()
	}
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "neg-rx") || !strings.Contains(err.Error(), "Timeout -1s") {
		t.Fatalf("receive with Timeout -1s: %v, want ErrBadRequest naming the request and the timeout", err)
	}
	if st := c.gen[0].Pools().Stats(); st[0].Receiving != 0 || st[0].Used != 0 {
		t.Fatalf("refused receive holds blocks: %+v", st[0])
	}
	transfer(t, c, l, "neg-tx", 1, 16, 16, true)
	transfer(t, c, l, "neg-rx", 2, 16, 16, false)
	checkNoLeaks(t, c)
}

// TestBadGenerationParallelRefusedAtSend: a SendRequest whose
// GenerationParallel is set but not as a parallelism (a negative TP, TP 0
// with a PP) is refused by the call, naming the request and the value,
// instead of being taken as not set; the id stays free. (Checked to fail:
// without the check, Send returns a handle for TP-1/PP1 and TP0/PP3.)
func TestBadGenerationParallelRefusedAtSend(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	for _, p := range []kvcache.Parallel{{TP: -1, PP: 1}, {TP: 0, PP: 3}, {TP: -2, PP: -2}, {TP: 3, PP: 1}, {TP: 1, PP: 0}} {
		tx, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "par-tx", PromptLen: 16, GenerationParallel: p})
		if tx != nil {
			tx.Cancel()
			<-tx.Done()
		}
		if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "par-tx") || !strings.Contains(err.Error(), p.String()) {
			t.Fatalf("send to a generation of parallelism %v: %v, want ErrBadRequest naming the request and %v", p, err, p)
		}
	}
	transfer(t, c, l, "par-tx", 1, 16, 16, true)
	checkNoLeaks(t, c)
}

// TestReceiveHugeIDErrorBounded: a Receive whose id is past
// messages.MaxRequestIDLen is refused for its id, before any other field
// is judged and quoted with it, so that the error stays short whatever
// else is wrong with the request (as Send's). (Checked to fail: without
// the check first, an empty Context, a bad Context or PromptLen, or a bad
// ContextParallel quoted the whole 1 MiB id.)
func TestReceiveHugeIDErrorBounded(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	huge := strings.Repeat("i", 1<<20)
	for _, r := range []kvxfer.ReceiveRequest{
		{ID: huge, PromptLen: 16},
		{ID: huge, PromptLen: 16, Context: "c\n"},
		{ID: huge, PromptLen: 1 << 40, Context: "ctx"},
		{ID: huge, PromptLen: 16, Context: "ctx", ContextParallel: kvcache.Parallel{TP: 3, PP: 1}},
		{ID: huge, PromptLen: 16, Context: "ctx", Timeout: -time.Second},
	} {
		_, err := c.gen[0].Receive(context.Background(), r)
		if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "request id length 1048576") || len(err.Error()) > 1024 {
			t.Fatalf("receive with a 1 MiB id: %d-byte error %.200q, want ErrBadRequest naming the id's length, short", len(err.Error()), err)
		}
	}
	if st := c.gen[0].Pools().Stats(); st[0].Receiving != 0 || st[0].Used != 0 {
		t.Fatalf("refused receives hold blocks: %+v", st[0])
	}
}

// TestWriterQueriesAfterCloseNameTheCall: WriterExited and WriterRequests
// after Close are refused with ErrClosed, and the error names the method,
// the peer and the incarnation asked about (it named an internal message
// type). (Checked to fail: the errors read "actors: *actors.writerExited:
// actors: engine closed".)
func TestWriterQueriesAfterCloseNameTheCall(t *testing.T) {
	l := smallLayout()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "lone", Layout: &l, PoolBytes: 1 << 20, Link: control.NewMemLink()})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	peer := messages.PeerID{Instance: "writer", Rank: 3}
	n, err := e.WriterExited(peer, 7, "exited")
	if n != 0 || !errors.Is(err, kvxfer.ErrClosed) || !strings.Contains(err.Error(), "WriterExited") ||
		!strings.Contains(err.Error(), peer.String()) || !strings.Contains(err.Error(), "incarnation 7") {
		t.Fatalf("WriterExited after Close: %d, %v, want ErrClosed naming the method, %s and incarnation 7", n, err, peer)
	}
	n, err = e.WriterRequests(peer, 7)
	if n != 0 || !errors.Is(err, kvxfer.ErrClosed) || !strings.Contains(err.Error(), "WriterRequests") ||
		!strings.Contains(err.Error(), peer.String()) || !strings.Contains(err.Error(), "incarnation 7") {
		t.Fatalf("WriterRequests after Close: %d, %v, want ErrClosed naming the method, %s and incarnation 7", n, err, peer)
	}
}

// TestNilContextRefused: Start, Send, Receive and Close given a nil
// context return an error naming it instead of panicking, and open or
// close nothing: the request ids stay free, and a Close given a nil
// context leaves the engine to a later Close, which drains and stops it
// (a panic inside Close's once used to leave every later Close returning
// nil with the engine still running).
func TestNilContextRefused(t *testing.T) {
	var nilCtx context.Context // (a variable: linters refuse a literal nil)
	call := func(what string, f func() error) error {
		t.Helper()
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s with a nil context panicked: %v", what, r)
				}
			}()
			err = f()
		}()
		if err == nil || !strings.Contains(err.Error(), "nil context") {
			t.Fatalf("%s with a nil context: %v, want an error naming the nil context", what, err)
		}
		return err
	}
	l := smallLayout()
	err := call("Start", func() error {
		e, err := kvxfer.Start(nilCtx, kvxfer.Config{Instance: "nilctx", Layout: &l, PoolBytes: 1 << 20, Link: control.NewMemLink()})
		if err == nil {
			_ = e.Close(context.Background())
		}
		return err
	})
	if !errors.Is(err, kvxfer.ErrConfig) {
		t.Fatalf("Start with a nil context: %v, want ErrConfig", err)
	}
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 1)
	err = call("Send", func() error {
		_, err := c.ctx[0].Send(nilCtx, kvxfer.SendRequest{ID: "nil-tx", PromptLen: 16})
		return err
	})
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "nil-tx") {
		t.Fatalf("Send with a nil context: %v, want ErrBadRequest naming nil-tx", err)
	}
	err = call("Receive", func() error {
		_, err := c.gen[0].Receive(nilCtx, kvxfer.ReceiveRequest{ID: "nil-rx", PromptLen: 16, Context: "ctx"})
		return err
	})
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "nil-rx") {
		t.Fatalf("Receive with a nil context: %v, want ErrBadRequest naming nil-rx", err)
	}
	transfer(t, c, l, "nil-tx", 1, 16, 16, true)
	transfer(t, c, l, "nil-rx", 2, 16, 16, false)
	checkNoLeaks(t, c)

	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "nilclose", Layout: &l, PoolBytes: 1 << 20, Link: control.NewMemLink()})
	if err != nil {
		t.Fatal(err)
	}
	call("Close", func() error { return e.Close(nilCtx) })
	// Nothing was closed: the engine still takes requests...
	tx, err := e.Send(context.Background(), kvxfer.SendRequest{ID: "after-nil-close", PromptLen: 16})
	if err != nil {
		t.Fatalf("Send after a refused Close: %v", err)
	}
	// ...and a Close with a context closes it (goleak checks its
	// goroutines are gone), cancelling the live request.
	if err := e.Close(context.Background()); err != nil {
		t.Fatalf("Close after a refused Close: %v", err)
	}
	if o := waitOutcome(t, tx.Done()); o.Status != kvxfer.StatusCancelled || !errors.Is(o.Err, kvxfer.ErrClosed) {
		t.Fatalf("request live at Close: %v %v, want CANCELLED by Close", o.Status, o.Err)
	}
	if _, err := e.Send(context.Background(), kvxfer.SendRequest{ID: "after-close", PromptLen: 16}); !errors.Is(err, kvxfer.ErrClosed) {
		t.Fatalf("Send after Close: %v, want ErrClosed", err)
	}
}
