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
	// pinned or lent, or freed or quarantined as allocated (those errors
	// wrap ErrDoubleFree too: the pool cannot tell a block never handed
	// out from one freed already).
	ErrBlockFree = errors.New("kvcache: block is free")
	// ErrNotQuarantined is returned when ReleaseQuarantine names a block that
	// is not quarantined.
	ErrNotQuarantined = errors.New("kvcache: block not quarantined")
	// ErrBlockReceiving is returned when a block that a live receive owns
	// (BlockReceiving) is freed, quarantined, pinned or lent by its
	// caller: until the receive hands it over (HandOver) or gives it up
	// itself (FreeReceiving, QuarantineReceiving), writes may land in it.
	ErrBlockReceiving = errors.New("kvcache: block owned by a live receive")
	// ErrNotReceiving is returned when HandOver, FreeReceiving or
	// QuarantineReceiving names a block that no live receive owns.
	ErrNotReceiving = errors.New("kvcache: block not receiving")
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
//	Free        → Receiving    AllocReceiving
//	Allocated   → Receiving    Lend
//	Receiving   → Allocated    HandOver
//	Receiving   → Free         FreeReceiving
//	Receiving   → Quarantined  QuarantineReceiving
//
// Every other (state, method) pair is rejected with an error and changes
// nothing. In particular a pinned block cannot be freed or quarantined, a
// quarantined block cannot be freed, pinned or handed out again until
// ReleaseQuarantine, and a receiving block is left only by the receive
// that owns it: Free, Quarantine, Pin and Lend refuse it (ErrBlockReceiving).
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
	// BlockReceiving is owned by a live receive: writes for it may land
	// in it, from its allocation (AllocReceiving), or from its caller's
	// lending it (Lend), until the receive hands it over to its caller
	// (HandOver) or gives it up itself (FreeReceiving,
	// QuarantineReceiving). Its caller cannot free, quarantine or pin it.
	BlockReceiving
)

// blockMarked is the transient state Check gives the blocks it has seen,
// to find an id named twice; no block keeps it.
const blockMarked BlockState = math.MaxUint8

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
	case BlockReceiving:
		return "receiving"
	}
	return fmt.Sprintf("BlockState(%d)", uint8(s))
}

// PoolStats counts a pool's blocks by state. Total = Free + Used +
// Quarantined; Pinned counts the Used blocks that have at least one pin,
// Receiving the Used blocks a live receive owns.
type PoolStats struct {
	Total       int
	Free        int
	Used        int
	Pinned      int
	Quarantined int
	Receiving   int
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
	// at[id] is block id's index in free while it is free (Reserve
	// takes a block out of the middle of the stack in O(1)).
	at []int32

	used, pinned, quarantined, receiving int
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
		at:         make([]int32, blocks),
	}
	for i := range p.free {
		p.free[i] = BlockID(blocks - 1 - i) // block 0 on top
		p.at[blocks-1-i] = int32(i)
	}
	return p, nil
}

// Alloc takes n blocks off the free list and marks them allocated. It is
// all-or-nothing: when n exceeds the pool's size it returns an error
// wrapping ErrPoolTooSmall (no Free can help: do not wait), when fewer than
// n blocks are free one wrapping ErrOutOfBlocks (a Free may help), and
// allocates none. Alloc(0) returns an empty slice; a negative n is an error
// wrapping ErrBadCount.
func (p *Pool) Alloc(n int) ([]BlockID, error) { return p.alloc("Alloc", n, BlockAllocated) }

// AllocReceiving is Alloc for a receive's destination blocks: they are
// marked receiving (owned by the live receive) instead of allocated.
func (p *Pool) AllocReceiving(n int) ([]BlockID, error) {
	ids, err := p.alloc("AllocReceiving", n, BlockReceiving)
	if err == nil {
		p.receiving += n
	}
	return ids, err
}

func (p *Pool) alloc(op string, n int, to BlockState) ([]BlockID, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: %s(%d): count must be ≥ 0", ErrBadCount, op, n)
	}
	if err := p.Geometry().CheckFits(n); err != nil {
		return nil, err
	}
	if n > len(p.free) {
		return nil, fmt.Errorf("%w: %s: requested %d blocks, %d free of %d (%d quarantined)",
			ErrOutOfBlocks, op, n, len(p.free), len(p.state), p.quarantined)
	}
	ids := make([]BlockID, n)
	top := len(p.free)
	for i := range ids {
		id := p.free[top-1-i]
		ids[i] = id
		p.state[id] = to
	}
	p.free = p.free[:top-n]
	p.used += n
	return ids, nil
}

