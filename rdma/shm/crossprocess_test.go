package shm_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// childEnv makes the test binary, re-executed, act as the receiver.
const childEnv = "KVXFER_SHM_CHILD"

// crossLen is the receiver's region size.
const crossLen = 8 << 20

// The receiver's protocol, one line each way:
//
//	child:  READY <address> <key hex> <len>
//	parent: DEREGISTER           child: DEREGISTER busy|ok|<error>
//	parent: VERIFY <seed>        child: VERIFIED | MISMATCH <offset>
//
// then the child closes its agent and region and exits (0 when every step
// passed).
const readyPrefix = "KVXFER-SHM READY "

// TestCrossProcessChild is the receiver; it does nothing unless re-executed
// by TestCrossProcess.
func TestCrossProcessChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as TestCrossProcess's child")
	}
	r, c, err := shm.NewRegion("", crossLen)
	if err != nil {
		t.Fatal(err)
	}
	a := shm.New()
	t.Cleanup(func() { // on failure too: no file left behind
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	rr := reg.Remote()
	fmt.Printf("%s%s %s %d\n", readyPrefix, a.Address(), hex.EncodeToString(rr.Key), rr.Len)

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "DEREGISTER":
			switch err := a.Deregister(reg); {
			case errors.Is(err, rdma.ErrRegionBusy):
				fmt.Println("DEREGISTER busy")
			case err == nil:
				fmt.Println("DEREGISTER ok")
			default:
				fmt.Println("DEREGISTER", err)
			}
		case "VERIFY":
			seed, _ := strconv.ParseUint(arg, 10, 64)
			if err := a.Deregister(reg); err != nil {
				t.Errorf("Deregister after the sender flushed: %v", err)
			}
			want := make([]byte, crossLen)
			pattern(want, seed)
			if i := firstDiff(r.Bytes(), want); i >= 0 {
				fmt.Println("MISMATCH", i)
				t.Errorf("byte %d: got %#02x, want %#02x", i, r.Bytes()[i], want[i])
			} else {
				fmt.Println("VERIFIED")
			}
			return
		default:
			t.Fatalf("unknown command %q", in.Text())
		}
	}
	t.Fatalf("stdin closed before VERIFY: %v", in.Err())
}

