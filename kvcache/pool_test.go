package kvcache

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// fataler is what newTestPool needs of a *testing.T, *testing.B or *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

func newTestPool(t fataler, blocks int) *Pool {
	t.Helper()
	r, err := NewHostRegion(uint64(blocks)*64 + 128)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(r, 128, 64, blocks)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewPoolRejects(t *testing.T) {
	r, err := NewHostRegion(1024)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		region     *Region
		offset     uint64
		blockBytes uint64
		blocks     int
		want       string
	}{
		{"nil region", nil, 0, 64, 4, "region is nil"},
		{"zero block bytes", r, 0, 0, 4, "blockBytes = 0"},
		{"zero blocks", r, 0, 64, 0, "blocks = 0"},
		{"negative blocks", r, 0, 64, -1, "blocks = -1"},
		{"too many blocks", r, 0, 1, math.MaxInt32 + 1, "blocks = 2147483648"},
		{"does not fit", r, 0, 64, 17, "17 blocks × 64 bytes at offset 0 do not fit in a 1024-byte host region"},
		{"offset pushes out", r, 1, 64, 16, "at offset 1 do not fit"},
		{"offset past end", r, 2000, 1, 1, "at offset 2000"},
		{"size overflows", r, 0, 1 << 40, 1 << 30, "do not fit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPool(tt.region, tt.offset, tt.blockBytes, tt.blocks)
			if !errors.Is(err, ErrBadRegion) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewPool = %v, want ErrBadRegion containing %q", err, tt.want)
			}
		})
	}
	if _, err := NewPool(r, 0, 64, 16); err != nil {
		t.Fatalf("exact fit: %v", err)
	}
}

func TestPoolFreshOrderAndReuse(t *testing.T) {
	p := newTestPool(t, 8)
	ids, err := p.Alloc(3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []BlockID{0, 1, 2}; !slices.Equal(ids, want) {
		t.Fatalf("fresh Alloc(3) = %v, want %v", ids, want)
	}
	more, _ := p.Alloc(2)
	if want := []BlockID{3, 4}; !slices.Equal(more, want) {
		t.Fatalf("second Alloc(2) = %v, want %v", more, want)
	}
	if err := p.Free(ids...); err != nil {
		t.Fatal(err)
	}
	again, _ := p.Alloc(3)
	if !slices.Equal(again, ids) {
		t.Fatalf("Alloc after Free(%v) = %v, want the same run back in order", ids, again)
	}
	if err := p.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

func TestPoolOffsetAndBlock(t *testing.T) {
	p := newTestPool(t, 4)
	if got := p.Offset(0); got != 128 {
		t.Fatalf("Offset(0) = %d, want 128", got)
	}
	if got := p.Offset(3); got != 128+3*64 {
		t.Fatalf("Offset(3) = %d, want %d", got, 128+3*64)
	}
	b := p.Block(2)
	if len(b) != 64 || cap(b) != 64 {
		t.Fatalf("Block(2): len %d cap %d, want 64", len(b), cap(b))
	}
	b[0] = 0xAB
	if got := p.Region().Bytes()[p.Offset(2)]; got != 0xAB {
		t.Fatal("Block(2) does not alias the region at Offset(2)")
	}
	if p.BlockBytes() != 64 || p.Len() != 4 {
		t.Fatalf("BlockBytes %d Len %d", p.BlockBytes(), p.Len())
	}
	for _, id := range []BlockID{-1, 4} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Offset(%d) did not panic", id)
				}
			}()
			p.Offset(id)
		}()
	}
	dev, err := ExternalDeviceRegion(0x1000, 4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	dp, err := NewPool(dev, 0, 1024, 4)
	if err != nil {
		t.Fatal(err)
	}
	if dp.Block(1) != nil || dp.Offset(1) != 1024 {
		t.Fatal("device pool: Block should be nil, Offset 1024")
	}
}

