package cudaipc

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Span is a byte range [Off, Off+Len) of a region, relative to its Base.
type Span struct {
	Off, Len uint64
}

// SpanError is RegisterSpans' (and Allocations') refusal of one span: it
// lies outside the region, in no allocation of the driver's, or runs past
// the allocation that holds its first byte. Index is the span's index in
// the caller's list. It wraps kvcache.ErrBadRegion.
type SpanError struct {
	Index int
	Span  Span
	Err   error
}

func (e *SpanError) Error() string {
	return fmt.Sprintf("span %d [%#x, +%d): %v", e.Index, e.Span.Off, e.Span.Len, e.Err)
}

func (e *SpanError) Unwrap() error { return e.Err }

// Allocation is one CUDA allocation a registration spans: region bytes
// [Off, Off+Len) lie in the allocation whose base is Base, at Base+AllocOff.
type Allocation struct {
	Base     cuda.DevicePtr
	Size     uint64 // of the whole allocation, as the driver reports it
	AllocOff uint64
	Off, Len uint64
}

// Allocations returns the allocations that hold spans of r, as
// RegisterSpans would register them, without registering anything: one
// per allocation (ascending by region offset), covering the spans' bytes
// in it, from the first span byte to the last. It asks the driver
// (cuMemGetAddressRange) for the allocation of each span's first byte and
// refuses, with a *SpanError wrapping kvcache.ErrBadRegion naming the
// addresses, a span outside r, in no allocation, or running past its
// allocation; with kvcache.ErrBadRegion, more than MaxAllocations.
// Empty spans are ignored; at least one span must be non-empty.
func (a *Agent) Allocations(r *kvcache.Region, spans []Span) ([]Allocation, error) {
	if r == nil {
		return nil, fmt.Errorf("%s: %w: nil region", a, kvcache.ErrBadRegion)
	}
	if r.Kind != kvcache.DeviceMem {
		return nil, fmt.Errorf("%s: %s region at %#x (%d bytes): %w: cudaipc registers device memory only",
			a, r.Kind, r.Base, r.Len, kvcache.ErrBadRegion)
	}
	type indexed struct {
		i int
		s Span
	}
	ss := make([]indexed, 0, len(spans))
	for i, s := range spans {
		if s.Len == 0 {
			continue
		}
		if !r.Contains(s.Off, s.Len) {
			return nil, &SpanError{Index: i, Span: s, Err: fmt.Errorf("%w: outside the %d-byte region at %#x", kvcache.ErrBadRegion, r.Len, r.Base)}
		}
		ss = append(ss, indexed{i, s})
	}
	if len(ss) == 0 {
		return nil, fmt.Errorf("%s: device region at %#x (%d bytes): %w: no span of bytes in use (%d spans, all empty)",
			a, r.Base, r.Len, kvcache.ErrBadRegion, len(spans))
	}
	slices.SortStableFunc(ss, func(x, y indexed) int { return cmp.Compare(x.s.Off, y.s.Off) })
	var out []Allocation
	for _, x := range ss {
		lo, hi := x.s.Off, x.s.Off+x.s.Len
		if k := len(out) - 1; k >= 0 {
			if c := &out[k]; lo-c.Off+c.AllocOff < c.Size { // starts in the last allocation found
				if end := hi - c.Off + c.AllocOff; end > c.Size {
					return nil, a.pastAllocation(r, x.i, x.s, c.Base, c.Size)
				}
				c.Len = max(c.Len, hi-c.Off)
				continue
			}
		}
		p := cuda.DevicePtr(r.Base) + cuda.DevicePtr(lo)
		base, size, err := a.dev.AddressRange(p)
		if err != nil {
			return nil, &SpanError{Index: x.i, Span: x.s, Err: fmt.Errorf("%w: device address %#x is in no cuMemAlloc allocation of device %d: %v",
				kvcache.ErrBadRegion, uintptr(p), a.dev.Ordinal(), err)}
		}
		off := uint64(p - base)
		if off >= size || x.s.Len > size-off {
			return nil, a.pastAllocation(r, x.i, x.s, base, size)
		}
		if k := len(out) - 1; k >= 0 && out[k].Base == base { // cannot happen: the driver's ranges are disjoint
			return nil, &SpanError{Index: x.i, Span: x.s, Err: fmt.Errorf("%w: the driver puts it in allocation %#x again", kvcache.ErrBadRegion, uintptr(base))}
		}
		out = append(out, Allocation{Base: base, Size: size, AllocOff: off, Off: lo, Len: x.s.Len})
		if len(out) > MaxAllocations {
			return nil, fmt.Errorf("%s: device region at %#x (%d bytes): %w: its spans lie in more than %d CUDA allocations (%d so far, of %d spans): a cudaipc key names at most %d: give fewer, larger tensors",
				a, r.Base, r.Len, kvcache.ErrBadRegion, MaxAllocations, len(out), len(spans), MaxAllocations)
		}
	}
	return out, nil
}

func (a *Agent) pastAllocation(r *kvcache.Region, i int, s Span, base cuda.DevicePtr, size uint64) error {
	p := r.Base + uintptr(s.Off)
	return &SpanError{Index: i, Span: s, Err: fmt.Errorf("%w: device bytes [%#x, %#x) run past the CUDA allocation [%#x, %#x) that holds the first: a span must lie in one allocation",
		kvcache.ErrBadRegion, p, p+uintptr(s.Len), uintptr(base), uintptr(base)+uintptr(size))}
}
