package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// TestOpenMappingRefusesAFileBeforeMappingIt: a key naming a file that is
// not its region file (garbage, or another region's) is refused from the
// header read with pread, before the mapping, which populates every page:
// a 64 MiB sparse file costs no faults. Before, openMapping mapped (and
// populated) the whole file, then read the header.
func TestOpenMappingRefusesAFileBeforeMappingIt(t *testing.T) {
	const data = 64 << 20
	for _, c := range []struct {
		name, want string
		header     func(b []byte)
	}{
		{"not a region file", "is not a region file", func(b []byte) { copy(b, "GARBAGE!") }},
		{"another layout version", `is a region file of layout version "00", this build reads version "01"`, func(b []byte) {
			copy(b, "KVXSHM00")
			binary.NativeEndian.PutUint64(b[8:], headerSize)
			binary.NativeEndian.PutUint64(b[16:], data)
		}},
		{"another region's file", "stale key", func(b []byte) {
			copy(b, fileMagic)
			binary.NativeEndian.PutUint64(b[8:], headerSize)
			binary.NativeEndian.PutUint64(b[16:], data)
			copy(b[24:40], "another region!!")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("kvxfer-test-mapping-%d-%s", os.Getpid(), strings.ReplaceAll(c.name, " ", "-"))
			path := filepath.Join(Dir(), name)
			f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				t.Skipf("no region file here: %v", err)
			}
			defer os.Remove(path)
			defer f.Close()
			var h [40]byte
			c.header(h[:])
			if _, err := f.WriteAt(h[:], 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(headerSize + data); err != nil {
				t.Fatal(err)
			}
			var k regionKey
			k.name = []byte(name)
			copy(k.fileID[:], "the key's region")
			before := minorFaults(t)
			m, err := openMapping(k)
			faults := minorFaults(t) - before
			if m != nil {
				unmapFile(m.mem)
			}
			if !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("openMapping: %v, want ErrBadKey saying %q", err, c.want)
			}
			if pages := int64(data / 4096); faults > pages/16 {
				t.Fatalf("%d minor faults refusing a file of %d pages: it was mapped before its header was read", faults, pages)
			}
		})
	}
}

func minorFaults(t *testing.T) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}