// TestPoolErrors walks each illegal call from a known state and checks the
// sentinel, that the message names the block, and that nothing changed.
func TestPoolErrors(t *testing.T) {
	// Blocks: 0 allocated, 1 pinned, 2 quarantined, 3 free (and 4, 5 free).
	setup := func(t *testing.T) *Pool {
		p := newTestPool(t, 6)
		if _, err := p.Alloc(3); err != nil {
			t.Fatal(err)
		}
		if err := p.Pin(1); err != nil {
			t.Fatal(err)
		}
		if err := p.Quarantine(2); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		call func(p *Pool) error
		want error
		msg  string
	}{
		{"alloc too many", func(p *Pool) error { _, err := p.Alloc(4); return err }, ErrOutOfBlocks, "requested 4 blocks, 3 free of 6 (1 quarantined)"},
		{"alloc negative", func(p *Pool) error { _, err := p.Alloc(-1); return err }, ErrBadCount, "Alloc(-1)"},
		{"free free", func(p *Pool) error { return p.Free(3) }, ErrDoubleFree, "Free: block 3 is not allocated (it is free: never handed out, or freed already)"},
		{"free free is ErrBlockFree", func(p *Pool) error { return p.Free(3) }, ErrBlockFree, "Free: block 3 is not allocated"},
		{"free twice in call", func(p *Pool) error { return p.Free(0, 0) }, ErrDoubleFree, "block 0 listed twice"},
		{"free pinned", func(p *Pool) error { return p.Free(0, 1) }, ErrBlockPinned, "Free: block 1 is pinned"},
		{"free quarantined", func(p *Pool) error { return p.Free(2) }, ErrBlockQuarantined, "Free: block 2 is quarantined"},
		{"free unknown", func(p *Pool) error { return p.Free(0, 6) }, ErrUnknownBlock, "Free: block 6 out of range [0, 6)"},
		{"free negative", func(p *Pool) error { return p.Free(-1) }, ErrUnknownBlock, "block -1 out of range"},
		{"pin free", func(p *Pool) error { return p.Pin(0, 3) }, ErrBlockFree, "Pin: block 3 is free"},
		{"pin quarantined", func(p *Pool) error { return p.Pin(0, 2) }, ErrBlockQuarantined, "Pin: block 2 is quarantined"},
		{"pin unknown", func(p *Pool) error { return p.Pin(1, 0, 99) }, ErrUnknownBlock, "Pin: block 99"},
		{"unpin unpinned", func(p *Pool) error { return p.Unpin(0) }, ErrNotPinned, "Unpin: block 0 is allocated"},
		{"unpin twice", func(p *Pool) error { return p.Unpin(1, 1) }, ErrNotPinned, "Unpin: block 1 is allocated"},
		{"unpin free", func(p *Pool) error { return p.Unpin(1, 3) }, ErrNotPinned, "block 3 is free"},
		{"unpin unknown", func(p *Pool) error { return p.Unpin(1, 7) }, ErrUnknownBlock, "Unpin: block 7"},
		{"quarantine pinned", func(p *Pool) error { return p.Quarantine(0, 1) }, ErrBlockPinned, "Quarantine: block 1 is pinned"},
		{"quarantine free", func(p *Pool) error { return p.Quarantine(0, 3) }, ErrDoubleFree, "Quarantine: block 3 is not allocated"},
		{"quarantine free is ErrBlockFree", func(p *Pool) error { return p.Quarantine(0, 3) }, ErrBlockFree, "Quarantine: block 3 is not allocated"},
		{"quarantine twice", func(p *Pool) error { return p.Quarantine(2) }, ErrBlockQuarantined, "block 2 is quarantined"},
		{"quarantine repeated", func(p *Pool) error { return p.Quarantine(0, 0) }, ErrDoubleFree, "block 0 listed twice"},
		{"quarantine unknown", func(p *Pool) error { return p.Quarantine(0, 6) }, ErrUnknownBlock, "Quarantine: block 6"},
		{"release allocated", func(p *Pool) error { return p.ReleaseQuarantine(2, 0) }, ErrNotQuarantined, "block 0 is allocated"},
		{"release free", func(p *Pool) error { return p.ReleaseQuarantine(3) }, ErrNotQuarantined, "block 3 is free"},
		{"release repeated", func(p *Pool) error { return p.ReleaseQuarantine(2, 2) }, ErrNotQuarantined, "block 2 listed twice"},
		{"release unknown", func(p *Pool) error { return p.ReleaseQuarantine(2, -5) }, ErrUnknownBlock, "block -5"},
		{"state unknown", func(p *Pool) error { _, err := p.State(6); return err }, ErrUnknownBlock, "State: block 6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := setup(t)
			before := snapshot(p)
			err := tt.call(p)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tt.want, tt.msg)
			}
			if after := snapshot(p); after != before {
				t.Fatalf("failed call changed the pool:\nbefore %s\nafter  %s", before, after)
			}
			if err := p.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// snapshot renders everything observable about a pool, free-list order
// included.
func snapshot(p *Pool) string {
	return fmt.Sprintf("%+v states=%v pins=%v free=%v", p.Stats(), p.state, p.pins, p.free)
}

func TestPoolLifecycle(t *testing.T) {
	p := newTestPool(t, 4)
	ids, _ := p.Alloc(2)
	steps := []struct {
		name string
		do   func() error
		want PoolStats
	}{
		{"pin twice", func() error { return p.Pin(ids[0], ids[0], ids[1]) }, PoolStats{Total: 4, Free: 2, Used: 2, Pinned: 2}},
		{"unpin one ref", func() error { return p.Unpin(ids[0], ids[1]) }, PoolStats{Total: 4, Free: 2, Used: 2, Pinned: 1}},
		{"unpin last ref", func() error { return p.Unpin(ids[0]) }, PoolStats{Total: 4, Free: 2, Used: 2}},
		{"quarantine", func() error { return p.Quarantine(ids...) }, PoolStats{Total: 4, Free: 2, Quarantined: 2}},
		{"release", func() error { return p.ReleaseQuarantine(ids...) }, PoolStats{Total: 4, Free: 4}},
		{"empty calls", func() error {
			return errors.Join(p.Free(), p.Pin(), p.Unpin(), p.Quarantine(), p.ReleaseQuarantine())
		}, PoolStats{Total: 4, Free: 4}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := p.Stats(); got != s.want {
			t.Fatalf("%s: Stats = %+v, want %+v", s.name, got, s.want)
		}
		if err := p.CheckInvariants(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	if ids, err := p.Alloc(0); err != nil || len(ids) != 0 {
		t.Fatalf("Alloc(0) = %v, %v", ids, err)
	}
}

func TestPoolCheckInvariantsDetectsCorruption(t *testing.T) {
	corruptions := map[string]func(p *Pool){
		"counter":          func(p *Pool) { p.used++ },
		"pinned no pins":   func(p *Pool) { p.state[0] = BlockPinned; p.pinned++ },
		"pins unpinned":    func(p *Pool) { p.pins[0] = 1 },
		"free list dup":    func(p *Pool) { p.free = append(p.free, p.free[0]) },
		"allocated listed": func(p *Pool) { p.free = append(p.free, 0) },
		"bad state":        func(p *Pool) { p.state[0] = 9 },
	}
	for name, corrupt := range corruptions {
		p := newTestPool(t, 4)
		if _, err := p.Alloc(1); err != nil {
			t.Fatal(err)
		}
		corrupt(p)
		if err := p.CheckInvariants(); err == nil {
			t.Errorf("%s: CheckInvariants passed", name)
		}
	}
}

func TestBlockStateString(t *testing.T) {
	for s, want := range map[BlockState]string{
		BlockFree: "free", BlockAllocated: "allocated", BlockPinned: "pinned",
		BlockQuarantined: "quarantined", 7: "BlockState(7)",
	} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", uint8(s), got, want)
		}
	}
}

// poolModel is the reference the pool is checked against: per-block state
// and pin count, with every operation applied all-or-nothing.
type poolModel struct {
	state []BlockState
	pins  []int
}

// apply runs op on a copy of the model; it returns the expected sentinel
// (nil on success) and, on success, replaces the model's state.
func (m *poolModel) apply(op string, ids []BlockID) error {
	st := slices.Clone(m.state)
	pins := slices.Clone(m.pins)
	seen := map[BlockID]bool{}
	for _, id := range ids {
		if id < 0 || int(id) >= len(st) {
			return ErrUnknownBlock
		}
		s := st[id]
		if s == BlockReceiving && !seen[id] && op != "freeReceiving" && op != "handOver" && op != "quarantineReceiving" {
			// A live receive's (Reserve): only FreeReceiving takes it back.
			switch op {
			case "release":
				return ErrNotQuarantined
			case "unpin":
				return ErrNotPinned
			}
			return ErrBlockReceiving
		}
		switch op {
		case "reserve":
			switch {
			case s == BlockFree:
				st[id] = BlockReceiving
			case seen[id]:
				return ErrDoubleFree
			case s == BlockPinned:
				return ErrBlockPinned
			case s == BlockQuarantined:
				return ErrBlockQuarantined
			default:
				return ErrUnknownBlock // allocated
			}
		case "freeReceiving", "handOver", "quarantineReceiving":
			switch {
			case s == BlockReceiving && !seen[id]:
				st[id] = map[string]BlockState{"freeReceiving": BlockFree, "handOver": BlockAllocated,
					"quarantineReceiving": BlockQuarantined}[op]
			case seen[id] || s == BlockFree:
				return ErrDoubleFree
			default:
				return ErrNotReceiving
			}
		case "lend":
			switch {
			case s == BlockAllocated:
				st[id] = BlockReceiving
			case seen[id]:
				return ErrDoubleFree
			case s == BlockFree:
				return ErrBlockFree
			case s == BlockPinned:
				return ErrBlockPinned
			default:
				return ErrBlockQuarantined
			}
		case "free":
			switch {
			case s == BlockAllocated:
				st[id] = BlockFree
			case seen[id] || s == BlockFree:
				return ErrDoubleFree
			case s == BlockPinned:
				return ErrBlockPinned
			default:
				return ErrBlockQuarantined
			}
		case "quarantine":
			switch {
			case s == BlockAllocated:
				st[id] = BlockQuarantined
			case seen[id] || s == BlockFree:
				return ErrDoubleFree
			case s == BlockPinned:
				return ErrBlockPinned
			default:
				return ErrBlockQuarantined
			}
		case "release":
			if s != BlockQuarantined {
				return ErrNotQuarantined
			}
			st[id] = BlockFree
		case "pin":
			switch s {
			case BlockAllocated, BlockPinned:
				st[id] = BlockPinned
				pins[id]++
			case BlockFree:
				return ErrBlockFree
			default:
				return ErrBlockQuarantined
			}
		case "unpin":
			if s != BlockPinned {
				return ErrNotPinned
			}
			pins[id]--
			if pins[id] == 0 {
				st[id] = BlockAllocated
			}
		}
		seen[id] = true
	}
	m.state, m.pins = st, pins
	return nil
}

func (m *poolModel) stats() PoolStats {
	s := PoolStats{Total: len(m.state)}
	for _, st := range m.state {
		switch st {
		case BlockFree:
			s.Free++
		case BlockAllocated:
			s.Used++
		case BlockPinned:
			s.Used++
			s.Pinned++
		case BlockQuarantined:
			s.Quarantined++
		case BlockReceiving:
			s.Used++
			s.Receiving++
		}
	}
	return s
}

// TestPoolModel drives random, partly illegal, sequences of pool calls and
// compares the pool with poolModel after each; then it releases everything
// and checks that no block leaked.
func TestPoolModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 10).Draw(t, "blocks")
		p := newTestPool(t, n)
		m := &poolModel{state: make([]BlockState, n), pins: make([]int, n)}
		drawIDs := func(t *rapid.T) []BlockID {
			return rapid.SliceOfN(rapid.Custom(func(t *rapid.T) BlockID {
				return BlockID(rapid.IntRange(-1, n).Draw(t, "id"))
			}), 0, 4).Draw(t, "ids")
		}
		idsOp := func(name string, call func(...BlockID) error) func(*rapid.T) {
			return func(t *rapid.T) {
				ids := drawIDs(t)
				before := snapshot(p)
				want := m.apply(name, ids)
				err := call(ids...)
				if !errors.Is(err, want) || (want == nil) != (err == nil) {
					t.Fatalf("%s(%v) = %v, model expects %v", name, ids, err, want)
				}
				if err != nil && snapshot(p) != before {
					t.Fatalf("failed %s(%v) changed the pool", name, ids)
				}
			}
		}
		allocOp := func(alloc func(int) ([]BlockID, error), to BlockState) func(*rapid.T) {
			return func(t *rapid.T) {
				k := rapid.IntRange(0, n+1).Draw(t, "n")
				free := m.stats().Free
				ids, err := alloc(k)
				if k > n {
					if !errors.Is(err, ErrPoolTooSmall) || errors.Is(err, ErrOutOfBlocks) || ids != nil {
						t.Fatalf("Alloc(%d) of a %d-block pool = %v, %v; want ErrPoolTooSmall", k, n, ids, err)
					}
					return
				}
				if k > free {
					if !errors.Is(err, ErrOutOfBlocks) || ids != nil {
						t.Fatalf("Alloc(%d) with %d free = %v, %v; want ErrOutOfBlocks", k, free, ids, err)
					}
					return
				}
				if err != nil || len(ids) != k {
					t.Fatalf("Alloc(%d) with %d free = %v, %v", k, free, ids, err)
				}
				for _, id := range ids {
					if id < 0 || int(id) >= n || m.state[id] != BlockFree {
						t.Fatalf("Alloc returned block %d, which the model has %v", id, m.state[id])
					}
					m.state[id] = to
				}
			}
		}
		// Check answers what the call it names would, and changes nothing.
		checkOp := func(op string, from BlockState, model string) func(*rapid.T) {
			return func(t *rapid.T) {
				ids := drawIDs(t)
				before := snapshot(p)
				cp := &poolModel{state: slices.Clone(m.state), pins: slices.Clone(m.pins)}
				want := cp.apply(model, ids)
				err := p.Check(op, from, ids...)
				if !errors.Is(err, want) || (want == nil) != (err == nil) {
					t.Fatalf("Check(%s, %v, %v) = %v, model expects %v", op, from, ids, err, want)
				}
				if snapshot(p) != before {
					t.Fatalf("Check(%s, %v, %v) changed the pool", op, from, ids)
				}
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"alloc":               allocOp(p.Alloc, BlockAllocated),
			"allocReceiving":      allocOp(p.AllocReceiving, BlockReceiving),
			"lend":                idsOp("lend", p.Lend),
			"handOver":            idsOp("handOver", p.HandOver),
			"quarantineReceiving": idsOp("quarantineReceiving", p.QuarantineReceiving),
			"checkFree":           checkOp("Free", BlockAllocated, "free"),
			"checkFreeReceiving":  checkOp("FreeReceiving", BlockReceiving, "freeReceiving"),
			"checkRelease":        checkOp("ReleaseQuarantine", BlockQuarantined, "release"),
			"free":                idsOp("free", p.Free),
			"pin":                 idsOp("pin", p.Pin),
			"unpin":               idsOp("unpin", p.Unpin),
			"quarantine":          idsOp("quarantine", p.Quarantine),
			"release":             idsOp("release", p.ReleaseQuarantine),
			"reserve":             idsOp("reserve", p.Reserve),
			"freeReceiving":       idsOp("freeReceiving", p.FreeReceiving),
			"": func(t *rapid.T) {
				if err := p.CheckInvariants(); err != nil {
					t.Fatal(err)
				}
				if got, want := p.Stats(), m.stats(); got != want {
					t.Fatalf("Stats = %+v, model %+v", got, want)
				}
				for i := range n {
					s, err := p.State(BlockID(i))
					if err != nil || s != m.state[i] || int(p.pins[i]) != m.pins[i] {
						t.Fatalf("block %d: pool %v/%d pins, model %v/%d pins", i, s, p.pins[i], m.state[i], m.pins[i])
					}
				}
			},
		})
		// Release everything the legal way; no block may leak.
		for i := range n {
			id := BlockID(i)
			for range m.pins[i] {
				if err := p.Unpin(id); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			switch m.state[i] {
			case BlockAllocated, BlockPinned:
				err = p.Free(id)
			case BlockQuarantined:
				err = p.ReleaseQuarantine(id)
			case BlockReceiving:
				err = p.FreeReceiving(id)
			}
			if err != nil {
				t.Fatalf("releasing block %d (%v): %v", i, m.state[i], err)
			}
		}
		if s := p.Stats(); s.Free != s.Total || s.Used+s.Pinned+s.Quarantined != 0 {
			t.Fatalf("after releasing everything: %+v", s)
		}
		if err := p.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		if ids, err := p.Alloc(n); err != nil || len(ids) != n {
			t.Fatalf("Alloc(all) after release = %v, %v", ids, err)
		}
	})
}

func BenchmarkPoolAllocFree1(b *testing.B) {
	p := newTestPool(b, 1024)
	b.SetBytes(int64(p.BlockBytes()))
	b.ReportAllocs()
	for b.Loop() {
		ids, err := p.Alloc(1)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Free(ids...); err != nil {
			b.Fatal(err)
		}
	}
}
