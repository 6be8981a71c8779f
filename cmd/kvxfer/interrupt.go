package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// interruptible returns a context that SIGINT, SIGTERM or SIGHUP (a
// closed terminal, an ssh session that dropped: by default it killed the
// process with no report, its pool file left in /dev/shm) cancels, a
// function that says which of them came (0 while none), and stop, which
// stops listening. The first signal starts the drain and says so on
// standard error; a second one ends the process at once, without
// draining (forceExit: live requests fail at their peers' deadlines, a
// pool file may stay in /dev/shm until the next start sweeps it), unless
// it is the first's kind within repeatWindow of it: a process-group
// kill's copy, which the drain goes on through (once).
func interruptible(parent context.Context) (ctx context.Context, got func() syscall.Signal, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	var (
		mu  sync.Mutex
		sig syscall.Signal
	)
	done := make(chan struct{})
	go func() {
		var (
			first syscall.Signal
			at    time.Time
		)
		select {
		case s := <-ch:
			at = time.Now()
			first, _ = s.(syscall.Signal)
			mu.Lock()
			sig = first
			mu.Unlock()
			fmt.Fprintf(interruptOut, "kvxfer: %s: stopping; live requests are cancelled, and their writes drain first (signal again to exit at once, without draining)\n", sigName(first))
			cancel()
		case <-done:
			return
		}
		if os.Getenv(demoChildEnv) != "" {
			// A demo's child: the terminal's Ctrl-C reaches it and the demo
			// forwards one more; the demo decides when it stops (its own
			// second signal kills its children at once).
			return
		}
		for absorbed := false; ; absorbed = true {
			select {
			case s := <-ch:
				again, _ := s.(syscall.Signal)
				if !absorbed && again == first && time.Since(at) < repeatWindow {
					// One repeat of the same signal at once is a
					// process-group kill's copy (timeout(1) signals its
					// command and then its group), not a user asking
					// twice: the drain goes on.
					fmt.Fprintf(interruptOut, "kvxfer: %s again %v after the first: taken as the same stop (timeout(1) and a process-group kill send it twice); the drain goes on (signal again to exit at once)\n",
						sigName(again), time.Since(at).Round(time.Microsecond))
					continue
				}
				fmt.Fprintf(interruptOut, "kvxfer: %s during the drain: exiting at once, without draining\n", sigName(again))
				runForceExitHooks()
				forceExit(128 + int(again))
			case <-done:
			}
			return
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

// demoChildEnv marks a process a demo started (kvxfer ctx or gen under
// demo --processes 2 or --cluster): a second signal does not force it out
// (listed in config.OtherEnv: no unknown-setting warning).
const demoChildEnv = "KVXFER_DEMO_CHILD"

// repeatWindow: a second signal of the first one's kind this soon after
// it is that signal's copy from a process-group kill (GNU timeout(1)
// sends its signal to the command and then to its own process group, so
// the command gets it twice, microseconds apart), not a second request:
// one such repeat does not force the exit. A person's second Ctrl-C comes
// later than this, and a third signal always forces it. A variable for
// tests.
var repeatWindow = 100 * time.Millisecond

// interruptOut is where the signal handling speaks (standard error);
// forceExit ends the process at a second signal. Variables for tests.
var (
	interruptOut io.Writer = os.Stderr
	forceExit              = os.Exit
)

// forceExitHooks run before a forced exit: a demo kills its child
// processes, which would otherwise drain on without it.
var forceExitHooks struct {
	mu sync.Mutex
	fs []func()
}

func atForceExit(f func()) {
	forceExitHooks.mu.Lock()
	forceExitHooks.fs = append(forceExitHooks.fs, f)
	forceExitHooks.mu.Unlock()
}

func runForceExitHooks() {
	forceExitHooks.mu.Lock()
	fs := forceExitHooks.fs
	forceExitHooks.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return "SIGTERM"
}

func (e *interruptedError) Error() string {
	name := sigName(e.sig)
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
