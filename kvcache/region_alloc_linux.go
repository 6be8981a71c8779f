//go:build linux

package kvcache

import "syscall"

// hugeRegionMin is the size from which host regions are mapped directly
// and advised to use transparent huge pages: a multi-GiB pool then takes
// hundreds of times fewer page faults when first touched.
const hugeRegionMin = 64 << 20

// allocHost returns n zeroed bytes and the function that releases them.
func allocHost(n uint64) ([]byte, func() error) {
	if n < hugeRegionMin || n > 1<<46 {
		return make([]byte, n), nil
	}
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]byte, n), nil
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // advice only: fine if refused
	return b, func() error { return syscall.Munmap(b) }
}
