// Package meminfo reads what the kernel says about the host's memory.
package meminfo

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
)

// Available is the kernel's estimate of the memory available for new
// allocations without swapping (MemAvailable in /proc/meminfo), in bytes;
// ok is false where it cannot be read (not Linux, no /proc).
func Available() (n uint64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	return parseAvailable(b)
}

func parseAvailable(b []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 3 && string(f[0]) == "MemAvailable:" && string(f[2]) == "kB" {
			kb, err := strconv.ParseUint(string(f[1]), 10, 64)
			if err != nil || kb > 1<<53 {
				return 0, false
			}
			return kb << 10, true
		}
	}
	return 0, false
}
