package kvcache

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Pool errors beyond the package sentinels of errors.go.
var (
	// ErrBadCount is returned for a negative block count.
	ErrBadCount = errors.New("kvcache: bad block count")
	// ErrBlockFree is returned when a block that is free (not allocated) is
	// pinned.
	ErrBlockFree = errors.New("kvcache: block is free")
	// ErrNotQuarantined is returned when ReleaseQuarantine names a block that
	// is not quarantined.
	ErrNotQuarantined = errors.New("kvcache: block not quarantined")
)

// BlockState is the life-cycle state of one pool block.
//
// Legal transitions, and the Pool method that makes each:
//
//	Free        → Allocated    Alloc
//	Allocated   → Free         Free
//	Allocated   → Pinned       Pin (pin count 0 → 1)
//	Pinned      → Pinned       Pin, Unpin (pin count stays ≥ 1)
//	Pinned      → Allocated    Unpin (pin count 1 → 0)
//	Allocated   → Quarantined  Quarantine
//	Quarantined → Free         ReleaseQuarantine
//
// Every other (state, method) pair is rejected with an error and changes
// nothing. In particular a pinned block cannot be freed or quarantined, and a
// quarantined block cannot be freed, pinned or handed out again until
// ReleaseQuarantine.
type BlockState uint8

const (
	// BlockFree is on the free list and may be handed out by Alloc.
	BlockFree BlockState = iota
	// BlockAllocated belongs to its owner and has no pins.
	BlockAllocated
	// BlockPinned is allocated and has at least one pin: an op in flight may
	// read or write it.
	BlockPinned
	// BlockQuarantined is logically released but may still be the target or
	// source of a write whose quiescence is not proven; it is not reused
	// until ReleaseQuarantine.
	BlockQuarantined
)

func (s BlockState) String() string {
	switch s {
	case BlockFree:
		return "free"
	case BlockAllocated:
		return "allocated"
	case BlockPinned:
		return "pinned"
	case BlockQuarantined:
		return "quarantined"
	}
	return fmt.Sprintf("BlockState(%d)", uint8(s))
}

// PoolStats counts a pool's blocks by state. Total = Free + Used +
// Quarantined; Pinned counts the Used blocks that have at least one pin.
type PoolStats struct {
	Total       int
	Free        int
	Used        int
	Pinned      int
	Quarantined int
}

// Pool hands out fixed-size blocks carved from one Region: block i occupies
// bytes [Offset(i), Offset(i)+BlockBytes()) of the region.
//
// Allocation order: the free list is a stack (LIFO), O(1) per block. A fresh
// pool hands out 0, 1, 2, … in order, and Free pushes its ids so that the
// next Alloc of the same count returns them in the order they were freed —
// so runs of consecutive ids that are freed together come back as runs,
// which keeps plans coalescable.
//
// Every method that takes ids checks all of them before changing anything:
// an error leaves the pool exactly as it was. Errors name the method, the
// block and its state. A Pool is not safe for concurrent use.
type Pool struct {
	region     *Region
	offset     uint64
	blockBytes uint64

	state []BlockState
	pins  []uint32
	free  []BlockID // stack; the top is the last element

	used, pinned, quarantined int
}

// NewPool makes a pool of blocks blocks of blockBytes bytes each, laid out
// back to back in region from byte offset on. All blocks start free. It
// fails with an error wrapping ErrBadRegion when region is nil, blockBytes or
// blocks is not positive, blocks exceeds the BlockID range, or the blocks do
// not fit in the region.
func NewPool(region *Region, offset uint64, blockBytes uint64, blocks int) (*Pool, error) {
	if region == nil {
		return nil, fmt.Errorf("%w: NewPool: region is nil", ErrBadRegion)
	}
	if blockBytes == 0 {
		return nil, fmt.Errorf("%w: NewPool: blockBytes = 0, must be ≥ 1", ErrBadRegion)
	}
	if blocks < 1 || blocks > math.MaxInt32 {
		return nil, fmt.Errorf("%w: NewPool: blocks = %d, must be in [1, %d]", ErrBadRegion, blocks, math.MaxInt32)
	}
	hi, size := bits.Mul64(blockBytes, uint64(blocks))
	if hi != 0 || !region.Contains(offset, size) {
		return nil, fmt.Errorf("%w: NewPool: %d blocks × %d bytes at offset %d do not fit in a %d-byte %v region",
			ErrBadRegion, blocks, blockBytes, offset, region.Len, region.Kind)
	}
	p := &Pool{
		region:     region,
		offset:     offset,
		blockBytes: blockBytes,
		state:      make([]BlockState, blocks),
		pins:       make([]uint32, blocks),
		free:       make([]BlockID, blocks),
	}
	for i := range p.free {
		p.free[i] = BlockID(blocks - 1 - i) // block 0 on top
	}
	return p, nil
}

