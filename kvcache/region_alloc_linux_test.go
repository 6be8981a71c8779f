//go:build linux

package kvcache

import (
	"syscall"
	"testing"
)

// TestNewHostRegionSmallIsMapped: a host region under 64 MiB is an
// anonymous mapping that Close unmaps, not Go heap memory: its address
// goes to C (kvxfer_engine_info_get's pool_base), which writes into it
// after the call returns, and cgo allows that only for memory Go does not
// manage. Checked to fail before the fix: regions under 64 MiB came from
// make([]byte) and had no release.
func TestNewHostRegionSmallIsMapped(t *testing.T) {
	for _, n := range []uint64{1, 4096, 65536, 1 << 20} {
		r, err := NewHostRegion(n)
		if err != nil {
			t.Fatal(err)
		}
		if r.release == nil {
			t.Fatalf("NewHostRegion(%d): no release: not mapped (Go heap memory)", n)
		}
		if r.Base%uintptr(syscall.Getpagesize()) != 0 {
			t.Errorf("NewHostRegion(%d): base %#x is not page-aligned, no mapping of its own", n, r.Base)
		}
		b := r.Bytes()
		if uint64(len(b)) != n {
			t.Fatalf("NewHostRegion(%d): %d bytes", n, len(b))
		}
		for i, v := range b {
			if v != 0 {
				t.Fatalf("NewHostRegion(%d): byte %d = %d, want zeroed", n, i, v)
			}
		}
		b[0], b[n-1] = 1, 2
		if err := r.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if r.Bytes() != nil {
			t.Fatalf("Bytes after Close is not nil")
		}
	}
}
