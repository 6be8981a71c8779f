package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"unsafe"

	"github.com/kvxfer/kvxfer/kvcache"
)

// ErrNoSpare: a Revoke needs more spare blocks than the region's reserve has
// free (the rest are in use or still quarantined). Nothing was changed; the
// caller keeps the blocks quarantined the plain way until proof arrives.
var ErrNoSpare = errors.New("shm: spare reserve exhausted")

// ErrBadRange: an offset or length given to a RevocableRegion is not
// block-aligned, empty, or outside the region.
var ErrBadRange = errors.New("shm: bad revocation range")

// RevocableOptions configure NewRevocableRegion.
type RevocableOptions struct {
	// Name is the region file's base name; empty picks a unique one.
	Name string
	// Block is the unit of revocation and of the indirection table, in
	// bytes: a positive multiple of the page size. The region's length and
	// Spare are multiples of it. A pool's block (or a multiple of it) is
	// the natural choice.
	Block uint64
	// Spare is the reserve of spare file bytes, a multiple of Block. A
	// Revoke of k blocks takes k free spare blocks; ReleaseRevoked gives
	// them back. Zero is allowed: every Revoke then fails with ErrNoSpare.
	Spare uint64
	// Populate faults the new pages of a Revoke in at once
	// (MAP_POPULATE), so that the first touch of a revoked block does not
	// fault page by page. It makes Revoke dearer by about the cost of
	// those faults.
	Populate bool
}

// RevocableRegion is a shared region (as NewRegion makes) whose receiver can
// take blocks back from writers without their help.
//
// A writer maps the region file and copies at file offsets; a stopped
// writer that resumes finishes its copy into whatever pages back those
// offsets, and nothing the receiver does to its own mapping can change the
// writer's. What the receiver can move is its own view: the region file
// holds, after the region's n bytes, a reserve of spare blocks, and Revoke
// maps free spare blocks over a range of the view (mmap MAP_FIXED of the
// same file). From then on the view's addresses — and every pointer into
// them — show the spare pages; the file blocks they showed before, the only
// memory a stale writer can reach, are quarantined until ReleaseRevoked,
// which the caller calls once it has proof that the writer's writes are
// over (its exit, its terminal frame, a completed flush).
//
// Writers therefore write at file offsets, not view offsets: FileOffset,
// Translate and Indirection give the block → file offset table a receiver
// sends with each request. Until a block is revoked its file offset is its
// view offset, so a region that never revokes behaves as NewRegion's.
// Register the Region with an Agent as any shared region; the
// registration's RemoteRegion.Len is the file's data length (region plus
// spare), the range writers may address.
//
// A revoked block shows the spare block's old contents (not zeros): the
// caller treats it as a newly allocated block. A RevocableRegion is safe for
// concurrent use; Revoke changes what the view shows under readers of the
// revoked range, which the caller must not be using (it is quarantined).
//
// Each remap may split the kernel's mapping of the view (vm.max_map_count,
// 65530 by default, bounds the pieces per process); Revoke maps runs of
// contiguous spare blocks with one mmap, and adjacent pieces with adjacent
// file offsets merge again.
type RevocableRegion struct {
	f        *sharedFile
	closer   regionCloser
	block    uint64
	nview    int // blocks in the view
	populate bool

	mu    sync.Mutex
	file  *os.File // kept open for remaps; nil once closed
	table []uint64 // view block → file data offset
	// moved has a bit per view block whose file offset is not its own
	// (Remap skips the rest a word at a time).
	moved  []uint64
	state  []slotState
	free   int // spare file blocks free
	quar   int // file blocks quarantined
	broken error
}

type slotState uint8

const (
	slotView slotState = iota // shown by a view block
	slotFree                  // in the spare reserve
	slotQuar                  // revoked: a stale writer may write it
)

// Revocation is the quarantined file range of one Revoke, to pass to
// ReleaseRevoked once proof arrives.
type Revocation struct {
	r        *RevocableRegion
	off, n   uint64   // the view range revoked
	old      []uint64 // the file data offsets of its blocks, quarantined
	released bool     // guarded by r.mu
}

// Off and Len are the view range the Revocation revoked.
func (v *Revocation) Off() uint64 { return v.off }
func (v *Revocation) Len() uint64 { return v.n }

// FileOffsets are the quarantined file data offsets, one per block.
func (v *Revocation) FileOffsets() []uint64 { return append([]uint64(nil), v.old...) }

