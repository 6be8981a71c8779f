package shm

import (
	"os"
	"syscall"
)

// mapFile maps size bytes of f shared, read-write, with the pages populated
// up front so that the first copy does not fault page by page.
func mapFile(f *os.File, size int) ([]byte, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var mem []byte
	var merr error
	if err := sc.Control(func(fd uintptr) {
		mem, merr = syscall.Mmap(int(fd), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	}); err != nil {
		return nil, err
	}
	if merr != nil {
		return nil, os.NewSyscallError("mmap", merr)
	}
	return mem, nil
}

func unmapFile(mem []byte) error {
	return os.NewSyscallError("munmap", syscall.Munmap(mem))
}

const openNoFollow = syscall.O_NOFOLLOW
