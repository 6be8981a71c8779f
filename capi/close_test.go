package capi

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// goroutinesIn is how many goroutines have fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	k := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			k++
		}
	}
	return k
}

// waitBlockedIn waits (10 s deadline) until a goroutine is parked with fn
// on its stack.
func waitBlockedIn(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for goroutinesIn(fn) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine in %s within 10 s", fn)
		}
		runtime.Gosched()
	}
}

// waitGoroutinesIn waits (10 s deadline) until at most want goroutines
// have fn on their stack and returns how many do. A goroutine that has
// called its WaitGroup's Done (the last thing a watcher does) may still be
// on its way out when the Wait returns, its frame still on its stack.
func waitGoroutinesIn(fn string, want int) int {
	deadline := time.Now().Add(10 * time.Second)
	n := goroutinesIn(fn)
	for n > want && time.Now().Before(deadline) {
		runtime.Gosched()
		n = goroutinesIn(fn)
	}
	return n
}

// waitResult is what ch delivers within 10 s.
func waitResult(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10 s of the close", what)
		return nil
	}
}

// TestCloseWakesABlockedPoll: a Poll waiting (30 s) when Close starts
// returns at once with ErrClosed, not at its deadline.
func TestCloseWakesABlockedPoll(t *testing.T) {
	e := openClosed(t, "capi-wake-poll")
	res := make(chan error, 1)
	go func() {
		n, err := e.PollErr(make([]Event, 4), 30*time.Second)
		if n != 0 {
			err = fmt.Errorf("%d events from an idle engine (%v)", n, err)
		}
		res <- err
	}()
	waitBlockedIn(t, "capi.(*Engine).PollErr")
	start := time.Now()
	closeBoth(t, e)
	if err := waitResult(t, res, "the blocked Poll"); Code(err) != ErrClosed || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("blocked Poll across Close: %v (code %v), want ErrClosed", err, Code(err))
	}
	t.Logf("the poll returned %v after the close began", time.Since(start))
}

// TestCloseWakesWaitPeers: WaitPeers waiting (60 s) for a peer that never
// comes returns ErrClosed at once when its node closes; a later one is
// refused (the handle is gone).
func TestCloseWakesWaitPeers(t *testing.T) {
	dir := t.TempDir()
	if len(dir) > 80 { // an ipc path must fit a sun_path
		var err error
		if dir, err = os.MkdirTemp("/tmp", "kvx"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	e, _, err := OpenNode(fmt.Sprintf(`{"instance":"capi-wake-node","model":"Llama-3.1-8B","tokens_per_block":16,`+
		`"pool_bytes":4194304,"backend":"shm","workers":2,"bind":"ipc://%s","insecure":true,`+
		`"peers":[{"instance":"ghost","endpoint":"ipc://%s"}]}`, filepath.Join(dir, "a.sock"), filepath.Join(dir, "ghost.sock")))
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- e.WaitPeers(60 * time.Second) }()
	waitBlockedIn(t, "node.(*Node).WaitPeers")
	closeBoth(t, e)
	if err := waitResult(t, res, "WaitPeers"); Code(err) != ErrClosed || !strings.Contains(err.Error(), "closed while waiting") {
		t.Fatalf("WaitPeers across Close: %v (code %v), want ErrClosed", err, Code(err))
	}
}

// TestCloseCancelsWithErrClosed: a request its engine's close cancels
// reports KVXFER_ERR_CLOSED (delivered to the callback during the close),
// not KVXFER_ERR_INTERNAL.
func TestCloseCancelsWithErrClosed(t *testing.T) {
	p, d := openClosed(t, "capi-closed-p"), openClosed(t, "capi-closed-d")
	evs := make(chan Event, 4)
	d.SetNotify(func(ev Event) { evs <- ev })
	_, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "capi-closed-p"}})
	if err != nil {
		t.Fatal(err)
	}
	closeBoth(t, d, p)
	select {
	case ev := <-evs:
		if ev.Request != rh || ev.Outcome != OutcomeCancelled || ev.Error != ErrClosed {
			t.Fatalf("event %+v (error %v), want request %d CANCELLED with KVXFER_ERR_CLOSED", ev, ev.Error, rh)
		}
	default:
		t.Fatal("a drained close posted no event for its cancelled request")
	}
}