// Free returns allocated blocks to the free list. Every id must name an
// allocated, unpinned block, and no id may appear twice; otherwise Free
// changes nothing and returns an error wrapping ErrUnknownBlock (id out of
// range), ErrDoubleFree (repeated in ids, or free: then ErrBlockFree too,
// the text saying the block is not allocated), ErrBlockPinned,
// ErrBlockQuarantined (use ReleaseQuarantine) or ErrBlockReceiving (a live
// receive owns it).
func (p *Pool) Free(ids ...BlockID) error {
	if err := p.move("Free", BlockAllocated, BlockFree, ids); err != nil {
		return err
	}
	p.push(ids)
	p.used -= len(ids)
	return nil
}

// FreeReceiving returns blocks a live receive owns to the free list: the
// receive failed and no write can reach them any more. Every id must be
// receiving, none repeated; otherwise nothing changes and the error wraps
// ErrUnknownBlock, ErrDoubleFree (free, or repeated) or ErrNotReceiving.
func (p *Pool) FreeReceiving(ids ...BlockID) error {
	if err := p.move("FreeReceiving", BlockReceiving, BlockFree, ids); err != nil {
		return err
	}
	p.push(ids)
	p.used -= len(ids)
	p.receiving -= len(ids)
	return nil
}

// Lend marks allocated blocks receiving: their owner lends them to a live
// receive, and gets them back allocated by HandOver. Errors, with nothing
// changed: ErrUnknownBlock, ErrBlockFree, ErrBlockPinned,
// ErrBlockQuarantined, ErrBlockReceiving (another receive owns it),
// ErrDoubleFree (an id repeated).
func (p *Pool) Lend(ids ...BlockID) error {
	if err := p.move("Lend", BlockAllocated, BlockReceiving, ids); err != nil {
		return err
	}
	p.receiving += len(ids)
	return nil
}

// Reserve marks free blocks receiving, off the free list: the caller
// allocated them elsewhere (a serving framework with its own block table)
// and lends them to a live receive, so that no Alloc hands them out while
// a write may reach them. FreeReceiving puts them back. Errors, with
// nothing changed: ErrUnknownBlock, ErrDoubleFree (an id repeated), or
// the block's state (ErrBlockReceiving: another receive owns it).
func (p *Pool) Reserve(ids ...BlockID) error {
	if err := p.move("Reserve", BlockFree, BlockReceiving, ids); err != nil {
		return err
	}
	for _, id := range ids {
		i, last := p.at[id], p.free[len(p.free)-1]
		p.free[i], p.at[last] = last, i
		p.free = p.free[:len(p.free)-1]
	}
	p.used += len(ids)
	p.receiving += len(ids)
	return nil
}