// Alloc takes n blocks off the free list and marks them allocated. It is
// all-or-nothing: when n exceeds the pool's size it returns an error
// wrapping ErrPoolTooSmall (no Free can help: do not wait), when fewer than
// n blocks are free one wrapping ErrOutOfBlocks (a Free may help), and
// allocates none. Alloc(0) returns an empty slice; a negative n is an error
// wrapping ErrBadCount.
func (p *Pool) Alloc(n int) ([]BlockID, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: Alloc(%d): count must be ≥ 0", ErrBadCount, n)
	}
	if err := p.Geometry().CheckFits(n); err != nil {
		return nil, err
	}
	if n > len(p.free) {
		return nil, fmt.Errorf("%w: Alloc: requested %d blocks, %d free of %d (%d quarantined)",
			ErrOutOfBlocks, n, len(p.free), len(p.state), p.quarantined)
	}
	ids := make([]BlockID, n)
	top := len(p.free)
	for i := range ids {
		id := p.free[top-1-i]
		ids[i] = id
		p.state[id] = BlockAllocated
	}
	p.free = p.free[:top-n]
	p.used += n
	return ids, nil
}

// Free returns allocated blocks to the free list. Every id must name an
// allocated, unpinned block, and no id may appear twice; otherwise Free
// changes nothing and returns an error wrapping ErrUnknownBlock (id out of
// range), ErrDoubleFree (already free, or repeated in ids), ErrBlockPinned
// or ErrBlockQuarantined (use ReleaseQuarantine).
func (p *Pool) Free(ids ...BlockID) error {
	// Mark each block free as it passes, so a repeated id fails as a double
	// free; undo the marks if any id fails.
	for i, id := range ids {
		if err := p.check("Free", id); err != nil {
			p.restore(ids[:i], BlockAllocated)
			return err
		}
		if s := p.state[id]; s != BlockAllocated {
			p.restore(ids[:i], BlockAllocated)
			if contains(ids[:i], id) {
				return fmt.Errorf("%w: Free: block %d listed twice", ErrDoubleFree, id)
			}
			return p.stateError("Free", id, s)
		}
		p.state[id] = BlockFree
	}
	p.push(ids)
	p.used -= len(ids)
	return nil
}

// Pin adds one pin to each listed block; an id listed k times gets k pins.
// Every block must be allocated (pinned or not). A free block is an error
// wrapping ErrBlockFree, a quarantined one ErrBlockQuarantined, an id out of
// range ErrUnknownBlock; on error nothing changes.
func (p *Pool) Pin(ids ...BlockID) error {
	for i, id := range ids {
		err := p.check("Pin", id)
		if err == nil {
			switch s := p.state[id]; {
			case s == BlockAllocated:
				p.state[id] = BlockPinned
				p.pinned++
			case s == BlockPinned && p.pins[id] == math.MaxUint32:
				err = fmt.Errorf("%w: Pin: block %d already has %d pins", ErrBlockPinned, id, p.pins[id])
			case s == BlockPinned:
			default:
				err = p.stateError("Pin", id, s)
			}
		}
		if err != nil {
			p.unpinAll(ids[:i])
			return err
		}
		p.pins[id]++
	}
	return nil
}

// Unpin removes one pin from each listed block; an id listed k times loses k
// pins. A block without a pin left is an error wrapping ErrNotPinned, an id
// out of range ErrUnknownBlock; on error nothing changes.
func (p *Pool) Unpin(ids ...BlockID) error {
	for i, id := range ids {
		if err := p.check("Unpin", id); err != nil {
			p.pinAll(ids[:i])
			return err
		}
		if s := p.state[id]; s != BlockPinned {
			p.pinAll(ids[:i])
			return fmt.Errorf("%w: Unpin: block %d is %v", ErrNotPinned, id, s)
		}
		p.unpinOne(id)
	}
	return nil
}

