package shm

import (
	"fmt"
	"os"
	"syscall"
)

// reserveFile gives f the memory of its size bytes now (fallocate): a
// region file is sparse after Truncate, and a tmpfs too small for it (a
// container's /dev/shm is 64 MiB by default) would otherwise fail a page
// only when a writer first touches it — SIGBUS in the writer's process.
// ENOSPC names what the directory has left.
func reserveFile(f *os.File, size int) error {
	ferr, err := onFd(f, func(fd int) error { return syscall.Fallocate(fd, 0, 0, int64(size)) })
	if err != nil {
		return err
	}
	switch {
	case ferr == nil:
		return nil
	case ferr == syscall.ENOSPC:
		var st syscall.Statfs_t
		left := "?"
		if syscall.Statfs(Dir(), &st) == nil {
			left = fmt.Sprintf("%d", uint64(st.Bavail)*uint64(st.Bsize))
		}
		return fmt.Errorf("%s has room for %s bytes, not %d: give it more (a container's --shm-size) or use a smaller pool: %w",
			Dir(), left, size, os.NewSyscallError("fallocate", ferr))
	case ferr == syscall.EOPNOTSUPP:
		return nil // a file system without fallocate: pages come on first touch, as before
	}
	return os.NewSyscallError("fallocate", ferr)
}

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

// holdFile takes a shared flock on f's open file description. A mapping
// made from f keeps that description, and so the lock, after f is closed:
// the lock goes when the owner's last mapping of the file does (unmapped,
// or the process died), which another process sees whatever its pid
// namespace (Held). It waits while a sweep holds the file's exclusive lock
// (removeUnheld: the instant it takes to remove the file), and then
// reports whether the file is still linked: a sweep may have removed it.
func holdFile(f *os.File) (linked bool, err error) {
	ferr, err := onFd(f, func(fd int) error { return syscall.Flock(fd, syscall.LOCK_SH) })
	if err != nil {
		return false, err
	}
	if ferr != nil {
		return false, os.NewSyscallError("flock", ferr)
	}
	var st syscall.Stat_t
	ferr, err = onFd(f, func(fd int) error { return syscall.Fstat(fd, &st) })
	if err != nil {
		return false, err
	}
	if ferr != nil {
		return false, os.NewSyscallError("fstat", ferr)
	}
	return st.Nlink > 0, nil
}

// onFd runs call on f's descriptor, again while it is interrupted
// (EINTR): callErr is call's result, err f's failure to lend it.
func onFd(f *os.File, call func(fd int) error) (callErr, err error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	err = sc.Control(func(fd uintptr) {
		for {
			if callErr = call(int(fd)); callErr != syscall.EINTR {
				return
			}
		}
	})
	return callErr, err
}

// fileHeld reports whether the region file at path is held by the
// process that made it (holdFile): an exclusive flock of it would block.
func fileHeld(path string) (bool, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false, os.NewSyscallError("open", err)
	}
	defer syscall.Close(fd)
	for {
		err = syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			break
		}
	}
	switch err {
	case nil:
		return false, nil // closing fd drops the lock
	case syscall.EWOULDBLOCK:
		return true, nil
	}
	return false, os.NewSyscallError("flock", err)
}

// removeUnheld unlinks the region file at path unless a process holds it
// (fileHeld), under the file's exclusive lock (RemoveUnheld), and reports
// whether it did.
func removeUnheld(path string) (bool, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd) // (after the unlink: a maker waiting to hold the file sees it removed)
	for {
		err = syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			break
		}
	}
	switch err {
	case nil:
	case syscall.EWOULDBLOCK:
		return false, nil
	default:
		return false, os.NewSyscallError("flock", err)
	}
	// The name may have been given to another file since it was opened
	// (removed and made again): only the file locked here goes.
	var held, named syscall.Stat_t
	if err := syscall.Fstat(fd, &held); err != nil {
		return false, os.NewSyscallError("fstat", err)
	}
	if err := syscall.Lstat(path, &named); err != nil {
		return false, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if held.Dev != named.Dev || held.Ino != named.Ino {
		return false, nil
	}
	if err := syscall.Unlink(path); err != nil {
		return false, &os.PathError{Op: "remove", Path: path, Err: err}
	}
	return true, nil
}

// mapFixed maps n bytes of f at file offset off over the existing mapping at
// addr (mmap MAP_FIXED|MAP_SHARED): the pages at addr show the file's range
// [off, off+n) from then on. populate faults the new pages in now.
func mapFixed(f *os.File, addr uintptr, n int, off int64, populate bool) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	flags := syscall.MAP_SHARED | syscall.MAP_FIXED
	if populate {
		flags |= syscall.MAP_POPULATE
	}
	var errno syscall.Errno
	var got uintptr
	if err := sc.Control(func(fd uintptr) {
		got, _, errno = syscall.Syscall6(syscall.SYS_MMAP, addr, uintptr(n),
			syscall.PROT_READ|syscall.PROT_WRITE, uintptr(flags), fd, uintptr(off))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return os.NewSyscallError("mmap", errno)
	}
	if got != addr { // MAP_FIXED maps at addr or fails
		return fmt.Errorf("mmap(MAP_FIXED) at %#x mapped at %#x", addr, got)
	}
	return nil
}
