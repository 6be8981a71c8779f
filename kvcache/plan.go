package kvcache

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// PoolGeometry places one layer group's block pool inside a registered
// region: block id i occupies [Offset + i*BlockBytes, Offset + (i+1)*BlockBytes).
type PoolGeometry struct {
	// Offset is the region offset of block 0.
	Offset uint64
	// BlockBytes is the stride between blocks; at least the rank-local
	// block size (Shape.BlockBytes), larger when the pool pads blocks.
	BlockBytes uint64
	// Blocks is the number of blocks in the pool; ids are [0, Blocks).
	Blocks int
}

// Plan turns paired source and destination block ids of one link and one
// layer group into segments. It is built once per (link, group, pool
// geometry pair) and reused for every chunk; it is immutable and safe for
// concurrent use.
//
// Within a block the plan copies, for each (layer, part) the link carries,
// the link's head range, following the byte order in doc.go. Pieces that are
// contiguous on both sides are merged, so a link that carries whole blocks
// copies one piece per block, and a head sub-range one piece per (layer,
// part). Across blocks, a piece that starts where the previous segment ends
// on both sides extends it: runs of block ids consecutive on both sides
// become one segment. Every segment Append emits is a maximal run.
//
// NewPlan builds a plan between two of kvcache's pools; NewMemoryPlan builds
// one between two KVMemory descriptors (the framework's own layouts), with
// the same Append, Count and Stats.
type Plan struct {
	pieces     []Segment // per block pair, at block 0 of each side; merged
	perBlock   uint64    // sum of piece lengths
	srcStride  uint64    // bytes between consecutive source block ids
	dstStride  uint64    // bytes between consecutive destination block ids
	pieceMajor bool      // emit piece by piece, each over every block pair
	whole      bool      // one piece covering both whole blocks
	ctx, gen   Rank
	group      int
	srcBlocks  uint64
	dstBlocks  uint64
}