// Quarantine releases allocated, unpinned blocks into quarantine instead of
// the free list: the owner is done with them, but a write may still land in
// or read from them. They are not handed out again until ReleaseQuarantine,
// which the caller may call only once it has proof of quiescence (DESIGN.md
// §3). Free refuses quarantined blocks. Errors, with nothing changed:
// ErrUnknownBlock (out of range), ErrDoubleFree (free, or an id repeated),
// ErrBlockPinned, ErrBlockQuarantined (already quarantined).
func (p *Pool) Quarantine(ids ...BlockID) error {
	for i, id := range ids {
		if err := p.check("Quarantine", id); err != nil {
			p.restore(ids[:i], BlockAllocated)
			return err
		}
		if s := p.state[id]; s != BlockAllocated {
			p.restore(ids[:i], BlockAllocated)
			if contains(ids[:i], id) {
				return fmt.Errorf("%w: Quarantine: block %d listed twice", ErrDoubleFree, id)
			}
			return p.stateError("Quarantine", id, s)
		}
		p.state[id] = BlockQuarantined
	}
	p.used -= len(ids)
	p.quarantined += len(ids)
	return nil
}

// ReleaseQuarantine returns quarantined blocks to the free list. The caller
// asserts that no write can touch them any more. An id that is not
// quarantined (or is repeated) is an error wrapping ErrNotQuarantined, one
// out of range ErrUnknownBlock; on error nothing changes.
func (p *Pool) ReleaseQuarantine(ids ...BlockID) error {
	for i, id := range ids {
		if err := p.check("ReleaseQuarantine", id); err != nil {
			p.restore(ids[:i], BlockQuarantined)
			return err
		}
		if s := p.state[id]; s != BlockQuarantined {
			p.restore(ids[:i], BlockQuarantined)
			if contains(ids[:i], id) {
				return fmt.Errorf("%w: ReleaseQuarantine: block %d listed twice", ErrNotQuarantined, id)
			}
			return fmt.Errorf("%w: ReleaseQuarantine: block %d is %v", ErrNotQuarantined, id, s)
		}
		p.state[id] = BlockFree
	}
	p.push(ids)
	p.quarantined -= len(ids)
	return nil
}

// State returns the state of block id, or an error wrapping ErrUnknownBlock.
func (p *Pool) State(id BlockID) (BlockState, error) {
	if err := p.check("State", id); err != nil {
		return 0, err
	}
	return p.state[id], nil
}

// Offset returns the byte offset of block id in the pool's region. It
// panics if id is out of range, as indexing a slice would.
func (p *Pool) Offset(id BlockID) uint64 {
	if id < 0 || int(id) >= len(p.state) {
		panic(fmt.Sprintf("kvcache: Pool.Offset(%d): block out of range [0, %d)", id, len(p.state)))
	}
	return p.offset + uint64(id)*p.blockBytes
}

// Block returns the bytes of block id for a host region, or nil for a
// device region. It panics if id is out of range.
func (p *Pool) Block(id BlockID) []byte {
	off := p.Offset(id)
	b := p.region.Bytes()
	if b == nil {
		return nil
	}
	return b[off : off+p.blockBytes : off+p.blockBytes]
}

// BlockBytes returns the size of one block in bytes.
func (p *Pool) BlockBytes() uint64 { return p.blockBytes }

// Region returns the region the pool carves its blocks from.
func (p *Pool) Region() *Region { return p.region }

// Len returns the total number of blocks.
func (p *Pool) Len() int { return len(p.state) }

// Geometry returns where the pool's blocks lie in its region: block 0's
// offset, the block size and the number of blocks.
func (p *Pool) Geometry() PoolGeometry {
	return PoolGeometry{Offset: p.offset, BlockBytes: p.blockBytes, Blocks: len(p.state)}
}

// CheckFits reports whether a request for n blocks can ever be satisfied by
// a pool of this geometry, however many blocks are free now. It returns nil
// when 0 ≤ n ≤ Blocks; an error wrapping ErrPoolTooSmall that names n, the
// block size, the bytes n blocks take and the pool's size when n > Blocks;
// and one wrapping ErrBadCount when n < 0. A caller that waits for free
// blocks (an allocation queue, a semaphore) checks it first and fails at
// once instead of waiting for ever; the caller adds the request and the
// layer group to the message.
func (g PoolGeometry) CheckFits(n int) error {
	switch {
	case n < 0:
		return fmt.Errorf("%w: %d blocks: count must be ≥ 0", ErrBadCount, n)
	case n <= g.Blocks:
		return nil
	}
	need := ""
	if hi, lo := bits.Mul64(uint64(n), g.BlockBytes); hi == 0 {
		need = " (" + formatBytes(lo) + ")"
	}
	return fmt.Errorf("%w: need %d blocks of %s%s, the pool holds %d (%s)",
		ErrPoolTooSmall, n, formatBytes(g.BlockBytes), need, g.Blocks, formatBytes(uint64(g.Blocks)*g.BlockBytes))
}

