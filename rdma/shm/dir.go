package shm

import (
	"os"
	"sync"
)

// Dir is the directory that holds region files: /dev/shm where it is a
// directory, else os.TempDir(). Every process of one host computes the same
// Dir, so a key carries only a file's base name.
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