// NewPlan builds the plan for link, which context shape ctx writes to
// generation shape gen, for layer group g of layout l, between source pool
// geometry src and destination pool geometry dst. Offsets of the segments are
// relative to each side's region base.
//
// Errors wrap ErrBadPlan and name the offending value: a group out of range,
// a link whose ranks, heads or layers do not belong to both shapes, a block
// stride smaller than the rank-local block, or a pool that overflows.
func NewPlan(l Layout, ctx, gen Shape, link PeerLink, g int, src, dst PoolGeometry) (*Plan, error) {
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPlan, err)
	}
	if g < 0 || g >= len(l.Groups) {
		return nil, fmt.Errorf("%w: group %d outside [0,%d)", ErrBadPlan, g, len(l.Groups))
	}
	name := fmt.Sprintf("link %v->%v group %d", link.Ctx, link.Gen, g)
	if link.Ctx != ctx.Rank || link.Gen != gen.Rank {
		return nil, fmt.Errorf("%w: %s between shapes of %v and %v", ErrBadPlan, name, ctx.Rank, gen.Rank)
	}
	if len(link.Layers) != len(l.Groups) || len(ctx.Layers) != len(l.Groups) || len(gen.Layers) != len(l.Groups) {
		return nil, fmt.Errorf("%w: %s: layer lists for %d/%d/%d groups (link/ctx/gen), layout has %d",
			ErrBadPlan, name, len(link.Layers), len(ctx.Layers), len(gen.Layers), len(l.Groups))
	}
	if link.HeadLo >= link.HeadHi || link.HeadLo < ctx.HeadLo || link.HeadHi > ctx.HeadHi ||
		link.HeadLo < gen.HeadLo || link.HeadHi > gen.HeadHi {
		return nil, fmt.Errorf("%w: %s: heads [%d,%d) not within context [%d,%d) and generation [%d,%d)",
			ErrBadPlan, name, link.HeadLo, link.HeadHi, ctx.HeadLo, ctx.HeadHi, gen.HeadLo, gen.HeadHi)
	}
	srcBB, dstBB := ctx.BlockBytes(l, g), gen.BlockBytes(l, g)
	if src.BlockBytes < srcBB {
		return nil, fmt.Errorf("%w: %s: source block stride %d < block bytes %d", ErrBadPlan, name, src.BlockBytes, srcBB)
	}
	if dst.BlockBytes < dstBB {
		return nil, fmt.Errorf("%w: %s: destination block stride %d < block bytes %d", ErrBadPlan, name, dst.BlockBytes, dstBB)
	}
	for _, side := range [...]struct {
		what string
		pg   PoolGeometry
	}{{"source", src}, {"destination", dst}} {
		if side.pg.Blocks < 0 {
			return nil, fmt.Errorf("%w: %s: %s pool of %d blocks", ErrBadPlan, name, side.what, side.pg.Blocks)
		}
		hi, lo := bits.Mul64(uint64(side.pg.Blocks), side.pg.BlockBytes)
		if _, carry := bits.Add64(lo, side.pg.Offset, 0); hi != 0 || carry != 0 {
			return nil, fmt.Errorf("%w: %s: %s pool of %d blocks × %d bytes at offset %d overflows",
				ErrBadPlan, name, side.what, side.pg.Blocks, side.pg.BlockBytes, side.pg.Offset)
		}
	}

	p := &Plan{
		srcStride: src.BlockBytes, dstStride: dst.BlockBytes, ctx: link.Ctx, gen: link.Gen, group: g,
		srcBlocks: uint64(src.Blocks), dstBlocks: uint64(dst.Blocks),
	}
	parts := l.Parts()
	unit := uint64(l.TokensPerBlock) * uint64(l.TokenBytes()) // one head of one (layer, part)
	n := uint64(link.HeadHi-link.HeadLo) * unit
	sh, dh := uint64(ctx.Heads()), uint64(gen.Heads())
	sHead, dHead := uint64(link.HeadLo-ctx.HeadLo), uint64(link.HeadLo-gen.HeadLo)
	prev := math.MinInt
	for _, L := range link.Layers[g] {
		if L <= prev {
			return nil, fmt.Errorf("%w: %s: layers not strictly ascending at %d", ErrBadPlan, name, L)
		}
		prev = L
		si, di := ctx.LayerIndex(g, L), gen.LayerIndex(g, L)
		if si < 0 || di < 0 {
			return nil, fmt.Errorf("%w: %s: layer %d not held by both ranks", ErrBadPlan, name, L)
		}
		for part := range parts {
			s := ((uint64(si)*uint64(parts)+uint64(part))*sh + sHead) * unit
			d := ((uint64(di)*uint64(parts)+uint64(part))*dh + dHead) * unit
			p.perBlock += n
			if k := len(p.pieces) - 1; k >= 0 && p.pieces[k].Src+p.pieces[k].Len == s && p.pieces[k].Dst+p.pieces[k].Len == d {
				p.pieces[k].Len += n
				continue
			}
			p.pieces = append(p.pieces, Segment{Src: s, Dst: d, Len: n})
		}
	}
	p.whole = len(p.pieces) == 1 && p.pieces[0].Src == 0 && p.pieces[0].Dst == 0 &&
		p.pieces[0].Len == srcBB && srcBB == dstBB
	for i := range p.pieces {
		p.pieces[i].Src += src.Offset
		p.pieces[i].Dst += dst.Offset
	}
	return p, nil
}

