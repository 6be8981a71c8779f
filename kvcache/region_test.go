package kvcache

import (
	"errors"
	"strings"
	"testing"
	"unsafe"
)

// TestNewHostRegionTooLarge: a region no host can hold is an error naming
// its length, not a crash. Checked to fail before the fix: NewHostRegion(1<<50)
// panicked with "makeslice: len out of range" (kvxfer demo --max-tokens
// 99999999999999 crashed that way).
func TestNewHostRegionTooLarge(t *testing.T) {
	for _, n := range []uint64{0, 1<<46 + 1, 1 << 50, 1<<64 - 1} {
		r, err := NewHostRegion(n)
		if !errors.Is(err, ErrBadRegion) || r != nil {
			t.Fatalf("NewHostRegion(%d) = %v, %v; want ErrBadRegion", n, r, err)
		}
		if n > 0 && !strings.Contains(err.Error(), "region length") {
			t.Errorf("NewHostRegion(%d) error %q does not name the length", n, err)
		}
	}
}

// TestExternalHostRegionBadLength: a length no host memory has, or one
// that runs past the end of the address space (a C caller's size_t -1, a
// garbage address), is an ErrBadRegion naming the length, not a panic.
// Checked to fail before the fix: lengths past 2^63 panicked with
// "unsafe.Slice: len out of range", and 2^50 was accepted.
func TestExternalHostRegionBadLength(t *testing.T) {
	b := make([]byte, 16)
	p := unsafe.Pointer(&b[0])
	for _, n := range []uint64{1<<46 + 1, 1 << 50, 1<<63 + 5, 1<<64 - 1} {
		r, err := ExternalHostRegion(p, n)
		if !errors.Is(err, ErrBadRegion) || r != nil {
			t.Fatalf("ExternalHostRegion(%d) = region %t, %v; want ErrBadRegion", n, r != nil, err)
		}
		if !strings.Contains(err.Error(), "region length") {
			t.Errorf("ExternalHostRegion(%d) error %q does not name the length", n, err)
		}
	}
	// An address near the top: the region would wrap around.
	top := uintptr(1<<(8*unsafe.Sizeof(uintptr(0))) - 4096)
	if r, err := ExternalHostRegion(*(*unsafe.Pointer)(unsafe.Pointer(&top)), 1<<20); !errors.Is(err, ErrBadRegion) || r != nil {
		t.Fatalf("ExternalHostRegion(%#x, 1MiB) = region %t, %v; want ErrBadRegion", top, r != nil, err)
	}
	if r, err := ExternalHostRegion(p, uint64(len(b))); err != nil || len(r.Bytes()) != len(b) {
		t.Fatalf("ExternalHostRegion(16 bytes) = region %t, %v", r != nil, err)
	}
}
