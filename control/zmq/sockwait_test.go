package zmq

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
)

// TestSockWaitSeesEveryMessage: bursts of 1 to 4 messages over a
// DEALER/ROUTER pair; the ROUTER's side waits in sockWait before each
// message it reads, one message per wait. Messages already queued behind
// the one just read signal no new edge, and the next burst races the
// waiter back into its wait: a wait that does not test ZMQ_EVENTS after
// the poller's ready flag is reset misses them until the deadline, and
// reports false.
func TestSockWaitSeesEveryMessage(t *testing.T) {
	const rounds = 500
	router, w, next := sockWaitPair(t, "inproc://sockwait-test", rounds)
	for i := range rounds {
		ready, err := w.wait(patience)
		if err != nil {
			t.Fatalf("message %d: wait: %v", i, err)
		}
		if !ready {
			t.Fatalf("message %d: not seen within %v", i, patience)
		}
		msg, err := router.RecvMessageBytes(zmq4.DONTWAIT)
		if err != nil {
			t.Fatalf("message %d: the wait said ready, the receive says %v", i, err)
		}
		if got := string(msg[len(msg)-1]); got != fmt.Sprint(i) {
			t.Fatalf("message %d: got %q", i, got)
		}
		if i < rounds-1 && isBurstEnd(i) {
			next <- struct{}{}
		}
	}
	// Nothing more comes: the wait ends at its deadline, not ready.
	if ready, err := w.wait(20 * time.Millisecond); err != nil || ready {
		t.Fatalf("wait with nothing sent = %v, %v; want false, nil", ready, err)
	}
}

// TestSockWaitServeSeesEveryMessage: the same bursts, read by serve as the
// listener reads: its read callback takes all that is queued (until
// EAGAIN), lets the sender go on at the end of a burst — so that the next
// burst races serve back into its park, which it enters without a
// readiness test — and returns. A serve whose park missed a message that
// came after the empty receive would sit until its deadline and report
// timedOut. The race is narrow: a serve that reads before its Read (and
// so may park on a flag its Read reset) failed 3 runs in 20 at 500
// messages and 6 in 10 at 5,000.
func TestSockWaitServeSeesEveryMessage(t *testing.T) {
	const rounds = 5000
	router, w, next := sockWaitPair(t, "inproc://sockwait-serve-test", rounds)
	i := 0
	var readErr error
	read := func() (empty bool) {
		for i < rounds {
			msg, err := router.RecvMessageBytes(zmq4.DONTWAIT)
			if err != nil {
				if !isAgain(err) {
					readErr = err
					return false
				}
				return true
			}
			if got := string(msg[len(msg)-1]); got != fmt.Sprint(i) {
				readErr = fmt.Errorf("message %d: got %q", i, got)
				return false
			}
			if i < rounds-1 && isBurstEnd(i) {
				next <- struct{}{}
			}
			i++
		}
		return false // all seen: serve returns
	}
	for i < rounds {
		timedOut, err := w.serve(patience, read)
		switch {
		case err != nil:
			t.Fatalf("message %d: serve: %v", i, err)
		case readErr != nil:
			t.Fatal(readErr)
		case timedOut:
			t.Fatalf("message %d: not seen within %v", i, patience)
		}
	}
	// Nothing more comes: serve reads once, finds the socket empty, and
	// ends at its deadline.
	calls := 0
	timedOut, err := w.serve(20*time.Millisecond, func() bool {
		calls++
		_, err := router.RecvMessageBytes(zmq4.DONTWAIT)
		readErr = err
		return isAgain(err)
	})
	if err != nil || !timedOut || calls != 1 || !isAgain(readErr) {
		t.Fatalf("serve with nothing sent = %v, %v after %d reads (last %v); want true, nil after 1 (EAGAIN)", timedOut, err, calls, readErr)
	}
}

