//go:build cgo && linux && !kvxfer_noucx

package ucx_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// childEnv makes the test binary, re-executed, act as the receiver;
// childAllocEnv makes it receive into memory from its agent's Alloc.
const (
	childEnv      = "KVXFER_UCX_CHILD"
	childAllocEnv = "KVXFER_UCX_CHILD_ALLOC"
)

// crossLen is the receiver's region size.
const crossLen = 8 << 20

// The receiver's protocol, one line each way:
//
//	child:  KVXFER-UCX READY <address hex> <key hex> <len>
//	parent: DEREGISTER           child: DEREGISTER busy|ok|<error>
//	parent: VERIFY <seed>        child: VERIFIED | MISMATCH <offset>
//
// then the child closes its agent and exits (0 when every step passed). A
// parent that kills the child just waits for READY.
const readyPrefix = "KVXFER-UCX READY "

// TestCrossProcessChild is the receiver; it does nothing unless re-executed
// by a cross-process test.
func TestCrossProcessChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as a cross-process test's child")
	}
	a := newAgent(t)
	var r *kvcache.Region
	var err error
	if os.Getenv(childAllocEnv) != "" {
		r, _, err = a.Alloc(crossLen) // freed by the agent's Close
	} else {
		r, err = kvcache.NewHostRegion(crossLen)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		r.Close()
	})
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	rr := reg.Remote()
	fmt.Printf("%s%s %s %d\n", readyPrefix, hex.EncodeToString(a.Address()), hex.EncodeToString(rr.Key), rr.Len)

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
			rdmatest.Pattern(want, seed)
			if i := rdmatest.FirstDiff(r.Bytes(), want); i >= 0 {
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
}

// remote is the child's READY line, parsed.
type remote struct {
	addr []byte
	dst  rdma.RemoteRegion
}

