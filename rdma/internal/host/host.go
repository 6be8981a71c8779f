// Package host holds what the shared-memory backends (shm, cudaipc) agree
// on about the host they share: where their files live, and whether a
// peer's process still exists.
package host

import (
	"os"
	"sync"
)

// Dir is the directory for files shared between the processes of a host:
// /dev/shm where it is a directory, else os.TempDir(). Every process of one
// host computes the same Dir, so a key need carry only a file's base name.
func Dir() string {
	dirOnce.Do(func() {
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			dir = "/dev/shm"
		} else {
			dir = os.TempDir()
		}
	})
	return dir
}

var (
	dirOnce sync.Once
	dir     string
)
