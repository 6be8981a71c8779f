package rdmatest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testlog"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Child is the test binary re-executed to run one test as the other side
// of a cross-process test. It talks in lines: the parent sends on its
// stdin, and reads what it prints on stdout. Every wait is bounded by the
// suite's deadline; at the end of the test the child's stdin is closed and
// it is killed if it has not exited by the deadline.
type Child struct {
	cmd     *exec.Cmd
	stdin   *bufio.Writer
	closer  io.Closer
	lines   chan string
	stderr  *testlog.Buffer
	exited  chan struct{} // closed once Wait returned exitErr
	exitErr error
}

// StartChild re-executes the test binary to run only the test named run,
// with env added to this process's environment.
func StartChild(t *testing.T, run string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), env...)
	c := &Child{cmd: cmd, lines: make(chan string, 16), stderr: &testlog.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
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
	c.stdin, c.closer = bufio.NewWriter(in), in
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		defer close(c.lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			c.lines <- s.Text()
		}
	}()
	go func() {
		<-scanned // Wait closes stdout: read it all first
		c.exitErr = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.closer.Close()
		deadline := time.NewTimer(WaitLimit)
		defer deadline.Stop()
		lines := c.lines
		for {
			select {
			case _, ok := <-lines: // keep the scanner moving until EOF
				if !ok {
					lines = nil
				}
			case <-c.exited:
				return
			case <-deadline.C:
				cmd.Process.Kill()
			}
		}
	})
	return c
}

// Process is the child's process (to kill it).
func (c *Child) Process() *os.Process { return c.cmd.Process }

// Stop stops the child (SIGSTOP) and returns once every thread of it is
// stopped: kill(2) returns before the stop takes effect, and a thread
// running on another CPU meanwhile can still answer what reaches it (a
// test that takes the child for silent right after the signal would see
// it answer). Fails t at WaitLimit.
func (c *Child) Stop(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	dir := fmt.Sprintf("/proc/%d/task", c.cmd.Process.Pid)
	deadline := time.Now().Add(WaitLimit)
	for {
		running := ""
		tasks, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("stop the child: %v", err)
		}
		for _, task := range tasks {
			b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
			if err != nil {
				continue // the thread exited
			}
			// pid (comm) STATE ...: comm may hold spaces and parentheses.
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				running = task.Name()
				break
			}
		}
		if running == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %s of the child not stopped within %v of SIGSTOP", running, WaitLimit)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

// Expect returns the child's next stdout line starting with prefix,
// skipping others, under the deadline.
func (c *Child) Expect(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.NewTimer(WaitLimit)
	defer deadline.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before %q; stderr:\n%s", prefix, c.stderr)
			}
			if strings.HasPrefix(line, prefix) && !strings.HasPrefix(line, "=== ") {
				return line
			}
		case <-deadline.C:
			t.Fatalf("no %q from the child within %v; stderr:\n%s", prefix, WaitLimit, c.stderr)
		}
	}
}

// Send writes one line to the child's stdin.
func (c *Child) Send(t *testing.T, line string) {
	t.Helper()
	if _, err := c.stdin.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.stdin.Flush(); err != nil {
		t.Fatalf("send %q: %v", line, err)
	}
}

// Wait closes the child's stdin, waits for it to exit and fails t unless
// it exited 0.
func (c *Child) Wait(t *testing.T) {
	t.Helper()
	c.closer.Close()
	for line := range c.lines { // drain what is left
		t.Logf("child: %s", line)
	}
	Recv(t, c.exited, "child exit")
	if c.exitErr != nil {
		t.Fatalf("child: %v; stderr:\n%s", c.exitErr, c.stderr)
	}
}

// Reap waits for a killed child to be gone.
func (c *Child) Reap(t *testing.T) {
	t.Helper()
	c.closer.Close()
	for range c.lines {
	}
	Recv(t, c.exited, "killed child's exit")
}

// ShuffledSegments covers [0, n) with segments of varied sizes (at most
// 256 KiB) in a fixed random order, each writing source offset =
// destination offset.
func ShuffledSegments(n uint64) []kvcache.Segment {
	r := rand.New(rand.NewPCG(1, 2))
	var segs []kvcache.Segment
	for off := uint64(0); off < n; {
		l := min(1+r.Uint64N(256<<10), n-off)
		segs = append(segs, kvcache.Segment{Src: off, Dst: off, Len: l})
		off += l
	}
	r.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	return segs
}

// Pattern fills b with a reproducible random pattern (both sides of a
// cross-process test compute it from the seed).
func Pattern(b []byte, seed uint64) {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:8], seed)
	rand.NewChaCha8(s).Read(b)
}

// FirstDiff is the first offset where a and b differ, or -1.
func FirstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
