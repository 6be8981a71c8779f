//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

// stackedIn reports whether a goroutine has every one of fns on its stack.
func stackedIn(fns ...string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		all := true
		for _, fn := range fns {
			all = all && strings.Contains(g, fn)
		}
		if all {
			return true
		}
	}
	return false
}

// TestCloseWithARacingConnectsEndpointClosedFirst: Agent.Close takes a
// snapshot of its endpoints and marks them closing; the shutdown marks
// those whose UCP endpoint it closes. An endpoint a racing Connect opened
// after the snapshot, whose UCP endpoint then closed before the shutdown
// began (UCX reported it failed), is in neither: its dispatcher exits only
// once the endpoint is marked closing, and Close, which waits for every
// dispatcher, must not hang on it. Before the fix it waited for good.
func TestCloseWithARacingConnectsEndpointClosedFirst(t *testing.T) {
	r, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	e1i, err := s.Connect(r.Address())
	if err != nil {
		t.Fatal(err)
	}
	e1 := e1i.(*endpoint)
	queued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(rdmatest.WaitLimit)
		for {
			s.w.mu.Lock()
			k := len(s.w.reqs)
			s.w.mu.Unlock()
			if k == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d requests queued, want %d", k, n)
			}
			time.Sleep(time.Millisecond) // poll with a deadline
		}
	}

	// Hold the progress goroutine; queue a Connect behind it.
	hIn, hGo, hDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(hDone)
		s.w.do(func() { close(hIn); <-hGo })
	}()
	<-hIn
	type connected struct {
		ep  rdma.Endpoint
		err error
	}
	e2c := make(chan connected, 1)
	go func() {
		ep, err := s.Connect(r.Address())
		e2c <- connected{ep, err}
	}()
	queued(1)

	// Close takes its snapshot (without the endpoint being connected) and
	// stops at the first endpoint of it, whose lock the test holds.
	e1.mu.Lock()
	closeErr := make(chan error, 1)
	go func() { closeErr <- s.Close() }()
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for !stackedIn("(*endpoint).requestClose(", "(*Agent).Close.") {
		if time.Now().After(deadline) {
			e1.mu.Unlock()
			close(hGo)
			t.Fatal("Close never reached its snapshot's endpoints")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}

	// UCX reports the new endpoint failed right after it is opened, as
	// it may for a peer just gone: its UCP endpoint closes.
	failed := make(chan struct{})
	go func() {
		defer close(failed)
		s.w.do(func() {
			for _, u := range s.w.ueps {
				if u.ep != nil && u.ep != e1 {
					s.w.onError(u.id, ucsEndpointTimeout)
				}
			}
		})
	}()
	queued(2)
	close(hGo)
	<-hDone
	<-failed
	c := rdmatest.Recv(t, e2c, "the racing Connect")
	if c.err != nil {
		e1.mu.Unlock()
		t.Fatal(c.err)
	}
	e2 := c.ep.(*endpoint)
	deadline = time.Now().Add(rdmatest.WaitLimit)
	for {
		e2.mu.Lock()
		done := e2.ucpClosed
		e2.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			e1.mu.Unlock()
			t.Fatal("the failed endpoint's UCP endpoint never closed")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}

	e1.mu.Unlock()
	closed = true
	select {
	case <-closeErr:
	case <-time.After(rdmatest.WaitLimit):
		t.Error("Agent.Close hangs on the racing Connect's endpoint (closed before the shutdown, never marked closing)")
		e2.Close() // marks it closing: its dispatcher, and Close, end
		<-closeErr
	}
	if err := e2.Close(); err != nil {
		t.Errorf("Close of the racing Connect's endpoint: %v", err)
	}
}