// formatBytes writes n with the largest binary unit that divides it, as
// kvxfer's size flags take it: 10485760 is "10MiB", 1000 is "1000B".
func formatBytes(n uint64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// Stats returns the pool's block counts.
func (p *Pool) Stats() PoolStats {
	return PoolStats{
		Total:       len(p.state),
		Free:        len(p.free),
		Used:        p.used,
		Pinned:      p.pinned,
		Quarantined: p.quarantined,
	}
}

// CheckInvariants recomputes the counts from per-block state and checks them
// against Stats, checks that a block has pins exactly when it is pinned, and
// that the free list holds each free block exactly once. It costs O(blocks)
// and is meant for tests and the simulator.
func (p *Pool) CheckInvariants() error {
	var count [BlockQuarantined + 1]int
	for i, s := range p.state {
		if s > BlockQuarantined {
			return fmt.Errorf("kvcache: pool invariant: block %d has invalid state %v", i, s)
		}
		count[s]++
		if (s == BlockPinned) != (p.pins[i] > 0) {
			return fmt.Errorf("kvcache: pool invariant: block %d is %v with %d pins", i, s, p.pins[i])
		}
	}
	onList := make([]bool, len(p.state))
	for _, id := range p.free {
		if id < 0 || int(id) >= len(p.state) {
			return fmt.Errorf("kvcache: pool invariant: free list holds out-of-range block %d", id)
		}
		if onList[id] {
			return fmt.Errorf("kvcache: pool invariant: free list holds block %d twice", id)
		}
		onList[id] = true
		if p.state[id] != BlockFree {
			return fmt.Errorf("kvcache: pool invariant: free list holds block %d, which is %v", id, p.state[id])
		}
	}
	want := PoolStats{
		Total:       len(p.state),
		Free:        count[BlockFree],
		Used:        count[BlockAllocated] + count[BlockPinned],
		Pinned:      count[BlockPinned],
		Quarantined: count[BlockQuarantined],
	}
	if got := p.Stats(); got != want {
		return fmt.Errorf("kvcache: pool invariant: counters %+v, per-block state says %+v", got, want)
	}
	if want.Free+want.Used+want.Quarantined != want.Total {
		return fmt.Errorf("kvcache: pool invariant: %+v does not add up", want)
	}
	return nil
}

// check rejects an out-of-range id.
func (p *Pool) check(op string, id BlockID) error {
	if id < 0 || int(id) >= len(p.state) {
		return fmt.Errorf("%w: %s: block %d out of range [0, %d)", ErrUnknownBlock, op, id, len(p.state))
	}
	return nil
}

// stateError is the error for op on a block in state s when op is illegal
// there.
func (p *Pool) stateError(op string, id BlockID, s BlockState) error {
	var sentinel error
	switch s {
	case BlockFree:
		sentinel = ErrDoubleFree
		if op == "Pin" {
			sentinel = ErrBlockFree
		}
	case BlockPinned:
		sentinel = ErrBlockPinned
	case BlockQuarantined:
		sentinel = ErrBlockQuarantined
	default:
		sentinel = ErrUnknownBlock
	}
	return fmt.Errorf("%w: %s: block %d is %v", sentinel, op, id, s)
}

// restore sets the blocks of a partially applied call back to state s.
func (p *Pool) restore(ids []BlockID, s BlockState) {
	for _, id := range ids {
		p.state[id] = s
	}
}

// push puts freed blocks on the free list so that the next Alloc pops them
// in the order given.
func (p *Pool) push(ids []BlockID) {
	for i := len(ids) - 1; i >= 0; i-- {
		p.free = append(p.free, ids[i])
	}
}

func (p *Pool) pinAll(ids []BlockID) {
	for _, id := range ids {
		if p.pins[id] == 0 {
			p.state[id] = BlockPinned
			p.pinned++
		}
		p.pins[id]++
	}
}

func (p *Pool) unpinAll(ids []BlockID) {
	for _, id := range ids {
		p.unpinOne(id)
	}
}

func (p *Pool) unpinOne(id BlockID) {
	p.pins[id]--
	if p.pins[id] == 0 {
		p.state[id] = BlockAllocated
		p.pinned--
	}
}

func contains(ids []BlockID, id BlockID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
