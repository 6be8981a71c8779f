//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resident counts the resident pages of [addr, addr+n).
func resident(t *testing.T, addr uintptr, n uint64) (res, pages int) {
	t.Helper()
	page := uint64(unix.Getpagesize())
	pages = int((n + page - 1) / page)
	vec := make([]byte, pages)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, addr, uintptr(n), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		res += int(v & 1)
	}
	return res, pages
}

// populateWorks reports whether this kernel has MADV_POPULATE_WRITE
// (Linux 5.14).
func populateWorks(t *testing.T) bool {
	b, err := unix.Mmap(-1, 0, 4*unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	return unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil
}

// TestAllocIsFaultedIn: Alloc's memory is resident when Alloc returns, as
// shm.NewRegion's is, so that no transfer pays a fault per page.
func TestAllocIsFaultedIn(t *testing.T) {
	if !populateWorks(t) {
		t.Skip("kernel without MADV_POPULATE_WRITE")
	}
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const n = 8 << 20
	r, c, err := a.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if res, pages := resident(t, r.Base, r.Len); res != pages {
		t.Fatalf("%d of %d pages resident after Alloc", res, pages)
	}
}

// TestPrefault fills a fresh mapping's page tables in one call.
func TestPrefault(t *testing.T) {
	if !populateWorks(t) {
		t.Skip("kernel without MADV_POPULATE_WRITE")
	}
	const n = 1 << 20
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	addr := uintptr(unsafe.Pointer(&b[0]))
	if res, _ := resident(t, addr, n); res != 0 {
		t.Fatalf("%d pages resident in a fresh mapping", res)
	}
	prefault(addr, n)
	if res, pages := resident(t, addr, n); res != pages {
		t.Fatalf("%d of %d pages resident after prefault", res, pages)
	}
}
