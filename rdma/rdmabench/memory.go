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

// rigCopies is how many buffers of a rig's span (one operation's size per
// slot) a rig of backend holds: the source and Go's copy destination, and
// for a backend the receiver's region (besides, each slot's segment list).
func rigCopies(backend string) uint64 {
	if backend == Copy {
		return 2
	}
	return 3
}

// CheckShape refuses a shape the rig of backend cannot hold, before any
// memory is allocated (an allocation past the memory would end the
// process with the runtime's out of memory, a stack dump): one with
// negative Slots, one whose bytes overflow, or whose rigCopies exceed the
// memory available (MemAvailable in /proc/meminfo; not checked where it
// cannot be read). The error wraps ErrShapeTooLarge (but for negative
// Slots) and names the shape and the memory.
func CheckShape(backend string, s Shape) error {
	return checkShape(backend, s, meminfo.Available)
}

func checkShape(backend string, s Shape, avail func() (uint64, bool)) error {
	if s.SegmentBytes == 0 || s.Segments < 1 {
		return fmt.Errorf("rdmabench: shape %d segments of %d bytes: want at least one segment of at least one byte", s.Segments, s.SegmentBytes)
	}
	if s.Slots < 0 {
		return fmt.Errorf("rdmabench: shape with %d slots: want at least 1 (0 means 1)", s.Slots)
	}
	slots := uint64(s.SlotCount())
	hi, n := bits.Mul64(s.SegmentBytes, uint64(s.Segments))
	hi1, span := bits.Mul64(n, slots)
	copies := rigCopies(backend)
	hi2, need := bits.Mul64(span, copies)
	// and the slots' segment lists
	hi3, segs := bits.Mul64(uint64(s.Segments), slots)
	hi4, list := bits.Mul64(segs, uint64(unsafe.Sizeof(kvcache.Segment{})))
	need, carry := bits.Add64(need, list, 0)
	of := ""
	if slots > 1 {
		of = fmt.Sprintf(" over %d slots", slots)
	}
	if hi != 0 || hi1 != 0 || hi2 != 0 || hi3 != 0 || hi4 != 0 || carry != 0 {
		return fmt.Errorf("%w: %d segments of %s%s: the batch's size overflows 64 bits", ErrShapeTooLarge, s.Segments, sizeString(s.SegmentBytes), of)
	}
	if have, ok := avail(); ok && need > have {
		held := "it and the segment list"
		if slots > 1 {
			held = fmt.Sprintf("its %d slots (%s) and their segment lists", slots, sizeString(span))
		}
		return fmt.Errorf("%w: %d segments of %s = %s per batch; the %s rig holds %d buffers of %s (%s), more than the %s of memory available (MemAvailable)",
			ErrShapeTooLarge, s.Segments, sizeString(s.SegmentBytes), sizeString(n), backend, copies, held, sizeString(need), sizeString(have))
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
