package shm_test

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
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
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
	child := rdmatest.StartChild(t, "TestCrossProcessChild", childEnv+"=1")

	ready := child.Expect(t, readyPrefix)
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
	rdmatest.Pattern(srcRegion.Bytes(), seed)

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
	segs := rdmatest.ShuffledSegments(n)
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
	rdmatest.Recv(t, entered, "batch A's Done")
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: segs[half:], Done: func(err error) { errs <- err }}); err != nil {
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