// NewRevocableRegion creates a region file of n bytes of region plus
// o.Spare bytes of spare reserve, maps it, and returns the revocable region.
// Close removes the file (as NewRegion's Closer).
func NewRevocableRegion(n uint64, o RevocableOptions) (*RevocableRegion, error) {
	page := uint64(os.Getpagesize())
	switch {
	case o.Block == 0 || o.Block%page != 0:
		return nil, fmt.Errorf("shm: new revocable region: %w: block %d bytes is not a positive multiple of the page size %d", ErrBadRange, o.Block, page)
	case n == 0 || n%o.Block != 0:
		return nil, fmt.Errorf("shm: new revocable region: %w: length %d is not a positive multiple of the block %d", ErrBadRange, n, o.Block)
	case o.Spare%o.Block != 0:
		return nil, fmt.Errorf("shm: new revocable region: %w: spare %d is not a multiple of the block %d", ErrBadRange, o.Spare, o.Block)
	case (n+o.Spare)/o.Block > 1<<31:
		return nil, fmt.Errorf("shm: new revocable region: %w: %d blocks of %d bytes, at most 2^31", ErrBadRange, (n+o.Spare)/o.Block, o.Block)
	}
	sf, f, err := newSharedFile(o.Name, n, o.Spare)
	if err != nil {
		return nil, err
	}
	nview, nspare := int(n/o.Block), int(o.Spare/o.Block)
	r := &RevocableRegion{f: sf, closer: regionCloser{sf}, block: o.Block, nview: nview, populate: o.Populate,
		file: f, table: make([]uint64, nview), state: make([]slotState, nview+nspare), free: nspare}
	for i := range r.table {
		r.table[i] = uint64(i) * o.Block
	}
	for i := nview; i < len(r.state); i++ {
		r.state[i] = slotFree
	}
	return r, nil
}

// Region is the receiver's view: n bytes at a fixed address, for the pool.
func (r *RevocableRegion) Region() *kvcache.Region { return r.f.region }

// BlockSize is the unit of revocation.
func (r *RevocableRegion) BlockSize() uint64 { return r.block }

// Spare says how many spare blocks are free and how many file blocks are
// quarantined by revocations not yet released.
func (r *RevocableRegion) Spare() (free, quarantined int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.free, r.quar
}

// Unlink removes the region file's name and keeps the mapping (see
// regionCloser.Unlink).
func (r *RevocableRegion) Unlink() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closer.Unlink()
}

// Close removes the region file and unmaps it; it fails with
// rdma.ErrRegionBusy while the region is registered. Quarantined blocks
// go with the file (a writer's mapping keeps its pages until it unmaps).
// Idempotent.
func (r *RevocableRegion) Close() error {
	r.mu.Lock() // no remap while the view is unmapped
	defer r.mu.Unlock()
	if err := r.closer.Close(); err != nil {
		return err
	}
	if r.file != nil {
		r.file.Close()
		r.file = nil
	}
	return nil
}

// checkRange checks that [off, off+n) is a non-empty, block-aligned range of
// the view and returns its first block and block count.
func (r *RevocableRegion) checkRange(op string, off, n uint64) (int, int, error) {
	size := uint64(r.nview) * r.block
	switch {
	case n == 0 || off%r.block != 0 || n%r.block != 0:
		return 0, 0, fmt.Errorf("shm: %s [%d, +%d) of %s: %w: offset and length must be multiples of the block %d, length > 0",
			op, off, n, r.f.path, ErrBadRange, r.block)
	case off > size || n > size-off:
		return 0, 0, fmt.Errorf("shm: %s [%d, +%d) of %s: %w: outside the %d-byte region", op, off, n, r.f.path, ErrBadRange, size)
	}
	return int(off / r.block), int(n / r.block), nil
}

// usable is checked with mu held.
func (r *RevocableRegion) usable(op string) error {
	switch {
	case r.broken != nil:
		return fmt.Errorf("shm: %s %s: %w", op, r.f.path, r.broken)
	case r.file == nil:
		return fmt.Errorf("shm: %s %s: %w: region closed", op, r.f.path, kvcache.ErrBadRegion)
	}
	return nil
}

