package zmq

import (
	"fmt"
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
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	router, err := zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSocket(router)
	dealer, err := zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSocket(dealer)
	for _, s := range []*zmq4.Socket{router, dealer} {
		if err := s.SetLinger(0); err != nil {
			t.Fatal(err)
		}
	}
	if err := router.Bind("inproc://sockwait-test"); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Connect("inproc://sockwait-test"); err != nil {
		t.Fatal(err)
	}
	w, err := newSockWait(router)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()

	read := make(chan struct{})
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
			if _, ok := <-read; !ok {
				break
			}
		}
		sent <- nil
	}()
	defer func() {
		close(read)
		if err := <-sent; err != nil {
			t.Errorf("send: %v", err)
		}
	}()
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
			read <- struct{}{}
		}
	}
	// Nothing more comes: the wait ends at its deadline, not ready.
	if ready, err := w.wait(20 * time.Millisecond); err != nil || ready {
		t.Fatalf("wait with nothing sent = %v, %v; want false, nil", ready, err)
	}
}

// isBurstEnd reports whether message i ends a burst of the sender in
// TestSockWaitSeesEveryMessage (bursts start at 0 and have 1+start%4
// messages).
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