// TestTimedOutCloseEndsItsWatchers: a close that times out (a request
// whose writer got its RequestData and whose answers are held back — a
// writer stopped or partitioned — cannot prove its quiescence in no time)
// leaves no goroutine watching its requests, and nothing is delivered once
// it returned.
func TestTimedOutCloseEndsItsWatchers(t *testing.T) {
	const watcher = "capi.(*Engine).adopt"
	base := HandleCount()
	p, d, link := heldPair(t, "capi-undrained-p", "capi-undrained-d")
	t.Cleanup(func() { _ = d.Close(5 * time.Second) })
	delivered := make(chan Event, 4)
	d.SetNotify(func(ev Event) { delivered <- ev })
	if _, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "capi-undrained-p"}}); err != nil {
		t.Fatal(err)
	}
	tx, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "r", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Chunk(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, true); err != nil { // never fired
		t.Fatal(err)
	}
	link.waitRequestData(t, 1)
	if n := goroutinesIn(watcher); n != 2 {
		t.Fatalf("%d watchers for two requests", n)
	}
	link.held.Store(true)
	if err := d.Close(0); Code(err) != ErrTimeout {
		t.Fatalf("Close(0) with a request live: %v, want ErrTimeout", err)
	}
	if n := waitGoroutinesIn(watcher, 1); n != 1 {
		t.Fatalf("%d watchers left after the generation side's close timed out, want the context side's only", n)
	}
	got := len(delivered)
	closeBoth(t, p)
	if n := waitGoroutinesIn(watcher, 0); n != 0 {
		t.Fatalf("%d watchers left after both closed", n)
	}
	if len(delivered) != got {
		t.Fatalf("an event delivered after Close returned: %+v", <-delivered)
	}
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// openClosed is open, the engine closed when the test ends (when the
// test did not close it).
func openClosed(t *testing.T, instance string) *Engine {
	e := open(t, instance)
	t.Cleanup(func() { _ = e.Close(5 * time.Second) })
	return e
}

// TestOverlongValuesAreClipped: a 5,000-byte request id is refused with a
// message that shows its first bytes and its length, and still ends with
// the reason (the C message buffer holds 1,023 bytes), whatever else is
// wrong with the request. (Checked to fail: with the prompt length
// checked first, Send's message quoted the whole id.)
func TestOverlongValuesAreClipped(t *testing.T) {
	p := openClosed(t, "capi-clip")
	id := strings.Repeat("x", 5000)
	_, _, serr := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 32}})
	_, _, rerr := p.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "capi-clip"}})
	// With a bad prompt length too, the id is refused first: the message
	// never quotes it whole.
	_, _, nerr := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: -1}})
	_, _, nrerr := p.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: -1, Context: "capi-clip"}})
	for _, err := range []error{serr, rerr, nerr, nrerr} {
		if Code(err) != ErrBadRequest {
			t.Fatalf("a 5000-byte id: %v, want ErrBadRequest", err)
		}
		msg := err.Error()
		if len(msg) > 300 || !strings.Contains(msg, `"`+id[:64]+`"… (5000 bytes)`) || !strings.Contains(msg, "id length 5000") {
			t.Errorf("message of %d bytes: %.400s; want the id's first 64 bytes, its length and the reason", len(msg), msg)
		}
	}
	if got := quote("é" + strings.Repeat("y", 70)); !strings.HasPrefix(got, `"é`) || !strings.HasSuffix(got, `… (72 bytes)`) {
		t.Errorf("quote cut inside a character: %s", got)
	}
	closeBoth(t, p)
}