func parseReady(t *testing.T, line string) remote {
	t.Helper()
	f := strings.Fields(strings.TrimPrefix(line, readyPrefix))
	if len(f) != 3 {
		t.Fatalf("bad READY line %q", line)
	}
	addr, err1 := hex.DecodeString(f[0])
	key, err2 := hex.DecodeString(f[1])
	n, err3 := strconv.ParseUint(f[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatalf("READY line %q: %v", line, err)
	}
	return remote{addr: addr, dst: rdma.RemoteRegion{Key: key, Len: n}}
}

// TestCrossProcess re-executes the test binary as the receiver, writes a
// pattern into its region in shuffled segments, and has it check the
// bytes; on the way it checks that a forged key is refused across
// processes, that the receiver's Deregister sees the sender's batch in
// flight, and that posts and connects after the receiver closed fail with
// ErrPeerGone.
func TestCrossProcess(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	inMode(t, func(t *testing.T, _ string) {
		for _, alloc := range []bool{false, true} {
			t.Run(map[bool]string{false: "host", true: "alloc"}[alloc], func(t *testing.T) { crossProcess(t, alloc) })
		}
	})
}

func crossProcess(t *testing.T, alloc bool) {
	{
		child := startChild(t, alloc)
		rem := parseReady(t, child.Expect(t, readyPrefix))
		n := rem.dst.Len

		a := newAgent(t)
		defer a.Close()
		ep, err := a.Connect(rem.addr)
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		defer ep.Close()
		srcRegion, _ := kvcache.NewHostRegion(n)
		defer srcRegion.Close()
		src, err := a.Register(srcRegion)
		if err != nil {
			t.Fatal(err)
		}
		const seed = 42
		rdmatest.Pattern(srcRegion.Bytes(), seed)

		// A forged key (one byte of the packed rkey changed) is refused.
		bad := bytes.Clone(rem.dst.Key)
		bad[len(bad)-20] ^= 0xFF
		err = ep.Post(rdma.Batch{Src: src, Dst: rdma.RemoteRegion{Key: bad, Len: n}, Segments: []kvcache.Segment{{Len: n}},
			Done: func(err error) { t.Errorf("Done(%v) for a forged key", err) }})
		if !errors.Is(err, rdma.ErrBadKey) {
			t.Fatalf("Post with a forged key: %v, want ErrBadKey", err)
		}

		// Batch A's Done blocks, so batch B stays in flight while the
		// child tries to deregister.
		segs := rdmatest.ShuffledSegments(n)
		half := len(segs) / 2
		entered, unblock := make(chan struct{}), make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(unblock) }) }
		defer release()
		errs := make(chan error, 2)
		if err := ep.Post(rdma.Batch{Src: src, Dst: rem.dst, Segments: segs[:half], Done: func(err error) {
			errs <- err
			close(entered)
			<-unblock
		}}); err != nil {
			t.Fatal(err)
		}
		rdmatest.Recv(t, entered, "batch A's Done")
		if err := ep.Post(rdma.Batch{Src: src, Dst: rem.dst, Segments: segs[half:], Done: func(err error) { errs <- err }}); err != nil {
			t.Fatal(err)
		}
		child.Send(t, "DEREGISTER")
		if got := child.Expect(t, "DEREGISTER "); got != "DEREGISTER busy" {
			t.Errorf("receiver's Deregister with batch B in flight: %q, want busy", got)
		}
		release()
		flushed := make(chan error, 1)
		ep.Flush(func(err error) { flushed <- err })
		if err := rdmatest.Recv(t, flushed, "Flush"); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		for range 2 {
			if err := rdmatest.Recv(t, errs, "Done"); err != nil {
				t.Fatalf("batch: %v", err)
			}
		}

		child.Send(t, fmt.Sprintf("VERIFY %d", seed))
		if got := child.Expect(t, ""); got != "VERIFIED" {
			t.Errorf("receiver: %q, want VERIFIED", got)
		}
		child.Wait(t)

		// The receiver closed its agent (saying bye) and exited.
		err = ep.Post(rdma.Batch{Src: src, Dst: rem.dst, Segments: []kvcache.Segment{{Len: 1}},
			Done: func(err error) { t.Errorf("Done(%v) after the receiver exited", err) }})
		if !errors.Is(err, rdma.ErrPeerGone) {
			t.Errorf("Post after the receiver exited: %v, want ErrPeerGone", err)
		}
		if _, err := a.Connect(rem.addr); !errors.Is(err, rdma.ErrPeerGone) {
			t.Errorf("Connect to the exited receiver: %v, want ErrPeerGone", err)
		}
	}
}

// TestCrossProcessPeerKilled: the receiver is stopped, batches are posted
// into it, and it is killed (SIGKILL). Every batch completes exactly once,
// those that had not landed with ErrPeerGone; later posts are refused; the
// endpoint and agent close; no goroutine is left (TestMain). The error
// UCX reports on the link's control endpoint is no proof that the peer
// writes no more into this agent (docs/membership.md §4), and nothing
// here gives the agent the proof of its exit: the agent's Close says so
// (rdma.ErrCloseUnproven).
func TestCrossProcessPeerKilled(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	inMode(t, func(t *testing.T, tls string) {
		for _, alloc := range []bool{false, true} {
			t.Run(map[bool]string{false: "host", true: "alloc"}[alloc], func(t *testing.T) { peerKilled(t, tls, alloc) })
		}
	})
}

