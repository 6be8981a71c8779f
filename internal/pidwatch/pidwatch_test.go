package pidwatch

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// child starts a process that lives until killed, and its ProcessID.
func child(t *testing.T) (*exec.Cmd, messages.ProcessID) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to start: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	host, err := Host()
	if err != nil {
		t.Fatal(err)
	}
	st, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, messages.ProcessID{Pid: uint32(cmd.Process.Pid), StartTime: st, Host: host}
}

func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s: no exit reported within a minute", what)
	}
}

// state is the one-letter state of pid (field 3 of /proc/<pid>/stat).
func state(t *testing.T, pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

// A killed process is reported exited; a stopped one is not (SIGSTOP is
// not death), until it is killed too.
func TestWatchExitNotStop(t *testing.T) {
	w := New()
	defer w.Close()
	stopped, sp := child(t)
	killed, kp := child(t)
	sExit, kExit := make(chan struct{}), make(chan struct{})
	if _, err := w.Watch(sp, func() { close(sExit) }); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Watch(kp, func() { close(kExit) }); err != nil {
		t.Fatal(err)
	}
	if err := stopped.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for state(t, stopped.Process.Pid) != "T" {
		if time.Now().After(deadline) {
			t.Fatal("the process did not stop")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	if err := killed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	await(t, kExit, "killed process")
	select {
	case <-sExit:
		t.Fatal("a stopped process was reported exited")
	default:
	}
	if err := stopped.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	await(t, sExit, "stopped, then killed process")
}

// A Hello whose start time is not the pid's (a reused pid, a lie) is not
// trusted: no pidfd, no proof.
func TestWatchStartTimeMismatch(t *testing.T) {
	w := New()
	defer w.Close()
	_, p := child(t)
	p.StartTime++
	_, err := w.Watch(p, func() { t.Error("exit reported for a process that was not watched") })
	if !errors.Is(err, ErrNotThatProcess) {
		t.Fatalf("Watch of a pid with another start time: %v, want ErrNotThatProcess", err)
	}
	if len(w.files) != 0 {
		t.Fatalf("%d pidfds left open", len(w.files))
	}
}

// A process of another host or pid namespace, or one not named, gets no
// pidfd.
func TestWatchOtherHost(t *testing.T) {
	w := New()
	defer w.Close()
	_, p := child(t)
	for _, host := range []string{"00000000-0000-0000-0000-000000000000/" + strings.SplitN(p.Host, "/", 2)[1],
		strings.SplitN(p.Host, "/", 2)[0] + "/pid:[1]"} {
		q := p
		q.Host = host
		if _, err := w.Watch(q, func() { t.Error("exit reported for another host") }); !errors.Is(err, ErrOtherHost) {
			t.Fatalf("Watch of host %s: %v, want ErrOtherHost", host, err)
		}
	}
	if _, err := w.Watch(messages.ProcessID{}, func() {}); !errors.Is(err, ErrUntold) {
		t.Fatalf("Watch of no process: %v, want ErrUntold", err)
	}
	if len(w.files) != 0 {
		t.Fatalf("%d pidfds open", len(w.files))
	}
}

// Close stops the watches without reporting exits.
func TestWatchClose(t *testing.T) {
	w := New()
	_, p := child(t)
	if _, err := w.Watch(p, func() { t.Error("exit reported after Close") }); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := w.Watch(p, func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Watch after Close: %v", err)
	}
}

func TestSelf(t *testing.T) {
	p, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if int(p.Pid) != os.Getpid() || p.StartTime == 0 || !strings.Contains(p.Host, "/pid:[") {
		t.Fatalf("Self = %+v", p)
	}
}