// Revoke takes the view range [off, off+n) (block-aligned) back from every
// writer: it maps free spare blocks over it, so that the range's addresses
// show pages no writer has been told about, and quarantines the file blocks
// it showed before. The range's blocks are usable at once; writers must be
// sent their new file offsets (FileOffset, Translate, Indirection) before
// they write there. With fewer than n/Block free spare blocks it fails with
// ErrNoSpare and changes nothing.
func (r *RevocableRegion) Revoke(off, n uint64) (*Revocation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable("revoke"); err != nil {
		return nil, err
	}
	first, k, err := r.checkRange("revoke", off, n)
	if err != nil {
		return nil, err
	}
	if k > r.free {
		return nil, fmt.Errorf("shm: revoke [%d, +%d) of %s: %w: %d blocks wanted, %d spare free, %d quarantined",
			off, n, r.f.path, ErrNoSpare, k, r.free, r.quar)
	}
	slots := r.pick(k)
	old := make([]uint64, k)
	copy(old, r.table[first:first+k])
	// One mmap per run of consecutive spare slots.
	done := 0
	for done < k {
		run := 1
		for done+run < k && slots[done+run] == slots[done+run-1]+1 {
			run++
		}
		if err := r.remap(first+done, run, uint64(slots[done])*r.block); err != nil {
			if rerr := r.restore(first, old[:done]); rerr != nil {
				r.broken = fmt.Errorf("view left inconsistent by a failed revoke (%v) and a failed restore: %w", err, rerr)
				return nil, fmt.Errorf("shm: revoke [%d, +%d) of %s: %w", off, n, r.f.path, r.broken)
			}
			return nil, fmt.Errorf("shm: revoke [%d, +%d) of %s: %w", off, n, r.f.path, err)
		}
		done += run
	}
	for i, s := range slots {
		r.state[s] = slotView
		r.state[old[i]/r.block] = slotQuar
		r.table[first+i] = uint64(s) * r.block
		b := first + i
		if r.moved == nil {
			r.moved = make([]uint64, (r.nview+63)/64)
		}
		if r.table[b] == uint64(b)*r.block {
			r.moved[b/64] &^= 1 << (b % 64)
		} else {
			r.moved[b/64] |= 1 << (b % 64)
		}
	}
	r.free -= k
	r.quar += k
	return &Revocation{r: r, off: off, n: n, old: old}, nil
}

// pick chooses k free spare slots: the first run of k consecutive ones if
// there is one (one mmap), else the first k free. Called with mu held.
func (r *RevocableRegion) pick(k int) []uint32 {
	out := make([]uint32, 0, k)
	for i, run := 0, 0; i < len(r.state); i++ {
		if r.state[i] != slotFree {
			run = 0
			continue
		}
		if run++; run == k {
			for s := i - k + 1; s <= i; s++ {
				out = append(out, uint32(s))
			}
			return out
		}
	}
	for i := 0; len(out) < k; i++ {
		if r.state[i] == slotFree {
			out = append(out, uint32(i))
		}
	}
	return out
}

// remap maps count file blocks from file data offset foff over view blocks
// from first.
func (r *RevocableRegion) remap(first, count int, foff uint64) error {
	view := r.f.region.Bytes()
	addr := uintptr(unsafe.Pointer(&view[uint64(first)*r.block]))
	n := uint64(count) * r.block
	if err := mapFixed(r.file, addr, int(n), int64(headerSize+foff), r.populate); err != nil {
		return fmt.Errorf("map file [%d, +%d) over view [%d, +%d): %w", foff, n, uint64(first)*r.block, n, err)
	}
	return nil
}