// Append appends to out the segments that copy, for each i, source block
// srcIDs[i] to destination block dstIDs[i], and returns the extended slice.
// Segments never merge with segments that were already in out, and no two
// consecutive segments Append emits are contiguous on both sides. With
// enough capacity in out it does not allocate.
//
// Segments are emitted in block order, each block's pieces in plan order —
// except for a plan with several pieces of which some span a whole block
// stride on both sides (per-layer tensors, as vLLM lays them out): it emits
// piece by piece, each over every block pair, so that a run of block ids
// consecutive on both sides becomes one segment per piece.
//
// Errors wrap ErrBadPlan and name the value (mismatched lengths, an id
// outside its pool); out is then returned unextended.
func (p *Plan) Append(out []Segment, srcIDs, dstIDs []BlockID) ([]Segment, error) {
	if len(srcIDs) != len(dstIDs) {
		return out, p.lengthError(srcIDs, dstIDs)
	}
	n0 := len(out)
	if len(p.pieces) == 0 || p.pieceMajor {
		if err := p.checkIDs(srcIDs, dstIDs); err != nil {
			return out, err
		}
	}
	if p.pieceMajor {
		for _, pc := range p.pieces {
			for i, sid := range srcIDs {
				s := uint64(sid)*p.srcStride + pc.Src
				d := uint64(dstIDs[i])*p.dstStride + pc.Dst
				if k := len(out) - 1; k >= n0 && out[k].Src+out[k].Len == s && out[k].Dst+out[k].Len == d {
					out[k].Len += pc.Len
				} else {
					out = append(out, Segment{Src: s, Dst: d, Len: pc.Len})
				}
			}
		}
		return out, nil
	}
	if len(p.pieces) == 0 {
		return out, nil
	}
	first, rest := p.pieces[0], p.pieces[1:]
	for i, sid := range srcIDs {
		did := dstIDs[i]
		if uint64(int64(sid)) >= p.srcBlocks || uint64(int64(did)) >= p.dstBlocks {
			return out[:n0], p.idError(i, sid, did)
		}
		sb := uint64(sid) * p.srcStride
		db := uint64(did) * p.dstStride
		s, d := sb+first.Src, db+first.Dst
		if k := len(out) - 1; k >= n0 && out[k].Src+out[k].Len == s && out[k].Dst+out[k].Len == d {
			out[k].Len += first.Len
		} else {
			out = append(out, Segment{Src: s, Dst: d, Len: first.Len})
		}
		for _, pc := range rest {
			out = append(out, Segment{Src: sb + pc.Src, Dst: db + pc.Dst, Len: pc.Len})
		}
	}
	return out, nil
}

// Count returns the number of segments Append would emit for these ids (to
// size a buffer), without emitting them. Errors are Append's.
func (p *Plan) Count(srcIDs, dstIDs []BlockID) (int, error) {
	if len(srcIDs) != len(dstIDs) {
		return 0, p.lengthError(srcIDs, dstIDs)
	}
	if err := p.checkIDs(srcIDs, dstIDs); err != nil {
		return 0, err
	}
	if len(p.pieces) == 0 || len(srcIDs) == 0 {
		return 0, nil
	}
	count := 0
	var endS, endD uint64
	if p.pieceMajor {
		for j, pc := range p.pieces {
			for i, sid := range srcIDs {
				s := uint64(sid)*p.srcStride + pc.Src
				d := uint64(dstIDs[i])*p.dstStride + pc.Dst
				if (i == 0 && j == 0) || endS != s || endD != d {
					count++
				}
				endS, endD = s+pc.Len, d+pc.Len
			}
		}
		return count, nil
	}
	first, last := p.pieces[0], p.pieces[len(p.pieces)-1]
	for i, sid := range srcIDs {
		sb := uint64(sid) * p.srcStride
		db := uint64(dstIDs[i]) * p.dstStride
		count += len(p.pieces)
		if i > 0 && endS == sb+first.Src && endD == db+first.Dst {
			count--
		}
		endS, endD = sb+last.Src+last.Len, db+last.Dst+last.Len
	}
	return count, nil
}

// Bytes is the number of bytes the plan moves for blocks block pairs.
func (p *Plan) Bytes(blocks int) uint64 { return uint64(blocks) * p.perBlock }

// BytesPerBlock is the number of bytes the plan moves per block pair.
func (p *Plan) BytesPerBlock() uint64 { return p.perBlock }