// TestSockWaitServeEndsAtItsDeadlineUnderLoad: while messages keep coming
// (each burst sent as soon as the last was read), serve still returns when
// its deadline passes, so the listener's liveness tick and its stop check
// run under load too.
func TestSockWaitServeEndsAtItsDeadlineUnderLoad(t *testing.T) {
	const rounds = 1 << 30 // the sender runs until cleanup stops it
	router, w, next := sockWaitPair(t, "inproc://sockwait-deadline-test", rounds)
	var reads, msgs atomic.Int64
	done := make(chan error, 1)
	go func() {
		timedOut, err := w.serve(20*time.Millisecond, func() bool {
			reads.Add(1)
			for {
				if _, err := router.RecvMessageBytes(zmq4.DONTWAIT); err != nil {
					return isAgain(err)
				}
				if isBurstEnd(int(msgs.Add(1) - 1)) {
					next <- struct{}{}
				}
			}
		})
		if err == nil && !timedOut {
			err = fmt.Errorf("serve returned before its deadline")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(patience):
		t.Fatalf("serve still running after %v with a 20ms deadline (%d reads, %d messages)", patience, reads.Load(), msgs.Load())
	}
	t.Logf("%d reads, %d messages before the deadline", reads.Load(), msgs.Load())
}

// sockWaitPair connects a DEALER to a ROUTER bound at endpoint, starts a
// sender of rounds messages ("0", "1", …) on the DEALER in bursts
// (message i starts a burst of 1+i%4), and returns the ROUTER, its
// sockWait and the channel on which the reader lets the sender go on
// after each burst. Cleanup stops the sender and closes everything.
func sockWaitPair(t *testing.T, endpoint string, rounds int) (*zmq4.Socket, *sockWait, chan<- struct{}) {
	t.Helper()
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zctx.Term() })
	router, err := zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeSocket(router) })
	dealer, err := zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeSocket(dealer) })
	for _, s := range []*zmq4.Socket{router, dealer} {
		if err := s.SetLinger(0); err != nil {
			t.Fatal(err)
		}
	}
	if err := router.Bind(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	w, err := newSockWait(router)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)

	next := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		for i := 0; i < rounds; {
			burst := min(1+i%4, rounds-i)
			for range burst {
				if _, err := dealer.SendBytes([]byte(fmt.Sprint(i)), 0); err != nil {
					sent <- err
					return
				}
				i++
			}
			if _, ok := <-next; !ok {
				break
			}
		}
		sent <- nil
	}()
	// Registered last, so run first: the sender ends before its socket
	// closes.
	t.Cleanup(func() {
		close(next)
		if err := <-sent; err != nil {
			t.Errorf("send: %v", err)
		}
	})
	return router, w, next
}

// isBurstEnd reports whether message i ends a burst of sockWaitPair's
// sender (bursts start at 0 and have 1+start%4 messages).
func isBurstEnd(i int) bool {
	for start := 0; start <= i; {
		end := start + start%4
		if i == end {
			return true
		}
		start = end + 1
	}
	return false
}

// interrupt ends a wait and a serve under way at once, and every later
// one, from another goroutine, whatever their deadlines: how Close stops
// the listener and the ZAP handler, which otherwise wait up to idleWait.
// (Checked to fail: with interrupt a no-op both waits run to their hour.)
func TestSockWaitInterrupt(t *testing.T) {
	_, w, _ := sockWaitPair(t, "inproc://sockwait-interrupt", 0)
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := w.wait(time.Hour)
		done <- result{ok, err}
	}()
	// One interrupt suffices, before the wait sets its deadline (the
	// wait sees the mark) or after (the deadline moves to now).
	w.interrupt()
	select {
	case r := <-done:
		if r.ok || r.err != nil {
			t.Fatalf("interrupted wait = %v, %v; want false, nil", r.ok, r.err)
		}
	case <-time.After(patience):
		t.Fatalf("wait(1h) not ended by interrupt within %v", patience)
	}
	served := make(chan bool, 1)
	go func() {
		timedOut, _ := w.serve(time.Hour, func() bool { return true })
		served <- timedOut
	}()
	select {
	case timedOut := <-served:
		if !timedOut {
			t.Fatal("a serve after interrupt did not report its end as a timeout")
		}
	case <-time.After(patience):
		t.Fatalf("serve(1h) after interrupt still waiting after %v", patience)
	}
}
