package kvcache

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// NewMemoryPlan builds the plan of link for layer group g between two
// memories laid out as their frameworks lay them out: src on the link's
// context rank, dst on its generation rank. The layouts may differ (NHD on
// one side, HND or a group pool on the other) and so may the heads each side
// holds (tensor parallelism as the PeerMap slices it): the plan copies, for
// every layer of link.Layers[g] and every part, the heads [link.HeadLo,
// link.HeadHi) of every token of the block.
//
// Pieces are built per block pair at both sides' block 0 and merged where
// contiguous on both sides. The plan iterates a block's head vectors either
// head-outer or token-outer, whichever gives fewer pieces (the source's
// order on a tie), so that NHD→NHD and HND→HND copy whole head ranges and a
// cross layout copies one head vector per piece. Segment offsets are region
// offsets of each side. See Plan.Append for how pieces become segments.
//
// Errors wrap ErrBadPlan and name the value; one that a descriptor causes
// (Validate, or the two sides disagreeing on tokens per block, head width,
// element size or parts) also wraps ErrBadMemory.
func NewMemoryPlan(link PeerLink, g int, src, dst *KVMemory) (*Plan, error) {
	name := fmt.Sprintf("link %v->%v group %d", link.Ctx, link.Gen, g)
	if src == nil || dst == nil {
		return nil, fmt.Errorf("%w: %s: nil memory descriptor", ErrBadPlan, name)
	}
	if err := src.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: source %w", ErrBadPlan, name, err)
	}
	if err := dst.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: destination %w", ErrBadPlan, name, err)
	}
	for _, f := range []struct {
		what     string
		src, dst int
	}{
		{"tokens per block", src.TokensPerBlock, dst.TokensPerBlock},
		{"head dim", src.HeadDim, dst.HeadDim},
		{"element bytes", src.ElemBytes, dst.ElemBytes},
		{"parts", src.Parts, dst.Parts},
	} {
		if f.src != f.dst {
			return nil, fmt.Errorf("%w: %s: %w: source %v memory has %s %d, destination %v memory %d",
				ErrBadPlan, name, ErrBadMemory, src.Kind, f.what, f.src, dst.Kind, f.dst)
		}
	}
	if g < 0 || g >= len(link.Layers) {
		return nil, fmt.Errorf("%w: %s: group outside the link's %d groups", ErrBadPlan, name, len(link.Layers))
	}
	if link.HeadLo >= link.HeadHi || link.HeadLo < src.HeadLo || link.HeadHi > src.HeadLo+src.Heads ||
		link.HeadLo < dst.HeadLo || link.HeadHi > dst.HeadLo+dst.Heads {
		return nil, fmt.Errorf("%w: %s: heads [%d,%d) not within source [%d,%d) and destination [%d,%d)",
			ErrBadPlan, name, link.HeadLo, link.HeadHi, src.HeadLo, src.HeadLo+src.Heads, dst.HeadLo, dst.HeadLo+dst.Heads)
	}
	prev := math.MinInt
	for _, L := range link.Layers[g] {
		if L <= prev {
			return nil, fmt.Errorf("%w: %s: layers not strictly ascending at %d", ErrBadPlan, name, L)
		}
		prev = L
		if src.layerIndex(L) < 0 || dst.layerIndex(L) < 0 {
			return nil, fmt.Errorf("%w: %s: layer %d not held by both memories (source %s, destination %s)",
				ErrBadPlan, name, L, layerList(src.Layers), layerList(dst.Layers))
		}
	}

	// One (layer, part) pair's pieces relative to both tensors' bases, in
	// whichever order gives fewer; every tensor pair shares the strides.
	headOuter := src.HeadStride >= src.TokenStride
	tmpl := tensorPieces(src, dst, link, headOuter)
	if other := tensorPieces(src, dst, link, !headOuter); len(other) < len(tmpl) {
		tmpl = other
	}
	// A descriptor that scatters its elements (ElemStride > ElemBytes: one
	// field of a peer's Hello) makes a piece of every element: millions a
	// block at serving sizes, and a chunk's segments gigabytes. Bounded
	// before the pieces are built: many pieces must be worth a post each.
	perBlock := uint64(len(link.Layers[g])) * uint64(src.Parts) * uint64(link.HeadHi-link.HeadLo) *
		uint64(src.TokensPerBlock) * uint64(src.HeadDim) * uint64(src.ElemBytes)
	if n := uint64(len(tmpl)) * uint64(len(link.Layers[g])) * uint64(src.Parts); n > maxSmallPieces && perBlock < n*minPieceBytes {
		return nil, fmt.Errorf("%w: %s: %w: source %v memory (element stride %d) and destination %v memory (element stride %d) make %d pieces a block of %d bytes, %d bytes on average: more than %d pieces a block must average at least %d bytes",
			ErrBadPlan, name, ErrBadMemory, src.Kind, src.ElemStride, dst.Kind, dst.ElemStride, n, perBlock, perBlock/n, maxSmallPieces, minPieceBytes)
	}
	pieces := make([]Segment, 0, len(tmpl)*len(link.Layers[g])*src.Parts)
	for _, L := range link.Layers[g] {
		si, di := src.layerIndex(L), dst.layerIndex(L)
		for part := range src.Parts {
			sb, db := src.Base[si][part], dst.Base[di][part]
			for i, pc := range tmpl {
				s, d := sb+pc.Src, db+pc.Dst
				if k := len(pieces) - 1; i == 0 && k >= 0 && pieces[k].Src+pieces[k].Len == s && pieces[k].Dst+pieces[k].Len == d {
					pieces[k].Len += pc.Len
					continue
				}
				pieces = append(pieces, Segment{Src: s, Dst: d, Len: pc.Len})
			}
		}
	}
	pieces = mergeInSourceOrder(pieces)
	p := &Plan{
		pieces: pieces, srcStride: src.BlockStride, dstStride: dst.BlockStride,
		ctx: link.Ctx, gen: link.Gen, group: g,
		srcBlocks: uint64(src.Blocks), dstBlocks: uint64(dst.Blocks),
	}
	p.perBlock = perBlock
	p.whole = len(pieces) == 1 && p.perBlock == src.blockContent() && p.perBlock == dst.blockContent()
	if len(pieces) > 1 {
		for _, pc := range pieces {
			if pc.Len == p.srcStride && pc.Len == p.dstStride {
				p.pieceMajor = true
				break
			}
		}
	}
	return p, nil
}

