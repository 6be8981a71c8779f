package shm_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

func TestNewRegionRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		name string
		n    uint64
		want string
	}{
		{"a/b", 4096, `"a/b"`},
		{"..", 4096, `".."`},
		{strings.Repeat("x", 201), 4096, "xxxx"},
		{"kvxfer-test-zero", 0, "length 0"},
	} {
		r, c2, err := shm.NewRegion(c.name, c.n)
		if err == nil {
			c2.Close()
			t.Errorf("NewRegion(%q, %d) = %v, want an error", c.name, c.n, r)
			continue
		}
		if !errors.Is(err, kvcache.ErrBadRegion) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRegion(%q, %d): %v, want ErrBadRegion naming %s", c.name, c.n, err, c.want)
		}
	}
}

func TestNewRegionFileLifecycle(t *testing.T) {
	name := "kvxfer-test-" + t.Name()
	r, c, err := shm.NewRegion(name, 8192)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(shm.Dir(), name)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("region file: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("region file mode %v, want 0600", fi.Mode().Perm())
	}
	if r.Len != 8192 || len(r.Bytes()) != 8192 || r.Kind != kvcache.HostMem {
		t.Errorf("region %+v, want 8192 host bytes", r)
	}
	if _, _, err := shm.NewRegion(name, 8192); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("NewRegion of an existing name: %v, want an error naming it", err)
	}

	a := shm.New()
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(r); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Errorf("second Register of one shared region: %v, want ErrRegionBusy", err)
	}
	if err := c.Close(); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Errorf("region Close while registered: %v, want ErrRegionBusy", err)
	}
	if err := a.Deregister(reg); err != nil {
		t.Fatal(err)
	}
	// Registering again, after Deregister, works; closing the agent revokes.
	if _, err := a.Register(r); err != nil {
		t.Fatalf("Register after Deregister: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("region Close after agent Close: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("region file after Close: %v, want it removed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second region Close: %v, want nil", err)
	}
}

// TestUnlinkKeepsTheMapping: Unlink (an owner that cannot close its
// region, a write may still land, but is going away) removes the file's
// name at once and keeps the mapping; a later Close unmaps without
// failing on the missing name; both are idempotent.
func TestUnlinkKeepsTheMapping(t *testing.T) {
	name := "kvxfer-test-" + t.Name()
	r, c, err := shm.NewRegion(name, 8192)
	if err != nil {
		t.Fatal(err)
	}
	a := shm.New()
	if _, err := a.Register(r); err != nil {
		t.Fatal(err)
	}
	u, ok := c.(interface{ Unlink() error })
	if !ok {
		t.Fatalf("%T has no Unlink", c)
	}
	if err := u.Unlink(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(shm.Dir(), name)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("region file after Unlink: %v, want it gone", err)
	}
	r.Bytes()[8191] = 7 // still mapped
	if err := u.Unlink(); err != nil {
		t.Fatalf("second Unlink: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close after Unlink: %v", err)
	}
	if err := u.Unlink(); err != nil {
		t.Fatalf("Unlink after Close: %v", err)
	}
}

// TestPrivateDestinationRefused: a region not made by NewRegion registers
// (as a source) but cannot receive: the error says what to use instead.
func TestPrivateDestinationRefused(t *testing.T) {
	sender, receiver := shm.New(), shm.New()
	defer sender.Close()
	defer receiver.Close()
	src, _ := kvcache.NewHostRegion(4096)
	priv, _ := kvcache.NewHostRegion(4096)
	sreg, err := sender.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	preg, err := receiver.Register(priv)
	if err != nil {
		t.Fatalf("Register of private memory: %v", err)
	}
	ep, err := sender.Connect(receiver.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	err = ep.Post(rdma.Batch{Src: sreg, Dst: preg.Remote(), Segments: []kvcache.Segment{{Len: 1}}, Done: func(error) {}})
	if !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), "shm.NewRegion") {
		t.Errorf("Post into private memory: %v, want ErrBadKey pointing at shm.NewRegion", err)
	}
}

