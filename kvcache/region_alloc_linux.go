//go:build linux

package kvcache

import (
	"fmt"
	"syscall"
)

// hugeRegionMin is the size from which host regions are advised to use
// transparent huge pages: a multi-GiB pool then takes hundreds of times
// fewer page faults when first touched.
const hugeRegionMin = 64 << 20

// allocHost returns n zeroed bytes and the function that releases them.
// Every host region is mapped directly (anonymous mmap, a few KiB rounded
// up to a page), never taken from the Go heap: a pool's address is handed
// to C (kvxfer_engine_info_get's pool_base), which keeps it and writes into
// it after the call, and cgo allows that only for memory Go does not
// manage. A region the kernel refuses to map is an error, not a heap
// allocation of the same size (which would end the process).
func allocHost(n uint64) ([]byte, func() error, error) {
	if n > MaxHostRegion {
		return nil, nil, fmt.Errorf("%w: region length %d: more than %d bytes", ErrBadRegion, n, uint64(MaxHostRegion))
	}
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: region length %d: mmap: %w", ErrBadRegion, n, err)
	}
	if n >= hugeRegionMin {
		_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // advice only: fine if refused
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}