// mergeInSourceOrder sorts a block pair's pieces by source offset and
// merges those contiguous on both sides. Built layer by layer, the pieces
// of a layout whose layers interleave within a block (vLLM's cross-layer
// caches in FlashAttention's order: block, head, layer, K/V, token, dim)
// are a piece per (layer, part, head); in source order, the same layout on
// both sides is one piece a block again (whole blocks), and a cross layout
// reads its source forward.
func mergeInSourceOrder(pieces []Segment) []Segment {
	if len(pieces) < 2 {
		return pieces
	}
	slices.SortStableFunc(pieces, func(a, b Segment) int { return cmp.Compare(a.Src, b.Src) })
	out := pieces[:1]
	for _, pc := range pieces[1:] {
		if k := len(out) - 1; out[k].Src+out[k].Len == pc.Src && out[k].Dst+out[k].Len == pc.Dst {
			out[k].Len += pc.Len
			continue
		}
		out = append(out, pc)
	}
	return out
}

// BlockBytes is the number of bytes one block holds over all of m's
// tensors (layers, parts, heads, tokens): what a block of its group
// weighs, whatever the strides between its pieces.
func (m *KVMemory) BlockBytes() uint64 { return m.blockContent() }

// blockContent is the number of bytes one block holds over all of m's
// tensors.
func (m *KVMemory) blockContent() uint64 {
	return uint64(len(m.Layers)) * uint64(m.Parts) * uint64(m.Heads) *
		uint64(m.TokensPerBlock) * uint64(m.HeadDim) * uint64(m.ElemBytes)
}

// tensorPieces lists the byte ranges that one (layer, part) of a block
// pair copies, relative to the two tensors' bases, merged where contiguous
// on both sides. It walks the link's head vectors head-outer or
// token-outer; a head vector is one range when its elements are packed on
// both sides, else one per element.
// maxSmallPieces and minPieceBytes bound a plan's pieces a block: more
// than maxSmallPieces must average at least minPieceBytes (a piece of a
// real layout is at least a head vector, 128 bytes and more; a padded
// element, 1 to 8). A layout of smaller pieces is refused (ErrBadMemory).
const (
	maxSmallPieces = 4096
	minPieceBytes  = 64
)

func tensorPieces(src, dst *KVMemory, link PeerLink, headOuter bool) []Segment {
	e := uint64(src.ElemBytes)
	vec := src.ElemStride == e && dst.ElemStride == e
	outerN, innerN := src.TokensPerBlock, link.HeadHi-link.HeadLo
	sOut, sIn, dOut, dIn := src.TokenStride, src.HeadStride, dst.TokenStride, dst.HeadStride
	if headOuter {
		outerN, innerN = innerN, outerN
		sOut, sIn, dOut, dIn = sIn, sOut, dIn, dOut
	}
	sb := uint64(link.HeadLo-src.HeadLo) * src.HeadStride
	db := uint64(link.HeadLo-dst.HeadLo) * dst.HeadStride
	var out []Segment
	add := func(s, d, n uint64) {
		if k := len(out) - 1; k >= 0 && out[k].Src+out[k].Len == s && out[k].Dst+out[k].Len == d {
			out[k].Len += n
			return
		}
		out = append(out, Segment{Src: s, Dst: d, Len: n})
	}
	for o := range uint64(outerN) {
		for n := range uint64(innerN) {
			s, d := sb+o*sOut+n*sIn, db+o*dOut+n*dIn
			if vec {
				add(s, d, uint64(src.HeadDim)*e)
				continue
			}
			for x := range uint64(src.HeadDim) {
				add(s+x*src.ElemStride, d+x*dst.ElemStride, e)
			}
		}
	}
	return out
}
