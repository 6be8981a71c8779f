package rdmabench

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckShape: a shape whose rig would not fit in the memory available,
// or whose size overflows, is refused with ErrShapeTooLarge naming the
// shape and the memory, before anything is allocated; one that fits
// passes, and so does any where the memory cannot be read. (Checked to
// fail: before checkShape, newRig allocated the buffers, and 1000 × 1GiB
// ended the process out of memory.)
func TestCheckShape(t *testing.T) {
	const gib = 1 << 30
	avail := func(n uint64) func() (uint64, bool) { return func() (uint64, bool) { return n, true } }
	for _, c := range []struct {
		backend string
		s       Shape
		avail   func() (uint64, bool)
		want    string // "" passes
	}{
		{"shm", Shape{SegmentBytes: gib, Segments: 1000}, avail(64 * gib),
			"1000 segments of 1GiB = 1000GiB per batch; the shm rig holds 3 buffers of it and the segment list (2.9TiB), more than the 64GiB of memory available"},
		{"shm", Shape{SegmentBytes: gib, Segments: 4}, avail(64 * gib), ""},
		{Copy, Shape{SegmentBytes: gib, Segments: 20}, avail(64 * gib), ""},
		{"shm", Shape{SegmentBytes: gib, Segments: 22}, avail(64 * gib), "the shm rig holds 3 buffers"},
		{"shm", Shape{SegmentBytes: gib, Segments: 1000}, func() (uint64, bool) { return 0, false }, ""},
		{"shm", Shape{SegmentBytes: 8 * gib, Segments: 1 << 32}, avail(64 * gib), "overflows 64 bits"},
		{"shm", Shape{SegmentBytes: 1, Segments: 1 << 62}, avail(64 * gib), "overflows 64 bits"},
		{"shm", Shape{SegmentBytes: 1, Segments: 10 << 30}, avail(64 * gib), "segment list"},
		// Slots multiply what the rig holds.
		{"shm", Shape{SegmentBytes: gib, Segments: 4, Slots: 6}, avail(64 * gib),
			"4 segments of 1GiB = 4GiB per batch; the shm rig holds 3 buffers of its 6 slots (24GiB) and their segment lists (72GiB), more than the 64GiB"},
		{"shm", Shape{SegmentBytes: gib, Segments: 4, Slots: 5}, avail(64 * gib), ""},
		{Copy, Shape{SegmentBytes: 1 << 20, Segments: 1, Slots: 1 << 50}, avail(64 * gib), "over 1125899906842624 slots: the batch's size overflows 64 bits"},
	} {
		err := checkShape(c.backend, c.s, c.avail)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s %+v: %v, want nil", c.backend, c.s, err)
		case c.want != "" && (!errors.Is(err, ErrShapeTooLarge) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %+v: %v, want ErrShapeTooLarge containing %q", c.backend, c.s, err, c.want)
		}
	}
	if err := checkShape(Copy, Shape{SegmentBytes: 1, Segments: 1, Slots: -1}, avail(gib)); err == nil || !strings.Contains(err.Error(), "-1 slots") {
		t.Errorf("negative slots: %v, want an error naming them", err)
	}
	if _, err := newRig("shm", Shape{SegmentBytes: 1 << 40, Segments: 1 << 20}); !errors.Is(err, ErrShapeTooLarge) {
		t.Fatalf("newRig of 1EiB: %v, want ErrShapeTooLarge", err)
	}
}