// restore maps the file blocks old back over view blocks from first.
func (r *RevocableRegion) restore(first int, old []uint64) error {
	for i, foff := range old {
		if err := r.remap(first+i, 1, foff); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseRevoked returns a Revocation's quarantined file blocks to the spare
// reserve. Call it only with proof that no writer can still write them.
// A second release of one Revocation fails and changes nothing.
func (r *RevocableRegion) ReleaseRevoked(v *Revocation) error {
	if v == nil || v.r != r {
		return fmt.Errorf("shm: release revoked of %s: %w: not a revocation of this region", r.f.path, ErrBadRange)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v.released {
		return fmt.Errorf("shm: release revoked [%d, +%d) of %s: %w: already released", v.off, v.n, r.f.path, ErrBadRange)
	}
	v.released = true
	for _, foff := range v.old {
		r.state[foff/r.block] = slotFree
	}
	r.free += len(v.old)
	r.quar -= len(v.old)
	return nil
}

// FileOffset is the file data offset writers must write at for view offset
// off (any offset in the region).
func (r *RevocableRegion) FileOffset(off uint64) (uint64, error) {
	if off >= uint64(r.nview)*r.block {
		return 0, fmt.Errorf("shm: file offset of %d in %s: %w: outside the %d-byte region", off, r.f.path, ErrBadRange, uint64(r.nview)*r.block)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table[off/r.block] + off%r.block, nil
}

// Indirection returns the table entries of the blocks covering the view
// range [off, off+n) (any offsets; n > 0): what a writer needs to write
// into that range.
func (r *RevocableRegion) Indirection(off, n uint64) (Indirection, error) {
	size := uint64(r.nview) * r.block
	if n == 0 || off > size || n > size-off {
		return Indirection{}, fmt.Errorf("shm: indirection of [%d, +%d) in %s: %w: empty or outside the %d-byte region", off, n, r.f.path, ErrBadRange, size)
	}
	first, end := off/r.block, (off+n+r.block-1)/r.block
	r.mu.Lock()
	defer r.mu.Unlock()
	return Indirection{Block: r.block, First: first, Files: append([]uint64(nil), r.table[first:end]...)}, nil
}

// Translate rewrites segments whose Dst are view offsets into segments whose
// Dst are file offsets (the receiver-side form of Indirection.Translate),
// splitting a segment where consecutive view blocks are not consecutive in
// the file.
func (r *RevocableRegion) Translate(segs []kvcache.Segment) ([]kvcache.Segment, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Indirection{Block: r.block, Files: r.table}.Translate(segs)
}

// Indirection maps view blocks First, First+1, … to file data offsets: the
// table a receiver of a RevocableRegion sends writers so that they write
// where its view shows.
type Indirection struct {
	Block uint64   // bytes per block
	First uint64   // the view block of Files[0]
	Files []uint64 // file data offset of view block First+i
}

// Translate rewrites segments whose Dst are view offsets into segments whose
// Dst are file offsets, splitting a segment at a block boundary where the
// file offsets are not consecutive. A Dst range outside the table's blocks,
// or one whose file offsets would pass 2^64 (a corrupt table: no file is
// that long), is an error naming the segment (ErrBadRange).
func (ix Indirection) Translate(segs []kvcache.Segment) ([]kvcache.Segment, error) {
	if ix.Block == 0 {
		return nil, fmt.Errorf("shm: translate: %w: indirection with block size 0", ErrBadRange)
	}
	if maxBlocks := math.MaxUint64 / ix.Block; ix.First > maxBlocks || uint64(len(ix.Files)) > maxBlocks-ix.First {
		return nil, fmt.Errorf("shm: translate: %w: indirection of %d blocks of %d bytes from block %d ends past 2^64",
			ErrBadRange, len(ix.Files), ix.Block, ix.First)
	}
	lo := ix.First * ix.Block
	hi := lo + uint64(len(ix.Files))*ix.Block
	out := make([]kvcache.Segment, 0, len(segs))
	for i, s := range segs {
		if s.Len == 0 {
			continue
		}
		if s.Dst < lo || s.Dst > hi || s.Len > hi-s.Dst {
			return nil, fmt.Errorf("shm: translate segment %d (dst [%d, +%d)): %w: outside the table's view range [%d, %d)", i, s.Dst, s.Len, ErrBadRange, lo, hi)
		}
		src, dst, left := s.Src, s.Dst, s.Len
		for left > 0 {
			in := dst % ix.Block
			n := min(ix.Block-in, left)
			fb := ix.Files[dst/ix.Block-ix.First]
			if fb > math.MaxUint64-in-n { // in+n <= Block: no underflow
				return nil, fmt.Errorf("shm: translate segment %d (dst [%d, +%d)): %w: the table puts view block %d at file offset %d, where the segment's bytes (%d into the block, %d long) pass 2^64: the table is corrupt, refuse the transfer",
					i, s.Dst, s.Len, ErrBadRange, dst/ix.Block, fb, in, n)
			}
			f := fb + in
			if last := len(out) - 1; last >= 0 && left != s.Len &&
				out[last].Dst+out[last].Len == f && out[last].Src+out[last].Len == src {
				out[last].Len += n
			} else {
				out = append(out, kvcache.Segment{Src: src, Dst: f, Len: n})
			}
			src, dst, left = src+n, dst+n, left-n
		}
	}
	return out, nil
}

// Revoker is r as a kvcache.Revoker, for an engine (kvxfer.Config.Revoker).
func (r *RevocableRegion) Revoker() kvcache.Revoker { return revoker{r} }

type revoker struct{ r *RevocableRegion }

func (v revoker) Revoke(off, n uint64) (func() error, error) {
	rv, err := v.r.Revoke(off, n)
	if err != nil {
		return nil, err
	}
	return func() error { return v.r.ReleaseRevoked(rv) }, nil
}

// Remap implements kvcache.Revoker: the runs of [off, off+n) whose file
// offset is not their view offset, each as long as the file offsets stay
// consecutive.
func (v revoker) Remap(dst []kvcache.Extent, off, n uint64) []kvcache.Extent {
	r := v.r
	size := uint64(r.nview) * r.block
	if n == 0 || off >= size {
		return dst
	}
	end := size
	if n < size-off { // off+n, where it cannot pass 2^64
		end = off + n
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.moved == nil {
		return dst // nothing was ever revoked
	}
	for pos := off; pos < end; {
		b := pos / r.block
		in := pos % r.block
		if in == 0 && b%64 == 0 && r.moved[b/64] == 0 {
			pos = min((b+64)*r.block, end) // 64 blocks at their own offsets
			continue
		}
		k := min(r.block-in, end-pos)
		file := r.table[b] + in
		if file != pos {
			if last := len(dst) - 1; last >= 0 && dst[last].View+dst[last].Len == pos && dst[last].File+dst[last].Len == file {
				dst[last].Len += k
			} else {
				dst = append(dst, kvcache.Extent{View: pos, File: file, Len: k})
			}
		}
		pos += k
	}
	return dst
}
