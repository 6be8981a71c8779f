package cudaipc_test

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

// childEnv makes the test binary, re-executed, act as the receiver.
const childEnv = "KVXFER_CUDAIPC_CHILD"

// identityEnv is the identity the receiver's agent serves.
const identityEnv = "KVXFER_CUDAIPC_IDENTITY"

// crossLen is the receiver's region size; crossOff its offset in the
// allocation.
const crossLen, crossOff = 8 << 20, 4096

// The receiver's protocol, one line each way:
//
//	child:  READY <address> <key hex> <len>
//	parent: DEREGISTER           child: DEREGISTER busy|ok|<error>
//	parent: VERIFY <seed>        child: VERIFIED | MISMATCH <offset>
//
// VERIFY deregisters first; then the child closes its agent and exits.
const readyPrefix = "KVXFER-CUDAIPC READY "

// TestCrossProcessChild is the receiver; it does nothing unless
// re-executed by TestCrossProcess.
func TestCrossProcessChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as TestCrossProcess's child")
	}
	d := gpu(t)
	m := devMem(t, d, crossLen+2*crossOff, 0)
	a := agent(t, cudaipc.WithIdentity(os.Getenv(identityEnv)))
	defer a.Close() // before VERIFY returns: the agent closes before the memory is freed
	reg, err := a.Register(region(t, m, crossOff, crossLen))
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
			seed, _ := strconv.ParseUint(arg, 10, 8)
			if err := a.Deregister(reg); err != nil {
				fmt.Println("MISMATCH deregister:", err)
				return
			}
			got := read(t, d, m.Ptr(), crossLen+2*crossOff)
			want := pattern(crossLen+2*crossOff, 0)
			copy(want[crossOff:crossOff+crossLen], pattern(crossLen, byte(seed)))
			if i := rdmatest.FirstDiff(got, want); i >= 0 {
				fmt.Println("MISMATCH", i)
				return
			}
			fmt.Println("VERIFIED")
			return
		}
	}
}

// TestCrossProcess: a receiver process registers a region inside a device
// allocation; this process maps it through its IPC handle and writes it in
// shuffled batches. While a batch is pending, the receiver's Deregister is
// refused as busy; once flushed, the receiver finds every byte, and the
// bytes around its region untouched. After the receiver exited, posts fail
// with ErrPeerGone. The endpoint reports the identity the receiver's agent
// was given (its agent file's).
func TestCrossProcess(t *testing.T) {
	requireGPU(t)
	const serves = "gen/7"
	child := rdmatest.StartChild(t, "TestCrossProcessChild", childEnv+"=1", identityEnv+"="+serves)
	f := strings.Fields(strings.TrimPrefix(child.Expect(t, readyPrefix), readyPrefix))
	if len(f) != 3 {
		t.Fatalf("bad READY line %q", f)
	}
	key, _ := hex.DecodeString(f[1])
	n, _ := strconv.ParseUint(f[2], 10, 64)
	dst := rdma.RemoteRegion{Key: key, Len: n}

	d := gpu(t)
	const seed = 9
	sm := devMem(t, d, crossLen, seed)
	a := agent(t)
	src, err := a.Register(region(t, sm, 0, crossLen))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := a.Connect([]byte(f[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	if got := ep.(rdma.IdentifiedEndpoint).PeerIdentity(); got != serves {
		t.Errorf("the endpoint to the receiver's agent (another process) reports identity %q, want %q", got, serves)
	}

	// Batch A blocks in its Done, so batch B stays pending behind it.
	const chunk = 256 << 10
	entered, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(unblock) }) }
	defer release()
	first := []kvcache.Segment{{Src: 0, Dst: 0, Len: chunk}}
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: first, Done: func(err error) {
		if err != nil {
			t.Errorf("batch A: %v", err)
		}
		close(entered)
		<-unblock
	}}); err != nil {
		t.Fatal(err)
	}
	<-entered
	var segs []kvcache.Segment
	for off := uint64(chunk); off < crossLen; off += chunk {
		segs = append(segs, kvcache.Segment{Src: off, Dst: off, Len: chunk})
	}
	for i := range segs { // a fixed shuffle
		j := (i * 7919) % len(segs)
		segs[i], segs[j] = segs[j], segs[i]
	}
	failed := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: segs, Done: func(err error) {
		if err != nil {
			failed <- err
		}
	}}); err != nil {
		t.Fatal(err)
	}
	child.Send(t, "DEREGISTER")
	if got := child.Expect(t, "DEREGISTER "); got != "DEREGISTER busy" {
		t.Errorf("receiver's Deregister with a batch pending: %q, want busy", got)
	}
	release()
	flushed := make(chan error, 1)
	ep.Flush(func(err error) { flushed <- err })
	if err := wait(t, flushed, "Flush"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		t.Fatalf("batch B: %v", err)
	default:
	}
	child.Send(t, fmt.Sprintf("VERIFY %d", seed))
	if got := child.Expect(t, ""); got != "VERIFIED" {
		t.Fatalf("receiver: %s", got)
	}
	child.Wait(t)
	err = ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: first, Done: func(error) { t.Error("Done of a refused post") }})
	if !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Post after the receiver exited: %v, want ErrPeerGone", err)
	}
	if _, err := a.Connect([]byte(f[0])); !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Connect after the receiver exited: %v, want ErrPeerGone", err)
	}
}

