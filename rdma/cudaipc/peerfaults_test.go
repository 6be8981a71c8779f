package cudaipc_test

// A control file truncated under the writer (the peer's) and under its
// owner (its own, by a peer holding the key), a batch only partly enqueued
// whose end is unproven, a Deregister racing a Post of the same source,
// and a mapping shared by the endpoints of two agents: each test below
// failed before its fix (SIGBUS or SIGSEGV killing the process; leases
// released, so Deregister succeeded while a copy could still land; a
// mapping left open for the life of the process).
// TestCloseUnprovenWhenSyncFails checks that a whole unproven batch keeps
// its leases.

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/cudatest"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

// onFakeDriver runs the tests matching run on the fake driver in a child
// (as TestFakeDriver does), failing t with the child's output unless
// each test in names passed.
func onFakeDriver(t *testing.T, run string, names []string, env ...string) {
	t.Helper()
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		t.Skipf("the driver under test is chosen already ($%s=%s)", cuda.LibraryEnv, p)
	}
	out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, run, env...)
	for _, n := range names {
		if !strings.Contains(out, "--- PASS: "+n+" ") {
			t.Fatalf("%s on the fake driver did not pass (%v):\n%s", n, err, out)
		}
	}
}

// controlFileOf names the control file a key names (key layout: "CIK2"
// owner[16] pid[4] fileID[16] ...).
func controlFileOf(key []byte) string {
	pid := binary.BigEndian.Uint32(key[20:24])
	return filepath.Join(cudaipc.Dir(), fmt.Sprintf("kvxfer-cudaipc-%d-%s", pid, hex.EncodeToString(key[24:40])))
}

// TestTruncatedControlFile: the owner of a region (the peer the
// writer copies to) truncates its control file after the writer mapped
// its header. The writer's next Post to that region reads the lease in
// the mapping (acquireRemote) and dies of SIGBUS: a peer's file aborts
// the writer. Post should refuse the batch and the writer live on.
func TestTruncatedControlFile(t *testing.T) {
	onFakeDriver(t, "^TestTruncatedControlFileParent$", []string{"TestTruncatedControlFileParent"})
}

const truncChildEnv = "KVXFER_CUDAIPC_TRUNC_CHILD"

// TestTruncatedControlFileParent runs the writer in a child, so
// that its death is seen.
func TestTruncatedControlFileParent(t *testing.T) {
	requireGPU(t)
	child := rdmatest.StartChild(t, "TestTruncatedControlFileChild", truncChildEnv+"=1")
	got := child.Expect(t, "SURVIVED")
	t.Log(got)
	child.Wait(t) // exits 0 only if the owner's own Close survived the truncated file too
}

func TestTruncatedControlFileChild(t *testing.T) {
	if os.Getenv(truncChildEnv) == "" {
		t.Skip("runs only as TestTruncatedControlFileParent's child")
	}
	d := gpu(t)
	const n = 1 << 16
	sm, dm := devMem(t, d, n, 1), devMem(t, d, n, 2)
	s := agent(t)
	// The owner: a peer that opened its control file through the key
	// can truncate it too; its own Close must survive that (checked below).
	r, err := cudaipc.New()
	if err != nil {
		t.Fatal(err)
	}
	src, dst, ep := linked(t, s, r, sm, dm, n)
	defer ep.Close()
	post := func() error {
		done := make(chan error, 1)
		if err := ep.Post(rdma.Batch{Src: src, Dst: dst.Remote(), Segments: []kvcache.Segment{{Len: 4096}}, Done: func(err error) { done <- err }}); err != nil {
			return err
		}
		return wait(t, done, "Done")
	}
	if err := post(); err != nil {
		t.Fatal(err)
	}
	// The owner shrinks its control file under the writer's mapping.
	if err := os.Truncate(controlFileOf(dst.Remote().Key), 0); err != nil {
		t.Fatal(err)
	}
	err = post()
	if !errors.Is(err, rdma.ErrPeerGone) {
		t.Fatalf("post after the control file was truncated: %v, want rdma.ErrPeerGone", err)
	}
	if err2 := post(); !errors.Is(err2, rdma.ErrPeerGone) { // without touching the mapping again
		t.Fatalf("second post: %v, want rdma.ErrPeerGone", err2)
	}
	// The owner's Deregister cannot know whether a batch still uses the
	// region (its count went with the file): busy; its Close names the
	// fault.
	if derr := r.Deregister(dst); !errors.Is(derr, rdma.ErrRegionBusy) {
		t.Fatalf("the owner's Deregister of a region whose control file was truncated: %v, want rdma.ErrRegionBusy", derr)
	}
	if cerr := ep.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if cerr := r.Close(); !errors.Is(cerr, rdma.ErrPeerGone) {
		t.Fatalf("the owner's Close over its truncated control file: %v, want rdma.ErrPeerGone naming the fault", cerr)
	}
	fmt.Printf("SURVIVED %v\n", err)
}

// TestImportOutlivesItsAgent: the process's mappings of a peer's
// allocations (imports) are shared by every agent of the process on the
// same GPU ordinal, but each keeps the *cuda.Device of the agent that
// opened it first. When that agent closes (its Device closed), the other
// agent's endpoint, closing later, cannot unmap it: CloseIPC on the
// closed Device fails, the endpoint's Close returns that error and the
// mapping of the peer's allocation is never closed (it pins the peer's
// memory for the life of the process).
func TestImportOutlivesItsAgent(t *testing.T) {
	onFakeDriver(t, "^TestImportOutlivesParent$", []string{"TestImportOutlivesParent"})
}

func TestImportOutlivesParent(t *testing.T) {
	requireGPU(t)
	base := cudaipc.ImportRefs()
	child := rdmatest.StartChild(t, "TestSpansCrossProcessChild", spansChildEnv+"=1")
	f := strings.Fields(strings.TrimPrefix(child.Expect(t, spansReady), spansReady))
	key, _ := hex.DecodeString(f[1])
	var n uint64
	var e0 cudaipc.Span
	fmt.Sscan(f[2], &n)
	fmt.Sscanf(strings.Split(f[3], ",")[0], "%d:%d", &e0.Off, &e0.Len)
	d := gpu(t)
	post := func(a *cudaipc.Agent) rdma.Endpoint {
		src := sourceOver(t, d, a, n, n, 1)
		ep, err := a.Connect([]byte(f[0]))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		if err := ep.Post(rdma.Batch{Src: src, Dst: rdma.RemoteRegion{Key: key, Len: n},
			Segments: []kvcache.Segment{{Src: 0, Dst: e0.Off, Len: 64}}, Done: func(err error) { done <- err }}); err != nil {
			t.Fatal(err)
		}
		if err := wait(t, done, "Done"); err != nil {
			t.Fatal(err)
		}
		return ep
	}
	first, err := cudaipc.New()
	if err != nil {
		t.Fatal(err)
	}
	second := agent(t)
	ep1 := post(first)  // opens the imports, with first's Device
	ep2 := post(second) // shares them
	_ = ep1
	if err := first.Close(); err != nil { // closes ep1, then first's Device
		t.Fatal(err)
	}
	if err := ep2.Close(); err != nil {
		t.Errorf("the second agent's endpoint Close, after the first agent closed: %v", err)
	}
	if got := cudaipc.ImportRefs(); got != base {
		t.Errorf("%d references to mappings of the peer's allocations left after every endpoint closed", got-base)
	}
}
