package copier

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// mapTruncated maps a 3-page file, then truncates it to one page: the
// mapping's last two pages fault on access.
func mapTruncated(t *testing.T) (mem []byte, page int) {
	page = os.Getpagesize()
	path := filepath.Join(t.TempDir(), "peer")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(3 * page)); err != nil {
		t.Fatal(err)
	}
	mem, err = syscall.Mmap(int(f.Fd()), 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	if err := f.Truncate(int64(page)); err != nil {
		t.Fatal(err)
	}
	return mem, page
}

// TestFaultFailsJob: a copy into peer memory truncated under us fails its
// job with rdma.ErrPeerGone naming the peer, marks the peer gone (the next
// job into it fails without copying), and the copier goes on with other
// jobs. A lease of a job into peer memory that lies in a truncated page
// faults on release: reported, not fatal.
func TestFaultFailsJob(t *testing.T) {
	mem, page := mapTruncated(t)
	peer := NewPeerMemory("region file test", mem)
	c := New("test")
	defer c.Close()
	src := make([]byte, 2*page)
	done := make(chan error, 1)
	post := func(j Job) error {
		t.Helper()
		j.Done = func(err error) { done <- err }
		if err := c.Post(j); err != nil {
			t.Fatal(err)
		}
		return recvErr(t, done)
	}
	segs := []kvcache.Segment{{Src: 0, Dst: 0, Len: 8}, {Src: 0, Dst: uint64(page), Len: uint64(page)}}

	var l Lease
	l.Acquire()
	err := post(Job{Src: src, Dst: mem[:2*page], Segs: segs, Peer: peer, Leases: [2]*Lease{&l}})
	var se *rdma.SegmentError
	if !errors.Is(err, rdma.ErrPeerGone) || !errors.As(err, &se) || se.Index != 1 || !strings.Contains(err.Error(), "region file test") {
		t.Fatalf("copy into a truncated page: %v, want segment 1 failing with rdma.ErrPeerGone naming the region", err)
	}
	if l.InFlight() != 0 {
		t.Errorf("the failed job's lease still holds %d", l.InFlight())
	}
	if peer.Err() == nil {
		t.Error("the peer memory is not marked gone after a fault in it")
	}

	mem[0] = 'x'
	if err := post(Job{Src: src, Dst: mem[:page], Segs: segs[:1], Peer: peer}); !errors.Is(err, rdma.ErrPeerGone) || mem[0] != 'x' {
		t.Errorf("job into gone peer memory: %v, first byte %q; want rdma.ErrPeerGone, nothing copied", err, mem[0])
	}

	// A lease in a truncated page (a header truncated away).
	lease := (*Lease)(unsafe.Pointer(&mem[2*page]))
	other := NewPeerMemory("other", mem)
	if err := post(Job{Src: src, Dst: make([]byte, 8), Segs: segs[:1], Leases: [2]*Lease{nil, lease}, Peer: other}); !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("job whose peer lease faults on release: %v, want rdma.ErrPeerGone", err)
	}
	live := make([]byte, 8)
	if err := post(Job{Src: src, Dst: live, Segs: segs[:1], Leases: [2]*Lease{lease}, Peer: NewPeerMemory("live", live)}); !errors.Is(err, kvcache.ErrBadRegion) {
		t.Errorf("job into peer memory whose source lease faults on release: %v, want kvcache.ErrBadRegion", err)
	}

	// The copier goes on.
	dst := make([]byte, 8)
	if err := post(Job{Src: []byte("abcdefgh"), Dst: dst, Segs: segs[:1]}); err != nil || string(dst) != "abcdefgh" {
		t.Errorf("job after the faults: %v, copied %q", err, dst)
	}
}

// TestCatchFault: a fault is caught and its address returned, the
// goroutine's panic-on-fault setting restored; other panics propagate.
func TestCatchFault(t *testing.T) {
	mem, page := mapTruncated(t)
	addr, faulted := CatchFault(func() { mem[page+5] = 1 })
	if want := uintptr(unsafe.Pointer(&mem[page])); !faulted || addr < want || addr >= want+uintptr(page) {
		t.Errorf("CatchFault: %#x, %v; want a fault in the page at %#x", addr, faulted, want)
	}
	if _, faulted := CatchFault(func() { mem[0] = 1 }); faulted {
		t.Error("CatchFault reported a fault for a live page")
	}
	if debug.SetPanicOnFault(false) {
		t.Error("CatchFault left the goroutine panicking on faults")
	}
	defer func() {
		if r := recover(); r != "not a fault" {
			t.Errorf("recovered %v, want the non-fault panic re-raised", r)
		}
	}()
	CatchFault(func() { panic("not a fault") })
	t.Error("a non-fault panic was swallowed")
}