// TestRefusedKeyMapsNothing: a key of the receiver (another process) with
// the right control file and table but a wrong secret, or whose control
// file names another owner, is refused by Post with ErrBadKey naming what
// was wrong — and leaves nothing behind: no mapping of the receiver's
// allocations, no slot of MaxPeerRegistrations. Before the fix the
// endpoint mapped the control file, opened every allocation of its table
// and kept them (until it closed) before it checked the owner and the
// secret. The true key still works, and a wrong secret after it still is
// refused.
func TestRefusedKeyMapsNothing(t *testing.T) {
	requireGPU(t)
	child := rdmatest.StartChild(t, "TestCrossProcessChild", childEnv+"=1")
	f := strings.Fields(strings.TrimPrefix(child.Expect(t, readyPrefix), readyPrefix))
	if len(f) != 3 {
		t.Fatalf("bad READY line %q", f)
	}
	key, _ := hex.DecodeString(f[1])
	n, _ := strconv.ParseUint(f[2], 10, 64)

	d := gpu(t)
	sm := devMem(t, d, crossLen, 5)
	a := agent(t)
	src, err := a.Register(region(t, sm, 0, crossLen))
	if err != nil {
		t.Fatal(err)
	}
	base := cudaipc.ImportRefs()
	ep, err := a.Connect([]byte(f[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ep.Close(); err != nil {
			t.Error(err)
		}
		if got := cudaipc.ImportRefs(); got != base {
			t.Errorf("%d mappings left after Close", got-base)
		}
	}()
	seg := []kvcache.Segment{{Src: 0, Dst: 0, Len: 4096}}
	post := func(key []byte, done func(error)) error {
		return ep.Post(rdma.Batch{Src: src, Dst: rdma.RemoteRegion{Key: key, Len: n}, Segments: seg, Done: done})
	}
	noDone := func(error) { t.Error("Done of a refused post") }
	holds := func(what string, refs, targets int) {
		t.Helper()
		if got := cudaipc.ImportRefs() - base; got != refs {
			t.Errorf("%s: %d mappings of the receiver's allocations, want %d", what, got, refs)
		}
		if got := cudaipc.PeerTargets(ep); got != targets {
			t.Errorf("%s: the endpoint holds %d peer registrations, want %d", what, got, targets)
		}
	}

	wrongSecret := cudaipc.ForgeSecret(key)
	if err := post(wrongSecret, noDone); !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), "secret") {
		t.Errorf("a key with a wrong secret: Post = %v, want ErrBadKey naming the secret", err)
	} else {
		t.Logf("wrong secret: %v", err)
	}
	holds("after a key with a wrong secret", 0, 0)

	wrongOwner, remove, err := cudaipc.ForgeOwner(key)
	if err != nil {
		t.Fatal(err)
	}
	err = post(wrongOwner, noDone)
	if rerr := remove(); rerr != nil {
		t.Error(rerr)
	}
	if !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), "owner") {
		t.Errorf("a key whose control file names another owner: Post = %v, want ErrBadKey naming the owner", err)
	} else {
		t.Logf("wrong owner: %v", err)
	}
	holds("after a key whose control file names another owner", 0, 0)

	done := make(chan error, 1)
	if err := post(key, func(err error) { done <- err }); err != nil {
		t.Fatalf("the true key after refused ones: %v", err)
	}
	if err := wait(t, done, "the batch"); err != nil {
		t.Fatalf("the true key after refused ones: %v", err)
	}
	holds("after the true key", 1, 1)
	if err := post(wrongSecret, noDone); !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), "secret") {
		t.Errorf("a key with a wrong secret, its region mapped: Post = %v, want ErrBadKey naming the secret", err)
	}
	holds("after a wrong secret, the region mapped", 1, 1)
}

// TestPostToAnExitedReceiver: a receiver killed mid-run (no Close: its
// control file still says it is open) and not yet reaped by its parent —
// its pid still names a process, a zombie — is gone for a writer's Post:
// its allocations died with it. The endpoint watches the process it
// connected to (a pidfd), not whatever holds its pid now; with a check of
// the pid alone ("a process exists"), the Post below succeeds.
func TestPostToAnExitedReceiver(t *testing.T) {
	requireGPU(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrossProcessChild$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
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
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
		// A killed receiver leaves its agent file and control files.
		for _, pat := range []string{fmt.Sprintf("kvxfer-cudaipc-agent-%d-*", pid), fmt.Sprintf("kvxfer-cudaipc-%d-*", pid)} {
			left, _ := filepath.Glob(filepath.Join(cudaipc.Dir(), pat))
			for _, p := range left {
				os.Remove(p)
			}
		}
	})
	lines := bufio.NewScanner(out)
	var ready string
	for ready == "" && lines.Scan() {
		if l := lines.Text(); strings.HasPrefix(l, readyPrefix) {
			ready = strings.TrimPrefix(l, readyPrefix)
		}
	}
	f := strings.Fields(ready)
	if len(f) != 3 {
		t.Fatalf("bad or no READY line %q (%v)", ready, lines.Err())
	}
	key, _ := hex.DecodeString(f[1])
	n, _ := strconv.ParseUint(f[2], 10, 64)
	dst := rdma.RemoteRegion{Key: key, Len: n}

	d := gpu(t)
	sm := devMem(t, d, crossLen, 3)
	a := agent(t)
	src, err := a.Register(region(t, sm, 0, crossLen))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := a.Connect([]byte(f[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	seg := []kvcache.Segment{{Src: 0, Dst: 0, Len: 4096}}
	done := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: seg, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done, "the first batch"); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Until it has exited, without reaping it (WNOWAIT): a zombie.
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the killed receiver, not reaped, is no zombie: kill(%d, 0): %v", pid, err)
	}
	err = ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: seg, Done: func(error) { t.Error("Done of a refused post") }})
	if !errors.Is(err, rdma.ErrPeerGone) {
		t.Fatalf("Post to a receiver that exited (a zombie, pid %d): %v, want ErrPeerGone", pid, err)
	}
}
