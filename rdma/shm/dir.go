package shm

import "github.com/kvxfer/kvxfer/rdma/internal/host"

// Dir is the directory that holds region files: /dev/shm where it is a
// directory, else os.TempDir(). Every process of one host computes the same
// Dir, so a key carries only a file's base name.
func Dir() string { return host.Dir() }