// TestCrossProcess re-executes the test binary as the receiver, writes a
// pattern into its shared region in shuffled segments, and has it check the
// bytes; on the way it checks that a bad key is refused across processes,
// that the receiver's Deregister sees the sender's batch in flight, and that
// posts after the receiver exited fail.
func TestCrossProcess(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	child := startChild(t)

	ready := child.expect(t, readyPrefix)
	f := strings.Fields(strings.TrimPrefix(ready, readyPrefix))
	if len(f) != 3 {
		t.Fatalf("bad READY line %q", ready)
	}
	addr := []byte(f[0])
	key, err := hex.DecodeString(f[1])
	if err != nil {
		t.Fatalf("READY key %q: %v", f[1], err)
	}
	n, _ := strconv.ParseUint(f[2], 10, 64)
	dst := rdma.RemoteRegion{Key: key, Len: n}

	a := shm.New()
	defer a.Close()
	ep, err := a.Connect(addr)
	if err != nil {
		t.Fatalf("Connect(%s): %v", addr, err)
	}
	defer ep.Close()
	srcRegion, _ := kvcache.NewHostRegion(n)
	src, err := a.Register(srcRegion)
	if err != nil {
		t.Fatal(err)
	}
	const seed = 42
	pattern(srcRegion.Bytes(), seed)

	// A forged key (one secret byte changed) is refused.
	bad := bytes.Clone(key)
	bad[len("SHK1")+1+16+16] ^= 0xFF
	err = ep.Post(rdma.Batch{Src: src, Dst: rdma.RemoteRegion{Key: bad, Len: n}, Segments: []kvcache.Segment{{Len: n}},
		Done: func(err error) { t.Errorf("Done(%v) for a forged key", err) }})
	if !errors.Is(err, rdma.ErrBadKey) {
		t.Fatalf("Post with a forged key: %v, want ErrBadKey", err)
	}

	// Batch A's Done blocks, so batch B stays in flight while the child
	// tries to deregister.
	segs := shuffledSegments(n)
	half := len(segs) / 2
	entered, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(unblock) }) }
	defer release()
	errs := make(chan error, 2)
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: segs[:half], Done: func(err error) {
		errs <- err
		close(entered)
		<-unblock
	}}); err != nil {
		t.Fatal(err)
	}
	wait(t, entered, "batch A's Done")
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: segs[half:], Done: func(err error) { errs <- err }}); err != nil {
		t.Fatal(err)
	}
	child.send(t, "DEREGISTER")
	if got := child.expect(t, "DEREGISTER "); got != "DEREGISTER busy" {
		t.Errorf("receiver's Deregister with batch B in flight: %q, want busy", got)
	}
	release()
	flushed := make(chan error, 1)
	ep.Flush(func(err error) { flushed <- err })
	if err := wait(t, flushed, "Flush"); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	for range 2 {
		if err := wait(t, errs, "Done"); err != nil {
			t.Fatalf("batch: %v", err)
		}
	}

	child.send(t, fmt.Sprintf("VERIFY %d", seed))
	if got := child.expect(t, ""); got != "VERIFIED" {
		t.Errorf("receiver: %q, want VERIFIED", got)
	}
	child.wait(t)

	// The receiver closed its agent and region and exited.
	err = ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: []kvcache.Segment{{Len: 1}},
		Done: func(err error) { t.Errorf("Done(%v) after the receiver exited", err) }})
	if !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Post after the receiver exited: %v, want ErrPeerGone", err)
	}
	if _, err := a.Connect(addr); !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Connect to the exited receiver: %v, want ErrPeerGone", err)
	}
}

// child is the re-executed receiver.
type child struct {
	cmd     *exec.Cmd
	stdin   *bufio.Writer
	closer  interface{ Close() error }
	lines   chan string
	stderr  *lockedBuffer
	exited  chan struct{} // closed once Wait returned exitErr
	exitErr error
}

func startChild(t *testing.T) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrossProcessChild$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	c := &child{cmd: cmd, lines: make(chan string, 16), stderr: &lockedBuffer{}, exited: make(chan struct{})}
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
		deadline := time.NewTimer(waitLimit)
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

// expect returns the child's next stdout line starting with prefix,
// skipping others, under the deadline.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("receiver exited before %q; stderr:\n%s", prefix, c.stderr)
			}
			if strings.HasPrefix(line, prefix) && !strings.HasPrefix(line, "=== ") {
				return line
			}
		case <-deadline.C:
			t.Fatalf("no %q from the receiver within %v; stderr:\n%s", prefix, waitLimit, c.stderr)
		}
	}
}

func (c *child) send(t *testing.T, line string) {
	t.Helper()
	if _, err := c.stdin.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.stdin.Flush(); err != nil {
		t.Fatalf("send %q: %v", line, err)
	}
}

// wait waits for the child to exit and fails t unless it exited 0.
func (c *child) wait(t *testing.T) {
	t.Helper()
	c.closer.Close()
	for line := range c.lines { // drain what is left
		t.Logf("receiver: %s", line)
	}
	wait(t, c.exited, "receiver exit")
	if c.exitErr != nil {
		t.Fatalf("receiver: %v; stderr:\n%s", c.exitErr, c.stderr)
	}
}

const waitLimit = 60 * time.Second

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("no %s within %v", what, waitLimit)
		panic("unreachable")
	}
}

// shuffledSegments covers [0, n) with segments of varied sizes in random
// order, each writing source offset = destination offset.
func shuffledSegments(n uint64) []kvcache.Segment {
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

func pattern(b []byte, seed uint64) {
	var s [32]byte
	s[0] = byte(seed)
	rand.NewChaCha8(s).Read(b)
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// lockedBuffer is a bytes.Buffer safe for the exec copier and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