// TestRemovedFileRefused: a key whose file was closed and removed is
// refused, both by a fresh endpoint (no file) and by one that had it mapped
// (owner gone).
func TestRemovedFileRefused(t *testing.T) {
	sender, receiver := shm.New(), shm.New()
	defer sender.Close()
	defer receiver.Close()
	src, _ := kvcache.NewHostRegion(4096)
	sreg, _ := sender.Register(src)
	r, c, err := shm.NewRegion("", 4096)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := receiver.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	rr := reg.Remote()
	ep1, _ := sender.Connect(receiver.Address())
	defer ep1.Close()
	done := make(chan error, 1)
	if err := ep1.Post(rdma.Batch{Src: sreg, Dst: rr, Segments: []kvcache.Segment{{Len: 16}}, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := receiver.Deregister(reg); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	b := rdma.Batch{Src: sreg, Dst: rr, Segments: []kvcache.Segment{{Len: 16}}, Done: func(err error) { t.Errorf("Done(%v) for a refused batch", err) }}
	if err := ep1.Post(b); !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Post through a mapping of a closed region: %v, want ErrPeerGone", err)
	}
	ep2, _ := sender.Connect(receiver.Address())
	defer ep2.Close()
	if err := ep2.Post(b); !errors.Is(err, rdma.ErrBadKey) {
		t.Errorf("Post to a removed region file: %v, want ErrBadKey", err)
	}
}

func TestConnectToDeadProcess(t *testing.T) {
	a := shm.New()
	defer a.Close()
	// pid_max is at most 2^22 on Linux: this pid cannot exist.
	_, err := a.Connect([]byte("shm:2147483647:00112233445566778899aabbccddeeff"))
	if !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("Connect to a process that does not exist: %v, want ErrPeerGone", err)
	}
}

// TestStaleSharedSource: a shared region used as a source, deregistered and
// closed (unmapped), is refused as a source without touching its memory.
func TestStaleSharedSource(t *testing.T) {
	sender, receiver := shm.New(), shm.New()
	defer sender.Close()
	defer receiver.Close()
	sr, sc, err := shm.NewRegion("", 4096)
	if err != nil {
		t.Fatal(err)
	}
	sreg, err := sender.Register(sr)
	if err != nil {
		t.Fatal(err)
	}
	dr, dc, err := shm.NewRegion("", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	dreg, err := receiver.Register(dr)
	if err != nil {
		t.Fatal(err)
	}
	defer receiver.Deregister(dreg)
	ep, err := sender.Connect(receiver.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	if err := sender.Deregister(sreg); err != nil {
		t.Fatal(err)
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	err = ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(), Segments: []kvcache.Segment{{Len: 8}}, Done: func(err error) { t.Errorf("Done(%v)", err) }})
	if !errors.Is(err, rdma.ErrUnregistered) {
		t.Errorf("Post from a deregistered, unmapped source: %v, want ErrUnregistered", err)
	}
}

// TestRegionLargerThanTheDirectoryRefused: a region that the shared-memory
// directory cannot hold (a container's /dev/shm is 64 MiB by default) is
// refused when it is made, naming the directory and the sizes, instead of
// being made sparse and killing a writer's process with SIGBUS at its
// first copy into an unbacked page. The test runs itself again in a mount
// namespace with a 2 MiB tmpfs on /dev/shm (skipped where that cannot be
// made: not root, no unshare). (Checked to fail without the reservation:
// the region is made.)
func TestRegionLargerThanTheDirectoryRefused(t *testing.T) {
	if os.Getenv("KVXFER_TEST_SMALL_SHM") == "1" {
		regionLargerThanTheDirectory(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare here")
	}
	script := `mount -t tmpfs -o size=2m tmpfs /dev/shm && exec "$0" -test.run '^TestRegionLargerThanTheDirectoryRefused$' -test.count 1 -test.v`
	cmd := exec.Command("unshare", "-m", "sh", "-c", script, os.Args[0])
	cmd.Env = append(os.Environ(), "KVXFER_TEST_SMALL_SHM=1")
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), "mount:") {
		t.Skipf("no tmpfs mount in a namespace here: %s", out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestRegionLargerThanTheDirectoryRefused") {
		t.Fatalf("in a 2 MiB /dev/shm: %v\n%s", err, out)
	}
}

// regionLargerThanTheDirectory runs in the child, where /dev/shm holds
// 2 MiB: an 8 MiB region is refused with ENOSPC named; a region that fits
// is made, and a copy into all of it lands.
func regionLargerThanTheDirectory(t *testing.T) {
	if shm.Dir() != "/dev/shm" {
		t.Fatalf("shm.Dir() = %s, want /dev/shm", shm.Dir())
	}
	if _, closer, err := shm.NewRegion("", 8<<20); err == nil {
		_ = closer.Close()
		t.Fatal("an 8 MiB region made in a 2 MiB /dev/shm: its first write past 2 MiB would kill the writer")
	} else if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "/dev/shm has room for") {
		t.Fatalf("NewRegion(8 MiB) in a 2 MiB /dev/shm: %v, want ENOSPC naming /dev/shm's room", err)
	} else {
		t.Log(err)
	}
	const n = 1 << 20
	region, closer, err := shm.NewRegion("", n)
	if err != nil {
		t.Fatalf("NewRegion(1 MiB) in a 2 MiB /dev/shm: %v", err)
	}
	defer closer.Close()
	recv := shm.New()
	defer recv.Close()
	dst, err := recv.Register(region)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Deregister(dst)
	newWriter(t, recv, dst.Remote(), n).write(t, []kvcache.Segment{{Src: 0, Dst: 0, Len: n}})
}