// peerKilled is TestCrossProcessPeerKilled into a receiver's Go memory, or
// into its Alloc'd memory: a shared-memory segment on this host, which the
// sender writes directly, so that writes land even while the receiver is
// stopped, and writes after it died may land in the segment the sender
// still maps until UCX notices.
func peerKilled(t *testing.T, tls string, alloc bool) {
	{
		child := startChild(t, alloc)
		rem := parseReady(t, child.Expect(t, readyPrefix))
		n := rem.dst.Len

		a := newAgent(t)
		defer a.Close()
		ep, err := a.Connect(rem.addr)
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
		srcRegion, _ := kvcache.NewHostRegion(n)
		defer srcRegion.Close()
		src, err := a.Register(srcRegion)
		if err != nil {
			t.Fatal(err)
		}
		// One round trip first, so that the endpoint is wired up.
		ch := make(chan error, 1)
		if err := ep.Post(rdma.Batch{Src: src, Dst: rem.dst, Segments: []kvcache.Segment{{Len: 4096}}, Done: func(err error) { ch <- err }}); err != nil {
			t.Fatal(err)
		}
		if err := rdmatest.Recv(t, ch, "first batch"); err != nil {
			t.Fatal(err)
		}

		child.Stop(t)
		const batches = 32
		var mu sync.Mutex
		calls := make([]int, batches)
		errs := make([]error, batches)
		killed := false
		afterKill := make([]bool, batches)
		all := make(chan struct{})
		total := 0
		segs := []kvcache.Segment{{Src: 0, Dst: 0, Len: n / 4}, {Src: n / 4, Dst: n / 4, Len: n / 4},
			{Src: n / 2, Dst: n / 2, Len: n / 4}, {Src: 3 * n / 4, Dst: 3 * n / 4, Len: n / 4}}
		for i := range batches {
			if err := ep.Post(rdma.Batch{Src: src, Dst: rem.dst, Segments: segs, Done: func(err error) {
				mu.Lock()
				defer mu.Unlock()
				calls[i]++
				errs[i] = err
				afterKill[i] = killed
				if total++; total == batches {
					close(all)
				}
			}}); err != nil {
				t.Fatalf("Post %d into the stopped receiver: %v", i, err)
			}
		}
		// Give the progress goroutine time to put the batches on the wire
		// (a scenario, not a wait for a condition).
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		killed = true
		before := total
		mu.Unlock()
		if err := child.Process().Kill(); err != nil {
			t.Fatal(err)
		}
		child.Reap(t)
		start := time.Now()
		rdmatest.Recv(t, all, "every batch's Done after the kill")
		t.Logf("%d of %d batches had completed before the kill; the rest completed within %v of it", before, batches, time.Since(start).Round(time.Millisecond))

		mu.Lock()
		failed := 0
		for i := range batches {
			switch {
			case calls[i] != 1:
				t.Errorf("batch %d: Done called %d times", i, calls[i])
			case errs[i] != nil && !errors.Is(errs[i], rdma.ErrPeerGone):
				t.Errorf("batch %d: Done(%v), want ErrPeerGone", i, errs[i])
			case errs[i] == nil && afterKill[i] && (tls == "tcp" || !alloc):
				// Into an Alloc'd segment over shared memory the sender
				// writes alone: a batch still being copied when the kill
				// came (a loaded machine) lands in the segment it maps.
				t.Errorf("batch %d: Done(nil) after the receiver was killed", i)
			}
			if errs[i] != nil {
				failed++
			}
		}
		mu.Unlock()
		t.Logf("%d of %d batches failed with ErrPeerGone", failed, batches)
		if (tls == "tcp" || !alloc) && failed != batches {
			t.Errorf("into a stopped receiver that must progress to take writes, %d of %d batches succeeded", batches-failed, batches)
		}

		// Later posts are refused (once UCX noticed; until then an
		// accepted one fails).
		deadline := time.Now().Add(rdmatest.WaitLimit)
		for {
			done := make(chan error, 1)
			err := ep.Post(rdma.Batch{Src: src, Dst: rem.dst, Segments: segs[:1], Done: func(err error) { done <- err }})
			if err != nil {
				if !errors.Is(err, rdma.ErrPeerGone) {
					t.Errorf("Post after the kill: %v, want ErrPeerGone", err)
				}
				break
			}
			if err := rdmatest.Recv(t, done, "Done of a post after the kill"); !errors.Is(err, rdma.ErrPeerGone) && (err != nil || !alloc || tls == "tcp") {
				t.Fatalf("a post accepted after the kill: Done(%v), want ErrPeerGone", err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("posts still accepted %v after the kill", rdmatest.WaitLimit)
			}
			time.Sleep(10 * time.Millisecond)
		}
		flushed := make(chan error, 1)
		ep.Flush(func(err error) { flushed <- err })
		if err := rdmatest.Recv(t, flushed, "Flush"); !errors.Is(err, rdma.ErrPeerGone) {
			t.Errorf("Flush after the kill: %v, want ErrPeerGone", err)
		}
		// Batches that the failure of the link or of their own endpoint
		// cut on the wire may still land as far as this agent knows (no
		// proof of the peer's exit reaches it here): then Close says so.
		closed := make(chan error, 1)
		go func() { closed <- ep.Close() }()
		if err := rdmatest.Recv(t, closed, "endpoint Close"); err != nil && !errors.Is(err, rdma.ErrCloseUnproven) {
			t.Errorf("endpoint Close: %v, want nil or ErrCloseUnproven", err)
		}
		go func() { closed <- a.Close() }()
		if err := rdmatest.Recv(t, closed, "agent Close"); !errors.Is(err, rdma.ErrCloseUnproven) {
			t.Errorf("agent Close after the peer's link failed on an endpoint error: %v, want ErrCloseUnproven", err)
		}
	}
}

// startChild starts the receiver, allocating its region with Alloc when
// alloc is set.
func startChild(t *testing.T, alloc bool) *rdmatest.Child {
	env := []string{childEnv + "=1"}
	if alloc {
		env = append(env, childAllocEnv+"=1")
	}
	return rdmatest.StartChild(t, "TestCrossProcessChild", env...)
}

// TestCrossProcessCloseStalledPeer: over tcp the receiver must progress to
// take writes and to acknowledge their flush. With the receiver stopped
// (SIGSTOP) and batches on the wire, Close waits for the close timeout,
// forces the endpoint closed and says that this proves nothing
// (rdma.ErrCloseUnproven): the receiver may apply what reached its socket
// once it runs again, and its Deregister of the region is refused busy. A
// Close whose writes were acknowledged returns nil.
func TestCrossProcessCloseStalledPeer(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	t.Setenv("UCX_TLS", "tcp")
	usable(t, "tcp")
	child := startChild(t, false)
	rem := parseReady(t, child.Expect(t, readyPrefix))
	n := rem.dst.Len

	a, err := ucx.New(ucx.WithCloseTimeout(300 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	srcRegion, _ := kvcache.NewHostRegion(n)
	defer srcRegion.Close()
	src, err := a.Register(srcRegion)
	if err != nil {
		t.Fatal(err)
	}
	post := func(ep rdma.Endpoint, done chan error) {
		t.Helper()
		if err := ep.Post(rdma.Batch{Src: src, Dst: rem.dst, Segments: []kvcache.Segment{{Len: n}},
			Done: func(err error) { done <- err }}); err != nil {
			t.Fatal(err)
		}
	}

	// Acknowledged writes: Close proves them.
	ep, err := a.Connect(rem.addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 8)
	post(ep, done)
	if err := rdmatest.Recv(t, done, "a batch into the running receiver"); err != nil {
		t.Fatal(err)
	}
	if err := ep.Close(); err != nil {
		t.Fatalf("Close after every write completed: %v, want nil", err)
	}

	ep, err = a.Connect(rem.addr)
	if err != nil {
		t.Fatal(err)
	}
	post(ep, done) // wires the new endpoint up before the receiver stops
	if err := rdmatest.Recv(t, done, "the second endpoint's first batch"); err != nil {
		t.Fatal(err)
	}
	child.Stop(t)
	defer child.Reap(t)
	defer child.Process().Kill()
	const batches = 8 // 64 MiB: more than the sockets hold
	for range batches {
		post(ep, done)
	}
	// Close refuses the batches still queued for the wire (rightly
	// returning nil for them): wait until they are all on it.
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for !ucx.OnTheWire(ep) {
		if time.Now().After(deadline) {
			t.Fatalf("batches not handed to UCX within %v", rdmatest.WaitLimit)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	closed := make(chan error, 1)
	go func() { closed <- ep.Close() }()
	if err := rdmatest.Recv(t, closed, "Close of the endpoint into the stopped receiver"); !errors.Is(err, rdma.ErrCloseUnproven) || !errors.Is(err, rdma.ErrSourcesReleased) {
		t.Fatalf("Close with writes cut on the wire: %v, want rdma.ErrCloseUnproven and, its forced close completed, rdma.ErrSourcesReleased", err)
	}
	for range batches {
		if err := rdmatest.Recv(t, done, "Done after the close"); !errors.Is(err, rdma.ErrEndpointClosed) || !errors.Is(err, rdma.ErrCloseUnproven) {
			t.Fatalf("a batch cut by the close: Done(%v), want ErrEndpointClosed and ErrCloseUnproven", err)
		}
	}
	// The cut writes may still land in the receiver's region once it
	// runs again: they stay counted against it, so that the receiver's
	// revoke is answered busy and its Deregister refuses (the region
	// stays mapped) rather than succeed while they may land.
	if err := child.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	child.Send(t, "DEREGISTER")
	if got := child.Expect(t, "DEREGISTER "); got != "DEREGISTER busy" {
		t.Fatalf("the receiver's Deregister after the sender's writes into it were cut unproven: %q, want busy", got)
	}
}

// TestDeregisterByHonoursTheCallersDeadline: with a peer that stops
// answering (SIGSTOP) and an hour's revoke timeout, DeregisterBy returns
// by the caller's deadline, the region busy (still mapped), naming the
// deadline; once the peer runs again, deregistration succeeds.
func TestDeregisterByHonoursTheCallersDeadline(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	t.Setenv("UCX_TLS", "tcp")
	usable(t, "tcp")
	child := startChild(t, false)
	rem := parseReady(t, child.Expect(t, readyPrefix))
	a, err := ucx.New(ucx.WithRevokeTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Connect(rem.addr); err != nil {
		t.Fatal(err)
	}
	r, _ := kvcache.NewHostRegion(1 << 20)
	defer r.Close()
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	child.Stop(t)
	defer child.Reap(t)
	defer child.Process().Kill()
	done := make(chan error, 1)
	go func() { done <- a.DeregisterBy(reg, time.Now().Add(200*time.Millisecond)) }()
	select {
	case err := <-done:
		if !errors.Is(err, rdma.ErrRegionBusy) || !strings.Contains(err.Error(), "did not answer within the caller's deadline") {
			t.Fatalf("DeregisterBy with the peer stopped: %v, want ErrRegionBusy naming the caller's deadline", err)
		}
	case <-time.After(rdmatest.WaitLimit):
		t.Fatal("DeregisterBy waited past its deadline for a stopped peer (the revoke timeout, an hour)")
	}
	if err := child.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for {
		err := a.DeregisterBy(reg, time.Now().Add(rdmatest.WaitLimit))
		if err == nil {
			break
		}
		if !errors.Is(err, rdma.ErrRegionBusy) || time.Now().After(deadline) {
			t.Fatalf("DeregisterBy once the peer runs again: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // poll with a deadline
	}
}

// TestDeregisterDoesNotWaitForASilentPeer: a peer that stops answering
// (SIGSTOP) fails the first deregistration by the revoke timeout, and the
// next at once, naming the silence: the registrations stay mapped, as the
// timeout decides, but a pool of several is not a minute of timeouts to
// close. Once the peer runs again and answers, deregistrations wait for
// it and succeed.
func TestDeregisterDoesNotWaitForASilentPeer(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	t.Setenv("UCX_TLS", "tcp")
	usable(t, "tcp")
	child := startChild(t, false)
	rem := parseReady(t, child.Expect(t, readyPrefix))

	a, err := ucx.New(ucx.WithRevokeTimeout(200 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Connect(rem.addr); err != nil {
		t.Fatal(err)
	}
	var regs []rdma.Registration
	for range 2 {
		r, _ := kvcache.NewHostRegion(1 << 20)
		defer r.Close()
		reg, err := a.Register(r)
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, reg)
	}
	child.Stop(t)
	defer child.Reap(t)
	defer child.Process().Kill()
	if err := a.Deregister(regs[0]); !errors.Is(err, rdma.ErrRegionBusy) || !strings.Contains(err.Error(), "did not answer within") {
		t.Fatalf("Deregister with the peer stopped: %v, want ErrRegionBusy, the peer did not answer", err)
	}
	if err := a.Deregister(regs[1]); !errors.Is(err, rdma.ErrRegionBusy) || !strings.Contains(err.Error(), "is silent") {
		t.Fatalf("Deregister with the peer still stopped: %v, want ErrRegionBusy at once, naming the peer's silence", err)
	}
	if err := child.Process().Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for _, reg := range regs {
		for {
			err := a.Deregister(reg)
			if err == nil {
				break
			}
			if !errors.Is(err, rdma.ErrRegionBusy) || time.Now().After(deadline) {
				t.Fatalf("Deregister once the peer runs again: %v", err)
			}
			time.Sleep(10 * time.Millisecond) // poll with a deadline
		}
	}
}

// TestCloseWithAStoppedPeerKeepsMemory: an agent whose linked peer is
// stopped (SIGSTOP) gets no acknowledgement of its bye within the revoke
// timeout. Nothing then proves the peer's writes into this agent's memory
// over (a peer of this host writes by address over cma, and a stopped one
// resumes): Close must say so (rdma.ErrCloseUnproven) and leave the memory
// it allocated mapped, rather than return nil and unmap it. Before the
// fix, Close returned nil and unmapped the allocation.
func TestCloseWithAStoppedPeerKeepsMemory(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	t.Setenv("UCX_TLS", "tcp")
	usable(t, "tcp")
	child := startChild(t, false)
	rem := parseReady(t, child.Expect(t, readyPrefix))
	a, err := ucx.New(ucx.WithRevokeTimeout(200*time.Millisecond), ucx.WithCloseTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := a.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(r); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Connect(rem.addr); err != nil {
		t.Fatal(err)
	}
	child.Stop(t)
	defer child.Reap(t)
	defer child.Process().Kill()
	err = a.Close()
	if !errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), "did not acknowledge") {
		t.Errorf("Close with the peer stopped: %v, want an error wrapping ErrCloseUnproven naming the unacknowledged bye", err)
	}
	// msync fails with ENOMEM on a range that is not mapped.
	if err := unix.Msync(r.Bytes(), unix.MS_ASYNC); err != nil {
		t.Errorf("the allocation after Close with the peer's bye unacknowledged: msync: %v (unmapped while the peer may still write into it)", err)
	}
}

// TestUnansweredHelloProvesNothing: a peer stopped (SIGSTOP) before it
// answers this agent's hello fails the Connect by the handshake timeout.
// That is a timeout, not proof that the peer writes no more into this
// agent's memory: once it runs again it takes the hello, brings its side
// of the link up, and may write with the keys it holds. So a
// deregistration that waited for the peer's answer to its revoke when
// the timeout came, and one started after, fail busy (the registration
// stays mapped), and Close returns rdma.ErrCloseUnproven naming the peer
// and leaves the memory it allocated mapped. Before the fix, the
// timeout let both deregistrations unmap their registration and Close
// return nil and unmap the allocation.
func TestUnansweredHelloProvesNothing(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	t.Setenv("UCX_TLS", "tcp")
	usable(t, "tcp")
	child := startChild(t, false)
	rem := parseReady(t, child.Expect(t, readyPrefix))
	child.Stop(t)
	defer child.Reap(t)
	defer child.Process().Kill()

	// The revoke timeout is an hour: only the handshake's ends the wait.
	a, err := ucx.New(ucx.WithHandshakeTimeout(2*time.Second), ucx.WithRevokeTimeout(time.Hour), ucx.WithCloseTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			a.Close()
		}
	}()
	r, _, err := a.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := kvcache.NewHostRegion(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	var regs []rdma.Registration
	for _, region := range []*kvcache.Region{r, r2} {
		reg, err := a.Register(region)
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, reg)
	}
	connected := make(chan error, 1)
	go func() {
		_, err := a.Connect(rem.addr)
		connected <- err
	}()
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for ucx.Connecting(a) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no link waits for the peer's answer within %v", rdmatest.WaitLimit)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	// Asks the peer, which is connecting, to revoke; the handshake's
	// timeout ends the wait (were the timeout first, the link failed:
	// the same as the second deregistration below).
	deregistered := make(chan error, 1)
	go func() { deregistered <- a.Deregister(regs[0]) }()
	if err := rdmatest.Recv(t, connected, "Connect to the stopped peer"); !errors.Is(err, rdma.ErrPeerGone) || !strings.Contains(err.Error(), "did not answer the hello") {
		t.Fatalf("Connect to the stopped peer: %v, want ErrPeerGone, the hello unanswered", err)
	}
	if err := rdmatest.Recv(t, deregistered, "Deregister waiting for the unanswered peer"); !errors.Is(err, rdma.ErrRegionBusy) || !strings.Contains(err.Error(), "without proof") {
		t.Errorf("Deregister waiting for a peer whose hello went unanswered: %v, want ErrRegionBusy, its link failed without proof", err)
	}
	if err := a.Deregister(regs[1]); !errors.Is(err, rdma.ErrRegionBusy) || !strings.Contains(err.Error(), "without proof") {
		t.Errorf("Deregister after the peer's hello went unanswered: %v, want ErrRegionBusy, its link failed without proof", err)
	}
	closed = true
	err = a.Close()
	if !errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), "did not answer the hello") {
		t.Errorf("Close after the peer's hello went unanswered: %v, want an error wrapping ErrCloseUnproven naming the unanswered hello", err)
	}
	// msync fails with ENOMEM on a range that is not mapped.
	if err := unix.Msync(r.Bytes(), unix.MS_ASYNC); err != nil {
		t.Errorf("the allocation after Close with the peer's hello unanswered: msync: %v (unmapped while the peer may still write into it)", err)
	}
}

// TestCloseWithAHelloUnansweredKeepsMemory: an agent closed while its
// hello to a stopped peer (SIGSTOP) is still unanswered (the handshake
// timeout an hour) cannot tell whether the peer took it — and, once it
// runs again, brings its side of the link up and writes. Close must say
// so (rdma.ErrCloseUnproven) and leave the memory it allocated mapped.
// Before the fix, Close returned nil and unmapped the allocation.
func TestCloseWithAHelloUnansweredKeepsMemory(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	t.Setenv("UCX_TLS", "tcp")
	usable(t, "tcp")
	child := startChild(t, false)
	rem := parseReady(t, child.Expect(t, readyPrefix))
	child.Stop(t)
	defer child.Reap(t)
	defer child.Process().Kill()

	a, err := ucx.New(ucx.WithHandshakeTimeout(time.Hour), ucx.WithCloseTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := a.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	connected := make(chan error, 1)
	go func() {
		_, err := a.Connect(rem.addr)
		connected <- err
	}()
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for ucx.Connecting(a) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no link waits for the peer's answer within %v", rdmatest.WaitLimit)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	err = a.Close()
	if !errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), "never answered this agent's hello") {
		t.Errorf("Close with a hello unanswered: %v, want an error wrapping ErrCloseUnproven naming the unanswered hello", err)
	}
	if err := rdmatest.Recv(t, connected, "Connect cut by Close"); !errors.Is(err, rdma.ErrAgentClosed) {
		t.Errorf("Connect cut by Close: %v, want ErrAgentClosed", err)
	}
	// msync fails with ENOMEM on a range that is not mapped.
	if err := unix.Msync(r.Bytes(), unix.MS_ASYNC); err != nil {
		t.Errorf("the allocation after Close with a hello unanswered: msync: %v (unmapped while the peer may still write into it)", err)
	}
}
