//go:build unix

package host

import (
	"errors"
	"syscall"
)

// ProcessGone reports whether no process pid exists.
func ProcessGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
