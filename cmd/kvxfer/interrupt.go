package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// interruptible returns a context that SIGINT or SIGTERM cancels, a
// function that says which of them came (0 while none), and stop, which
// stops listening.
func interruptible(parent context.Context) (ctx context.Context, got func() syscall.Signal, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var (
		mu  sync.Mutex
		sig syscall.Signal
	)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			mu.Lock()
			sig, _ = s.(syscall.Signal)
			mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
			cancel()
		})
	}
	got = func() syscall.Signal {
		mu.Lock()
		defer mu.Unlock()
		return sig
	}
	return ctx, got, stop
}

// interruptedError is a run a signal stopped before it finished: the
// message says so first (what failed after it is the interruption's
// doing, not the cause), and the process exits 128 + the signal's number,
// as a shell reports a command a signal stopped.
type interruptedError struct {
	sig syscall.Signal
	err error
}

func (e *interruptedError) Error() string {
	name := "SIGTERM"
	if e.sig == syscall.SIGINT {
		name = "SIGINT"
	}
	if e.err == nil {
		return fmt.Sprintf("interrupted (%s) before the run finished", name)
	}
	return fmt.Sprintf("interrupted (%s) before the run finished: %v", name, e.err)
}

func (e *interruptedError) Unwrap() error { return e.err }

// exitCode is the process's exit status for a command's error.
func exitCode(err error) int {
	if ie := (*interruptedError)(nil); errors.As(err, &ie) {
		return 128 + int(ie.sig)
	}
	return 1
}

// interrupted wraps err when got says a signal stopped the run.
func interrupted(got func() syscall.Signal, err error) error {
	if s := got(); s != 0 {
		return &interruptedError{sig: s, err: err}
	}
	return err
}