// PlanStats describes a plan independently of the block ids it is applied to.
type PlanStats struct {
	// PiecesPerBlock is the number of segments one isolated block pair
	// needs (1 for whole blocks; 0 when the link carries nothing of the
	// group).
	PiecesPerBlock int
	// BytesPerBlock is the number of bytes moved per block pair.
	BytesPerBlock uint64
	// MinPiece and MaxPiece bound the piece lengths, in bytes.
	MinPiece, MaxPiece uint64
	// WholeBlock reports that each block pair is copied whole, so that
	// runs of ids consecutive on both sides merge into one segment.
	WholeBlock bool
}

// Stats returns the plan's per-block figures, for cost models and metrics.
func (p *Plan) Stats() PlanStats {
	st := PlanStats{PiecesPerBlock: len(p.pieces), BytesPerBlock: p.perBlock, WholeBlock: p.whole}
	for i, pc := range p.pieces {
		if i == 0 || pc.Len < st.MinPiece {
			st.MinPiece = pc.Len
		}
		st.MaxPiece = max(st.MaxPiece, pc.Len)
	}
	return st
}

// CostModel estimates how long a batch of writes takes from its descriptor
// count and byte count, to decide when gathering many small segments into a
// staging buffer pays (DESIGN.md §5). The zero value estimates zero.
type CostModel struct {
	// PerSegment is the fixed cost of one descriptor (post and completion).
	PerSegment time.Duration
	// LinkBytesPerSec is the transport's bandwidth.
	LinkBytesPerSec float64
	// CopyBytesPerSec is the local copy bandwidth of a gather or scatter.
	CopyBytesPerSec float64
}

// Direct estimates writing segments segments of bytes bytes in all as they are.
func (m CostModel) Direct(segments int, bytes uint64) time.Duration {
	return time.Duration(segments)*m.PerSegment + m.transfer(bytes, m.LinkBytesPerSec)
}

// Staged estimates gathering bytes bytes from segments segments into a
// staging buffer, writing it as one segment and scattering it at the receiver.
func (m CostModel) Staged(segments int, bytes uint64) time.Duration {
	return m.PerSegment + m.transfer(bytes, m.LinkBytesPerSec) + 2*m.transfer(bytes, m.CopyBytesPerSec)
}

// StagingPays reports whether Staged beats Direct.
func (m CostModel) StagingPays(segments int, bytes uint64) bool {
	return m.Staged(segments, bytes) < m.Direct(segments, bytes)
}

func (m CostModel) transfer(bytes uint64, perSec float64) time.Duration {
	if perSec <= 0 {
		return 0
	}
	return time.Duration(float64(bytes) / perSec * float64(time.Second))
}

// checkIDs validates every id pair.
func (p *Plan) checkIDs(srcIDs, dstIDs []BlockID) error {
	for i, sid := range srcIDs {
		if did := dstIDs[i]; uint64(int64(sid)) >= p.srcBlocks || uint64(int64(did)) >= p.dstBlocks {
			return p.idError(i, sid, did)
		}
	}
	return nil
}

func (p *Plan) idError(i int, sid, did BlockID) error {
	if uint64(int64(sid)) >= p.srcBlocks {
		return fmt.Errorf("%w: link %v->%v group %d: source block id %d (pair %d) outside pool [0,%d)",
			ErrBadPlan, p.ctx, p.gen, p.group, sid, i, p.srcBlocks)
	}
	return fmt.Errorf("%w: link %v->%v group %d: destination block id %d (pair %d) outside pool [0,%d)",
		ErrBadPlan, p.ctx, p.gen, p.group, did, i, p.dstBlocks)
}

func (p *Plan) lengthError(srcIDs, dstIDs []BlockID) error {
	return fmt.Errorf("%w: link %v->%v group %d: %d source ids but %d destination ids",
		ErrBadPlan, p.ctx, p.gen, p.group, len(srcIDs), len(dstIDs))
}
