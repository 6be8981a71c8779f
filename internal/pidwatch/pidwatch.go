// Package pidwatch observes the exit of a peer process on this host, as
// proof for the receiver (issue 17, docs/membership.md §4): a Hello names
// its sender's process (messages.ProcessID: pid, start time, host and pid
// namespace); Watch checks that the process is on this host and in this
// pid namespace, opens a pidfd for it, checks that the pid still belongs
// to the process that sent the Hello (its start time), and calls back
// once when the pidfd becomes readable: the process has exited, every
// thread of it, and its address space is gone.
//
// A stopped process (SIGSTOP) has not exited: its pidfd stays unreadable.
package pidwatch

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/messages"
)

// Errors of Watch: each means no proof will come from this watch.
var (
	// ErrUntold: the Hello names no process (an older peer).
	ErrUntold = errors.New("pidwatch: the peer did not name its process")
	// ErrOtherHost: the process is on another host or in another pid
	// namespace: its pid means nothing here.
	ErrOtherHost = errors.New("pidwatch: the peer's process is on another host or pid namespace")
	// ErrNotThatProcess: the pid belongs to another process than the one
	// that sent the Hello (its start time differs: the pid was reused),
	// or to none.
	ErrNotThatProcess = errors.New("pidwatch: the pid is not the peer's process")
	// ErrClosed: the Watcher is closed.
	ErrClosed = errors.New("pidwatch: closed")
)

// procRoot is where procfs is mounted (a test may point it elsewhere).
var procRoot = "/proc"

// Host names this host and pid namespace: the kernel's boot id and the
// inode of this process's pid namespace ("<boot_id>/pid:[<inode>]"). Two
// processes with the same Host see the same pids.
func Host() (string, error) {
	boot, err := os.ReadFile(procRoot + "/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("pidwatch: boot id: %w", err)
	}
	ns, err := os.Readlink(procRoot + "/self/ns/pid")
	if err != nil {
		return "", fmt.Errorf("pidwatch: pid namespace: %w", err)
	}
	b := strings.TrimSpace(string(boot))
	if b == "" || !strings.HasPrefix(ns, "pid:[") {
		return "", fmt.Errorf("pidwatch: boot id %q, pid namespace %q: not understood", b, ns)
	}
	return b + "/" + ns, nil
}

// Self is this process's ProcessID.
func Self() (messages.ProcessID, error) {
	host, err := Host()
	if err != nil {
		return messages.ProcessID{}, err
	}
	pid := os.Getpid()
	st, err := StartTime(pid)
	if err != nil {
		return messages.ProcessID{}, err
	}
	return messages.ProcessID{Pid: uint32(pid), StartTime: st, Host: host}, nil
}

// StartTime is the start time of process pid (field 22 of
// /proc/<pid>/stat: clock ticks after boot).
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold anything:
	// the fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("pidwatch: /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	const startField = 22 - 3 // f[0] is field 3 (state)
	if len(f) <= startField {
		return 0, fmt.Errorf("pidwatch: /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	v, err := strconv.ParseUint(f[startField], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pidwatch: /proc/%d/stat: start time: %w", pid, err)
	}
	return v, nil
}

// Watcher watches peer processes. Its methods are safe for concurrent use.
type Watcher struct {
	host    string
	hostErr error
	mu      sync.Mutex
	closed  bool
	files   map[*os.File]bool
	wg      sync.WaitGroup
}

// New returns a Watcher for processes of this host and pid namespace.
func New() *Watcher {
	w := &Watcher{files: map[*os.File]bool{}}
	w.host, w.hostErr = Host()
	return w
}

// Check tells whether p is a process this Watcher can watch: nil, or why
// no proof of its exit can come from here.
func (w *Watcher) Check(p messages.ProcessID) error {
	switch {
	case p.IsZero():
		return ErrUntold
	case w.hostErr != nil:
		return fmt.Errorf("%w: this host's identity is unknown: %w", ErrOtherHost, w.hostErr)
	case p.Host != w.host:
		return fmt.Errorf("%w: %s, this one is %s", ErrOtherHost, p.Host, w.host)
	}
	return nil
}

// Watch opens a pidfd for p and calls exited, once, on its own goroutine,
// when p has exited; the Proc it returns checks p's mappings while p lives
// (Proc.MapsShared). It returns an error, and never calls exited, when p
// is not a process of this host and pid namespace (ErrUntold,
// ErrOtherHost), when the pid is not p's (ErrNotThatProcess: gone
// already, or reused), or when no pidfd can be had. Close stops every
// watch without calling exited.
//
// The pidfd is opened before the start time is read: if the start time
// then matches the Hello's, the pidfd names the Hello's process unless
// the pid was reused, between the open and the read, by a process that
// started in the same clock tick as the Hello's sender — which had to
// start, send its Hello, exit and give up its pid within that tick.
func (w *Watcher) Watch(p messages.ProcessID, exited func()) (*Proc, error) {
	if err := w.Check(p); err != nil {
		return nil, err
	}
	fd, err := unix.PidfdOpen(int(p.Pid), unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("%w: pid %d: no such process", ErrNotThatProcess, p.Pid)
		}
		return nil, fmt.Errorf("pidwatch: pidfd of %d: %w", p.Pid, err)
	}
	st, err := StartTime(int(p.Pid))
	if err != nil || st != p.StartTime {
		_ = unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("%w: pid %d: %w", ErrNotThatProcess, p.Pid, err)
		}
		return nil, fmt.Errorf("%w: pid %d started at tick %d, the peer's process at %d", ErrNotThatProcess, p.Pid, st, p.StartTime)
	}
	// A non-blocking pidfd goes to Go's netpoller: the goroutine below
	// parks until the pidfd is readable or the file is closed.
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", p.Pid))
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("pidwatch: pidfd of %d: %w", p.Pid, err)
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		_ = f.Close()
		return nil, ErrClosed
	}
	w.files[f] = true
	w.wg.Add(1)
	w.mu.Unlock()
	go func() {
		defer w.wg.Done()
		gone := false
		err := rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, perr := unix.Poll(fds, 0)
			gone = perr == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
			return gone || (perr != nil && !errors.Is(perr, unix.EINTR))
		})
		w.mu.Lock()
		owned := w.files[f]
		delete(w.files, f)
		w.mu.Unlock()
		if owned {
			_ = f.Close()
		}
		if err == nil && gone {
			exited()
		}
	}()
	return &Proc{pid: p.Pid, rc: rc}, nil
}

// Watching is how many processes are watched now.
func (w *Watcher) Watching() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.files)
}

// Close stops every watch (no exited is called after Close returns) and
// waits for their goroutines.
func (w *Watcher) Close() {
	w.mu.Lock()
	w.closed = true
	files := w.files
	w.files = map[*os.File]bool{}
	w.mu.Unlock()
	for f := range files {
		_ = f.Close()
	}
	w.wg.Wait()
}
