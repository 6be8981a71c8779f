//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package trace

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock of f for as long as f is
// open, or returns ErrInUse while another open file (another process's
// Writer) holds it.
func lockFile(f *os.File) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := raw.Control(func(fd uintptr) {
		for {
			lerr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
			if !errors.Is(lerr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if errors.Is(lerr, syscall.EWOULDBLOCK) {
		return ErrInUse
	}
	if lerr != nil {
		return os.NewSyscallError("flock", lerr)
	}
	return nil
}
