package kvcache

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestPoolAllocMoreThanPoolHolds: asking a pool for more blocks than it has
// in all is ErrPoolTooSmall, naming the numbers, and not ErrOutOfBlocks —
// the error a caller may wait out — even when every block is free. Checked
// to fail before the fix: Alloc(7) of a 6-block pool returned ErrOutOfBlocks
// ("requested 7 blocks, 6 free of 6"), the same error as a pool that is
// merely busy, so AllocWait-style callers could not tell "never" from "not
// now".
func TestPoolAllocMoreThanPoolHolds(t *testing.T) {
	p := newTestPool(t, 6) // 64-byte blocks
	before := snapshot(p)
	ids, err := p.Alloc(7)
	if !errors.Is(err, ErrPoolTooSmall) || errors.Is(err, ErrOutOfBlocks) || ids != nil {
		t.Fatalf("Alloc(7) of a 6-block pool = %v, %v; want ErrPoolTooSmall and not ErrOutOfBlocks", ids, err)
	}
	const want = "kvcache: pool too small: need 7 blocks of 64B (448B), the pool holds 6 (384B)"
	if err.Error() != want {
		t.Errorf("Alloc(7) error\n got %q\nwant %q", err, want)
	}
	if snapshot(p) != before {
		t.Error("failed Alloc changed the pool")
	}
	// A busy pool is still ErrOutOfBlocks: waiting may help there.
	if _, err := p.Alloc(4); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Alloc(3); !errors.Is(err, ErrOutOfBlocks) || errors.Is(err, ErrPoolTooSmall) {
		t.Fatalf("Alloc(3) with 2 of 6 free = %v; want ErrOutOfBlocks and not ErrPoolTooSmall", err)
	}
	if err := p.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestPoolGeometryCheckFits: the check a waiting allocator makes before it
// waits. Sizes are written as kvxfer's size flags take them.
func TestPoolGeometryCheckFits(t *testing.T) {
	llama70B := PoolGeometry{BlockBytes: 10 << 20, Blocks: 204} // 2GiB of 10MiB blocks
	for _, c := range []struct {
		name string
		g    PoolGeometry
		n    int
		want error
		msg  string
	}{
		{"none", llama70B, 0, nil, ""},
		{"all", llama70B, 204, nil, ""},
		{"one more", llama70B, 205, ErrPoolTooSmall, "kvcache: pool too small: need 205 blocks of 10MiB (2050MiB), the pool holds 204 (2040MiB)"},
		{"8k prompt", llama70B, 256, ErrPoolTooSmall, "need 256 blocks of 10MiB (2560MiB), the pool holds 204 (2040MiB)"},
		{"odd block", PoolGeometry{BlockBytes: 1000, Blocks: 1}, 3, ErrPoolTooSmall, "need 3 blocks of 1000B (3000B), the pool holds 1 (1000B)"},
		{"overflow", PoolGeometry{BlockBytes: 1 << 40, Blocks: 1}, math.MaxInt, ErrPoolTooSmall, "blocks of 1024GiB, the pool holds 1 (1024GiB)"},
		{"negative", llama70B, -1, ErrBadCount, "-1 blocks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.g.CheckFits(c.n)
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Fatalf("CheckFits(%d) = %v, want %v", c.n, err, c.want)
			}
			if err != nil && !strings.Contains(err.Error(), c.msg) {
				t.Errorf("CheckFits(%d) = %q, want it to contain %q", c.n, err, c.msg)
			}
		})
	}
	p := newTestPool(t, 3)
	if g := p.Geometry(); g != (PoolGeometry{Offset: 128, BlockBytes: 64, Blocks: 3}) {
		t.Errorf("Geometry() = %+v", g)
	}
}