// HandOver gives blocks a live receive owns to its caller: they become
// allocated (the caller frees them with Free). Errors, with nothing
// changed: ErrUnknownBlock, ErrDoubleFree (free, or an id repeated),
// ErrNotReceiving.
func (p *Pool) HandOver(ids ...BlockID) error {
	if err := p.move("HandOver", BlockReceiving, BlockAllocated, ids); err != nil {
		return err
	}
	p.receiving -= len(ids)
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
// ErrUnknownBlock (out of range), ErrDoubleFree (free: then ErrBlockFree
// too; or an id repeated), ErrBlockPinned, ErrBlockQuarantined (already
// quarantined), ErrBlockReceiving.
func (p *Pool) Quarantine(ids ...BlockID) error {
	if err := p.move("Quarantine", BlockAllocated, BlockQuarantined, ids); err != nil {
		return err
	}
	p.used -= len(ids)
	p.quarantined += len(ids)
	return nil
}

// QuarantineReceiving is Quarantine for blocks a live receive owns: the
// receive failed without proof that its writers stopped. Errors, with
// nothing changed: ErrUnknownBlock, ErrDoubleFree (free, or an id
// repeated), ErrNotReceiving.
func (p *Pool) QuarantineReceiving(ids ...BlockID) error {
	if err := p.move("QuarantineReceiving", BlockReceiving, BlockQuarantined, ids); err != nil {
		return err
	}
	p.used -= len(ids)
	p.receiving -= len(ids)
	p.quarantined += len(ids)
	return nil
}

// ReleaseQuarantine returns quarantined blocks to the free list. The caller
// asserts that no write can touch them any more. An id that is not
// quarantined (or is repeated) is an error wrapping ErrNotQuarantined, one
// out of range ErrUnknownBlock; on error nothing changes.
func (p *Pool) ReleaseQuarantine(ids ...BlockID) error {
	if err := p.move("ReleaseQuarantine", BlockQuarantined, BlockFree, ids); err != nil {
		return err
	}
	p.push(ids)
	p.quarantined -= len(ids)
	return nil
}

// Check returns the error that a call op moving ids out of state from
// (Free: allocated, FreeReceiving: receiving, ReleaseQuarantine:
// quarantined, …) would return, and changes nothing: a caller that changes
// several pools checks every one first, so that it changes all or none.
func (p *Pool) Check(op string, from BlockState, ids ...BlockID) error {
	if err := p.move(op, from, blockMarked, ids); err != nil {
		return err
	}
	p.restore(ids, from)
	return nil
}

// move sets every id from state from to state to, all or nothing. It marks
// each block as it passes, so that an id named twice fails; on an error it
// undoes the marks.
func (p *Pool) move(op string, from, to BlockState, ids []BlockID) error {
	for i, id := range ids {
		if err := p.check(op, id); err != nil {
			p.restore(ids[:i], from)
			return err
		}
		if s := p.state[id]; s != from {
			p.restore(ids[:i], from)
			return p.moveError(op, from, id, s, contains(ids[:i], id))
		}
		p.state[id] = to
	}
	return nil
}

// moveError is the error of a move out of state from that met block id in
// state s (twice: named twice in the call).
func (p *Pool) moveError(op string, from BlockState, id BlockID, s BlockState, twice bool) error {
	switch {
	case from == BlockQuarantined && twice:
		return fmt.Errorf("%w: %s: block %d listed twice", ErrNotQuarantined, op, id)
	case from == BlockQuarantined:
		return fmt.Errorf("%w: %s: block %d is %v", ErrNotQuarantined, op, id, s)
	case twice:
		return fmt.Errorf("%w: %s: block %d listed twice", ErrDoubleFree, op, id)
	case from == BlockReceiving && s != BlockFree:
		return fmt.Errorf("%w: %s: block %d is %v", ErrNotReceiving, op, id, s)
	case from == BlockAllocated && s == BlockFree && op != "Lend":
		// Free or Quarantine of a free block: never handed out, or freed
		// already; a "double free" only in the second case.
		return alsoIs{fmt.Errorf("%w: %s: block %d is not allocated (it is free: never handed out, or freed already)",
			ErrBlockFree, op, id), ErrDoubleFree}
	}
	return p.stateError(op, id, s)
}

// alsoIs is an error that errors.Is also matches with another sentinel,
// which its text does not repeat.
type alsoIs struct {
	error
	also error
}

func (e alsoIs) Unwrap() []error { return []error{e.error, e.also} }

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
		Receiving:   p.receiving,
	}
}

// CheckInvariants recomputes the counts from per-block state and checks them
// against Stats, checks that a block has pins exactly when it is pinned, and
// that the free list holds each free block exactly once. It costs O(blocks)
// and is meant for tests and the simulator.
func (p *Pool) CheckInvariants() error {
	var count [BlockReceiving + 1]int
	for i, s := range p.state {
		if s > BlockReceiving {
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
		if int(p.at[id]) >= len(p.free) || p.free[p.at[id]] != id {
			return fmt.Errorf("kvcache: pool invariant: free block %d's index in the free list is wrong", id)
		}
		if p.state[id] != BlockFree {
			return fmt.Errorf("kvcache: pool invariant: free list holds block %d, which is %v", id, p.state[id])
		}
	}
	want := PoolStats{
		Total:       len(p.state),
		Free:        count[BlockFree],
		Used:        count[BlockAllocated] + count[BlockPinned] + count[BlockReceiving],
		Pinned:      count[BlockPinned],
		Quarantined: count[BlockQuarantined],
		Receiving:   count[BlockReceiving],
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
		if op == "Pin" || op == "Lend" {
			sentinel = ErrBlockFree
		}
	case BlockPinned:
		sentinel = ErrBlockPinned
	case BlockQuarantined:
		sentinel = ErrBlockQuarantined
	case BlockReceiving:
		return fmt.Errorf("%w: %s: block %d is receiving: a live request owns it until its READY hands it over or it ends",
			ErrBlockReceiving, op, id)
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
		p.at[ids[i]] = int32(len(p.free))
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
