package zmq

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"
)

// sockWait parks a goroutine in Go's netpoller until a zmq socket has a
// message to read, instead of in zmq_poll: a goroutine blocked in a cgo
// call keeps its P, so the goroutines its frames woke (the engine's
// mailboxes) wait for another thread to take that P — up to sysmon's
// 10 ms tick on a quiet process. Parked in the netpoller, the goroutine
// gives its P to them at once.
//
// libzmq signals a socket's ZMQ_FD edge-triggered: the descriptor becomes
// readable when the socket's command mailbox goes from idle to busy, and
// reading ZMQ_EVENTS (or any send or receive) consumes the signal. So the
// readiness test runs inside RawConn.Read's callback, after the poller's
// ready flag was reset: a message that arrives after the test signals
// again and wakes the wait.
//
// Only the goroutine that owns the socket may call wait.
type sockWait struct {
	sock *zmq4.Socket
	f    *os.File // a duplicate of ZMQ_FD, registered with the netpoller
	rc   syscall.RawConn
	// interrupted: interrupt was called; every wait from then on ends at
	// once, as if its deadline had passed.
	interrupted atomic.Bool
}

func newSockWait(sock *zmq4.Socket) (*sockWait, error) {
	fd, err := sock.GetFd()
	if err != nil {
		return nil, fmt.Errorf("control/zmq: ZMQ_FD: %w", err)
	}
	// A duplicate, so that closing the file does not close libzmq's
	// descriptor; it shares the descriptor's non-blocking mode.
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("control/zmq: dup ZMQ_FD: %w", err)
	}
	syscall.CloseOnExec(dup)
	if err := syscall.SetNonblock(dup, true); err != nil {
		_ = syscall.Close(dup)
		return nil, fmt.Errorf("control/zmq: ZMQ_FD non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(dup), "zmq-fd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("control/zmq: ZMQ_FD: %w", err)
	}
	return &sockWait{sock: sock, f: f, rc: rc}, nil
}

// wait returns true as soon as the socket has a message to read, false
// when d passed first.
func (w *sockWait) wait(d time.Duration) (bool, error) {
	if err := w.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return false, err
	}
	if w.interrupted.Load() { // after the deadline: see interrupt
		return false, nil
	}
	var evErr error
	err := w.rc.Read(func(uintptr) bool {
		ev, err := w.sock.GetEvents()
		if err != nil {
			evErr = err
			return true
		}
		return ev&zmq4.POLLIN != 0
	})
	switch {
	case evErr != nil:
		return false, evErr
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// serve parks until the socket may have messages, then calls read, which
// reads without waiting and reports whether it left the socket empty (its
// last receive failed with EAGAIN); it keeps doing so until read says the
// socket was not left empty (its batch was full) or d passes, and reports
// which: true when d passed. Deadlines win over readiness, so a busy
// socket still returns at least every d.
//
// Unlike a loop of waits, serve parks after read without another cgo
// call: read's empty receive came after the poller's ready flag was reset
// (Read resets it once, before the first call), processed the socket's
// commands as ZMQ_EVENTS would, and so a message that came after it set
// the flag again. read may therefore hand what it read to other
// goroutines and return: this goroutine's P then runs them at once, where
// a cgo call would leave them to be stolen by a thread woken on another
// CPU.
func (w *sockWait) serve(d time.Duration, read func() (empty bool)) (timedOut bool, err error) {
	if err := w.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return false, err
	}
	if w.interrupted.Load() { // after the deadline: see interrupt
		return true, nil
	}
	err = w.rc.Read(func(uintptr) bool { return !read() })
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true, nil
	}
	return false, err
}

// interrupt ends the wait or serve under way, and every later one, at
// once, from any goroutine: the owner's loop then sees its stop channel
// without waiting out a long deadline (Link.Close). It marks the wait,
// then moves the deadline to now; a wait sets its deadline, then reads
// the mark. Either the wait's deadline came first (and interrupt's "now"
// replaces it) or the mark did (and the wait sees it): none sleeps on.
func (w *sockWait) interrupt() {
	if w == nil {
		return
	}
	w.interrupted.Store(true)
	_ = w.f.SetReadDeadline(time.Now()) // fails only once closed: nothing waits then
}

// close closes the duplicate descriptor (not the socket).
func (w *sockWait) close() {
	if w != nil {
		_ = w.f.Close()
	}
}
