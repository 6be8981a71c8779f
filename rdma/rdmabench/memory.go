package rdmabench

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unsafe"

	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/kvcache"
)

// ErrShapeTooLarge: a shape whose buffers the rig cannot hold: its bytes
// overflow, or its copies exceed the memory available.
var ErrShapeTooLarge = errors.New("rdmabench: shape too large")

// rigCopies is how many buffers of one operation's size a rig of backend
// holds: the source and Go's copy destination, and for a backend the
// receiver's region (besides, the operation's segment list).
func rigCopies(backend string) uint64 {
	if backend == Copy {
		return 2
	}
	return 3
}

// CheckShape refuses a shape the rig of backend cannot hold, before any
// memory is allocated (an allocation past the memory would end the
// process with the runtime's out of memory, a stack dump): one whose
// bytes overflow, or whose rigCopies exceed the memory available
// (MemAvailable in /proc/meminfo; not checked where it cannot be read).
// The error wraps ErrShapeTooLarge and names the shape and the memory.
func CheckShape(backend string, s Shape) error {
	return checkShape(backend, s, meminfo.Available)
}

func checkShape(backend string, s Shape, avail func() (uint64, bool)) error {
	if s.SegmentBytes == 0 || s.Segments < 1 {
		return fmt.Errorf("rdmabench: shape %d segments of %d bytes: want at least one segment of at least one byte", s.Segments, s.SegmentBytes)
	}
	hi, n := bits.Mul64(s.SegmentBytes, uint64(s.Segments))
	copies := rigCopies(backend)
	hi2, need := bits.Mul64(n, copies)
	// and the batch's segment list
	hi3, list := bits.Mul64(uint64(s.Segments), uint64(unsafe.Sizeof(kvcache.Segment{})))
	need, carry := bits.Add64(need, list, 0)
	if hi != 0 || hi2 != 0 || hi3 != 0 || carry != 0 {
		return fmt.Errorf("%w: %d segments of %s: the batch's size overflows 64 bits", ErrShapeTooLarge, s.Segments, sizeString(s.SegmentBytes))
	}
	if have, ok := avail(); ok && need > have {
		return fmt.Errorf("%w: %d segments of %s = %s per batch; the %s rig holds %d buffers of it and the segment list (%s), more than the %s of memory available (MemAvailable)",
			ErrShapeTooLarge, s.Segments, sizeString(s.SegmentBytes), sizeString(n), backend, copies, sizeString(need), sizeString(have))
	}
	return nil
}

// sizeString is n bytes in the largest binary unit it reaches, to one
// decimal ("1.5GiB", "4KiB", "100B").
func sizeString(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	u, f := 0, float64(n)
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	if u == 0 {
		return strconv.FormatUint(n, 10) + "B"
	}
	return strings.TrimSuffix(strconv.FormatFloat(f, 'f', 1, 64), ".0") + units[u]
}
