//go:build cgo && linux && !kvxfer_noucx

package ucx

import "golang.org/x/sys/unix"

// prefault fills the page tables of [addr, addr+n) in one system call
// rather than one page fault per 4 KiB page at the first write there. It
// is used on Alloc's memory and on the mappings of a peer's memory that
// UCX makes when it unpacks a key (its shared-memory transports map the
// peer's segment once per endpoint): on two cores a 2 GiB pool written
// through 4 endpoints took 2.3 million faults (about 9 s of kernel time)
// before this. Best effort: an old kernel (MADV_POPULATE_WRITE is Linux
// 5.14) or an unmapping in the meantime only ends it early.
func prefault(addr uintptr, n uint64) {
	unix.Syscall(unix.SYS_MADVISE, addr, uintptr(n), unix.MADV_POPULATE_WRITE)
}
