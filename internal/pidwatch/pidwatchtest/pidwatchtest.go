// Package pidwatchtest starts child processes for tests of the pidfd
// proof: one that maps a given file shared and writable, as a writer maps
// a receiver's pool, and one that maps nothing of it. Both are the test
// binary itself, started again; its TestMain calls MaybeChild first.
package pidwatchtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/messages"
)

// childEnv holds, in a child, the file to map ("-": none).
const childEnv = "KVXFER_PIDWATCHTEST_MAP"

// MaybeChild makes the process a child when Mapper or Idle started it:
// it maps the file named (if any) shared and writable, says "ready" on
// stdout, and exits when its stdin closes (or it is killed). It returns
// at once in any other process.
func MaybeChild() {
	path := os.Getenv(childEnv)
	if path == "" {
		return
	}
	if path != "-" {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fi, err := f.Stat()
		if err == nil {
			_, err = unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		_ = f.Close() // the mapping stays
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0)
}

// Mapper starts a child that maps path shared and writable and returns it
// and its ProcessID once it has mapped it. The test kills it at Cleanup
// at the latest.
func Mapper(t testing.TB, path string) (*exec.Cmd, messages.ProcessID) { return start(t, path) }

// Idle starts a child that maps nothing of the test's.
func Idle(t testing.TB) (*exec.Cmd, messages.ProcessID) { return start(t, "-") }

func start(t testing.TB, path string) (*exec.Cmd, messages.ProcessID) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	said := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		said <- strings.TrimSpace(l)
	}()
	select {
	case l := <-said:
		if l != "ready" {
			t.Fatalf("child for %s said %q, want ready", path, l)
		}
	case <-time.After(time.Minute):
		t.Fatalf("child for %s not ready within a minute", path)
	}
	host, err := pidwatch.Host()
	if err != nil {
		t.Fatal(err)
	}
	st, err := pidwatch.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, messages.ProcessID{Pid: uint32(cmd.Process.Pid), StartTime: st, Host: host}
}
