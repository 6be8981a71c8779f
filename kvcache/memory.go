package kvcache

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"
)

// MemoryKind names how a serving framework lays out its KV cache. It is
// informational (errors and metrics name it): what a plan does follows from
// a KVMemory's offsets and strides alone.
type MemoryKind uint8

const (
	// MemStrided is a layout given by explicit strides only.
	MemStrided MemoryKind = iota
	// MemNHD is a vLLM-style tensor per layer, shaped
	// [2, num_blocks, block_size, kv_heads, head_dim].
	MemNHD
	// MemHND is the HND variant, [2, num_blocks, kv_heads, block_size, head_dim].
	MemHND
	// MemSplitKV is a K tensor and a V tensor per layer, each
	// [num_blocks, block_size, kv_heads, head_dim].
	MemSplitKV
	// MemGroupPool is a TensorRT-LLM-style pool per layer group: block
	// outermost, then (layer, K/V, head, token, dim), as doc.go describes.
	// It is the layout Pool and PoolGeometry assume.
	MemGroupPool
	// MemMLA is a latent cache per layer, [num_blocks, block_size, latent_dim]:
	// one latent vector per token, no K/V split, no heads.
	MemMLA
)

func (k MemoryKind) String() string {
	switch k {
	case MemStrided:
		return "strided"
	case MemNHD:
		return "NHD"
	case MemHND:
		return "HND"
	case MemSplitKV:
		return "split-KV"
	case MemGroupPool:
		return "group-pool"
	case MemMLA:
		return "MLA"
	}
	return fmt.Sprintf("MemoryKind(%d)", uint8(k))
}

// KVMemory describes where one rank's KV cache of one layer group lives
// inside one registered region, as the framework lays it out: nothing about
// the byte order is assumed, every stride is given.
//
// The element (layer Layers[i], part p, block b, token t, local head h,
// element e) is ElemBytes bytes at region offset
//
//	Base[i][p] + b*BlockStride + t*TokenStride + h*HeadStride + e*ElemStride
//
// where part 0 is K and part 1 is V (a single latent part for MLA), local
// head h is model head HeadLo+h, and block ids b are the framework's own,
// in [0, Blocks). Element strides larger than ElemBytes (a padded head
// vector) are allowed; planning is then per element rather than per head
// vector.
//
// A KVMemory is plain data; build one from a framework's tensor strides
// (PyTorch strides × element size) or with NHDMemory, HNDMemory,
// SplitKVMemory, MLAMemory or PoolMemory, and check it with Validate.
type KVMemory struct {
	// Kind is informational.
	Kind MemoryKind
	// Layers are the global layers the memory holds, strictly ascending.
	Layers []int
	// HeadLo is the model KV head of local head 0; Heads is the number of
	// local heads (1 for MLA).
	HeadLo, Heads int
	// Parts is 2 (K and V) or 1 (an MLA latent).
	Parts int
	// HeadDim is the number of elements per head vector (the latent width
	// for MLA); ElemBytes the size of one element.
	HeadDim, ElemBytes int
	// TokensPerBlock is the number of tokens one block holds.
	TokensPerBlock int
	// Blocks is the number of block ids, [0, Blocks).
	Blocks int
	// Base[i][p] is the region offset of element (block 0, token 0, head 0,
	// element 0) of layer Layers[i], part p.
	Base [][]uint64
	// BlockStride, TokenStride, HeadStride and ElemStride are the byte
	// distances between consecutive blocks, tokens, heads and elements.
	BlockStride, TokenStride, HeadStride, ElemStride uint64
	// RegionLen is the length of the region the offsets are relative to
	// (Region.Len of the registered Region, whose Base is the address of
	// offset 0); every element must lie inside it.
	RegionLen uint64
}

// partName names part p of a memory with parts parts.
func partName(parts, p int) string {
	if parts == 1 {
		return "latent"
	}
	if p == 0 {
		return "K"
	}
	return "V"
}

// maxFootprint bounds the byte ranges of one block of one tensor that
// Validate enumerates (token × head vectors, or elements when they are
// padded): far above real layouts, it keeps hostile values from exhausting
// memory.
const maxFootprint = 1 << 22

// span is a half-open byte range [lo, hi).
type span struct{ lo, hi uint64 }

// blockFootprint returns the byte ranges that block 0 of one (layer, part)
// tensor occupies, relative to its base: sorted, disjoint and with touching
// ranges merged. It reports an error when two elements overlap or an offset
// overflows.
func (m *KVMemory) blockFootprint() ([]span, error) {
	e := uint64(m.ElemBytes)
	vec := m.ElemStride == e
	n := uint64(m.TokensPerBlock) * uint64(m.Heads)
	if !vec {
		n *= uint64(m.HeadDim)
	}
	if n > maxFootprint {
		return nil, m.errorf("%d tokens × %d heads × %d elements at element stride %d: %d ranges per block, more than %d",
			m.TokensPerBlock, m.Heads, m.HeadDim, m.ElemStride, n, maxFootprint)
	}
	fp := make([]span, 0, n)
	for t := range m.TokensPerBlock {
		for h := range m.Heads {
			off, ok := mulAdd(0, uint64(t), m.TokenStride)
			if ok {
				off, ok = mulAdd(off, uint64(h), m.HeadStride)
			}
			var last uint64
			if ok {
				last, ok = mulAdd(off, uint64(m.HeadDim-1), m.ElemStride)
			}
			if ok {
				_, ok = addOK(last, e)
			}
			if !ok {
				return nil, m.errorf("token stride %d, head stride %d, element stride %d overflow an offset",
					m.TokenStride, m.HeadStride, m.ElemStride)
			}
			if vec {
				fp = append(fp, span{off, off + uint64(m.HeadDim)*e})
				continue
			}
			for d := range uint64(m.HeadDim) {
				o := off + d*m.ElemStride
				fp = append(fp, span{o, o + e})
			}
		}
	}
	slices.SortFunc(fp, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	out := fp[:1]
	for _, s := range fp[1:] {
		k := len(out) - 1
		if s.lo < out[k].hi {
			return nil, m.errorf("token stride %d, head stride %d, element stride %d make elements overlap "+
				"(%d tokens × %d heads × %d elements of %d bytes)",
				m.TokenStride, m.HeadStride, m.ElemStride, m.TokensPerBlock, m.Heads, m.HeadDim, m.ElemBytes)
		}
		if s.lo == out[k].hi {
			out[k].hi = s.hi
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// Validate reports whether m is usable. It returns nil or an error wrapping
// ErrBadMemory that names the offending field and value. It checks:
//
//   - shape fields are positive (Parts is 1 or 2, Blocks may be 0), Layers is
//     strictly ascending and Base has one offset per (layer, part);
//   - ElemStride ≥ ElemBytes, and the token, head and element strides place
//     the elements of one block of one tensor without overlap;
//   - BlockStride is at least the span of one block, so that blocks of one
//     tensor do not interleave (when Blocks > 1);
//   - every tensor lies inside [0, RegionLen);
//   - no two tensors share a byte.
//
// Its work is bounded whatever the values (a peer sends them): a descriptor
// whose tensors interleave too much to prove disjoint cheaply is refused
// (see maxInterleavedPairs).
func (m *KVMemory) Validate() error {
	for _, f := range []struct {
		name     string
		val, min int
	}{
		{"Heads", m.Heads, 1}, {"HeadLo", m.HeadLo, 0}, {"HeadDim", m.HeadDim, 1},
		{"ElemBytes", m.ElemBytes, 1}, {"TokensPerBlock", m.TokensPerBlock, 1}, {"Blocks", m.Blocks, 0},
	} {
		if f.val < f.min {
			return m.errorf("%s = %d, must be ≥ %d", f.name, f.val, f.min)
		}
	}
	for _, f := range []struct {
		name     string
		val, max int
	}{
		{"Heads", m.Heads, MaxKVHeads}, {"HeadDim", m.HeadDim, MaxHeadDim},
		{"ElemBytes", m.ElemBytes, MaxDTypeBytes}, {"TokensPerBlock", m.TokensPerBlock, MaxTokensPerBlock},
	} {
		if f.val > f.max {
			return m.errorf("%s = %d, must be ≤ %d", f.name, f.val, f.max)
		}
	}
	if m.Parts != 1 && m.Parts != 2 {
		return m.errorf("Parts = %d, must be 1 (MLA latent) or 2 (K and V)", m.Parts)
	}
	if len(m.Base) != len(m.Layers) {
		return m.errorf("%d base offset lists for %d layers", len(m.Base), len(m.Layers))
	}
	for i, L := range m.Layers {
		if L < 0 || (i > 0 && L <= m.Layers[i-1]) {
			return m.errorf("Layers[%d] = %d, must be ≥ 0 and strictly ascending", i, L)
		}
		if len(m.Base[i]) != m.Parts {
			return m.errorf("Base[%d] (layer %d) has %d offsets, want %d parts", i, L, len(m.Base[i]), m.Parts)
		}
	}
	if m.ElemStride < uint64(m.ElemBytes) {
		return m.errorf("element stride %d < element size %d", m.ElemStride, m.ElemBytes)
	}
	fp, err := m.blockFootprint()
	if err != nil {
		return err
	}
	width := fp[len(fp)-1].hi // bytes one block of one tensor spans
	if m.Blocks > 1 && len(m.Layers) > 0 && m.BlockStride < width {
		return m.errorf("block stride %d < %d bytes one block spans", m.BlockStride, width)
	}
	if m.Blocks == 0 {
		return nil
	}
	ts, err := m.extents(width)
	if err != nil {
		return err
	}
	_, err = m.checkDisjoint(ts, fp, width)
	return err
}

// extents lists m's tensors with the byte range each spans, from its first
// block's first byte to its last block's end (width bytes a block).
func (m *KVMemory) extents(width uint64) ([]tensorExtent, error) {
	ts := make([]tensorExtent, 0, len(m.Layers)*m.Parts)
	for i, L := range m.Layers {
		for p, base := range m.Base[i] {
			hi, ok := mulAdd(base, uint64(m.Blocks-1), m.BlockStride)
			if ok {
				hi, ok = addOK(hi, width)
			}
			if !ok || hi > m.RegionLen {
				return nil, m.errorf("layer %d %s at offset %d: %d blocks of stride %d end past region length %d",
					L, partName(m.Parts, p), base, m.Blocks, m.BlockStride, m.RegionLen)
			}
			ts = append(ts, tensorExtent{i, p, base, hi})
		}
	}
	return ts, nil
}

// CheckApart reports an error when the tensors of two of mems (one
// descriptor per layer group, each valid; nil entries skipped) interleave:
// a tensor of one starts before a tensor of the other ends. Each group's
// blocks are handed out by a pool of its own, so block b of one group and
// block b of another must never share a byte; groups in one interleaved
// allocation are not supported (each group needs memory of its own). The
// error names both tensors. Its work is O(t log t) for t tensors in all.
func CheckApart(mems []*KVMemory) error {
	type ext struct {
		tensorExtent
		g int
		m *KVMemory
	}
	var all []ext
	for g, m := range mems {
		if m == nil || m.Blocks == 0 {
			continue
		}
		fp, err := m.blockFootprint()
		if err != nil {
			return err
		}
		ts, err := m.extents(fp[len(fp)-1].hi)
		if err != nil {
			return err
		}
		for _, t := range ts {
			all = append(all, ext{t, g, m})
		}
	}
	slices.SortFunc(all, func(a, b ext) int { return cmp.Compare(a.lo, b.lo) })
	// Sorted by start, a tensor meets another group's when it starts
	// before the furthest end seen so far of a tensor of that other group;
	// tracking the furthest end of the two groups reaching furthest suffices.
	type reach struct {
		e  ext
		ok bool
	}
	var first, second reach // furthest-reaching tensors of two distinct groups
	for _, t := range all {
		for _, r := range []reach{first, second} {
			if r.ok && r.e.g != t.g && t.lo < r.e.hi {
				return fmt.Errorf("%w: layer group %d's layer %d %s at [%d,%d) and layer group %d's layer %d %s at [%d,%d) interleave: "+
					"each layer group's blocks come from a pool of its own, so groups need memory of their own",
					ErrBadMemory, r.e.g, r.e.m.Layers[r.e.i], partName(r.e.m.Parts, r.e.p), r.e.lo, r.e.hi,
					t.g, t.m.Layers[t.i], partName(t.m.Parts, t.p), t.lo, t.hi)
			}
		}
		switch {
		case first.ok && first.e.g == t.g:
			if t.hi > first.e.hi {
				first.e = t
			}
		case second.ok && second.e.g == t.g:
			if t.hi > second.e.hi {
				second.e = t
			}
		default:
			if !second.ok || t.hi > second.e.hi {
				second = reach{t, true}
			}
		}
		if second.ok && (!first.ok || second.e.hi > first.e.hi) {
			first, second = second, first
		}
	}
	return nil
}

// maxInterleavedPairs bounds the pairs of tensors whose extents interleave
// (the first starts before the second ends) that Validate checks byte by
// byte, and maxOverlapSteps the footprint ranges it compares for them. The
// descriptor may come from a peer (Hello), so the check must not take
// unbounded work: 8192 tensors, each a sparse footprint one byte after the
// last, took hours pair by pair; within both bounds the check takes tens of
// milliseconds at worst. Real layouts stay far below both: per-layer
// tensors (NHD, HND, split-KV, MLA) do not interleave; a group pool's
// tensors all do, but a pool of 128 layers is 32640 pairs (the bound
// allows 362 layers), and its footprint is one range per block (a range
// per token or head when the rank's heads are a slice of a wider tensor),
// compared once per distinct shift.
const (
	maxInterleavedPairs = 1 << 18
	maxOverlapSteps     = 1 << 22
)

// tensorExtent is tensor (layer index i, part p) of a KVMemory and the byte
// range [lo, hi) from its first byte to its last block's end.
type tensorExtent struct {
	i, p   int
	lo, hi uint64
}

// checkDisjoint reports an error when two of the tensors ts, each of
// footprint fp and width width per block, share a byte, or when proving
// they do not would take more than maxInterleavedPairs pairs or
// maxOverlapSteps footprint steps. It returns the work it did: pairs
// visited plus footprint ranges compared. It sorts ts by start.
func (m *KVMemory) checkDisjoint(ts []tensorExtent, fp []span, width uint64) (work int, err error) {
	slices.SortFunc(ts, func(a, b tensorExtent) int { return cmp.Compare(a.lo, b.lo) })
	pairs := 0
	for a, t := range ts {
		rest := ts[a+1:]
		pairs += sort.Search(len(rest), func(k int) bool { return rest[k].lo >= t.hi })
		work += bits.Len(uint(len(rest)))
	}
	if pairs > maxInterleavedPairs {
		return work, m.errorf("tensor extents interleave in %d pairs of %d tensors, more than %d: not supported",
			pairs, len(ts), maxInterleavedPairs)
	}
	// Whether the footprint meets itself shifted depends on the shift
	// alone, and tensors of a pool share shifts: remember each answer.
	meets := map[uint64]bool{}
	steps, over := 0, false
	meet := func(shift uint64) bool {
		if v, ok := meets[shift]; ok {
			return v
		}
		if steps+2*len(fp)+1 > maxOverlapSteps {
			over = true
			return false
		}
		steps += 2*len(fp) + 1
		v := footprintsMeet(fp, shift, 0)
		meets[shift] = v
		return v
	}
	defer func() { work += steps }()
	for a, t := range ts {
		for _, u := range ts[a+1:] {
			if u.lo >= t.hi {
				break
			}
			work++
			overlap := m.tensorsOverlap(meet, width, u.lo-t.lo)
			if over {
				return work, m.errorf("tensor extents interleave: proving that %d tensors of %d ranges per block "+
					"share no byte takes more than %d steps (at layer %d %s at offset %d and layer %d %s at offset %d): not supported",
					len(ts), len(fp), maxOverlapSteps, m.Layers[t.i], partName(m.Parts, t.p), t.lo,
					m.Layers[u.i], partName(m.Parts, u.p), u.lo)
			}
			if overlap {
				return work, m.errorf("layer %d %s at offset %d overlaps layer %d %s at offset %d",
					m.Layers[u.i], partName(m.Parts, u.p), u.lo, m.Layers[t.i], partName(m.Parts, t.p), t.lo)
			}
		}
	}
	return work, nil
}

// tensorsOverlap reports whether two tensors of m, the second delta bytes
// after the first, share a byte; meet(s) reports whether the block
// footprint and the footprint shifted by s share one. Block b of a tensor
// at a occupies a + b*BlockStride + fp, and fp lies in [0, width) with
// width ≤ BlockStride, so block b2 of the second can meet block b1 of the
// first only when the shift delta + (b2-b1)*BlockStride lies in (-width,
// width).
func (m *KVMemory) tensorsOverlap(meet func(shift uint64) bool, width, delta uint64) bool {
	if m.Blocks == 1 || m.BlockStride == 0 {
		return delta < width && meet(delta)
	}
	q, r := delta/m.BlockStride, delta%m.BlockStride
	// Shift +r: block b2 = b1 - q; shift r-BlockStride: b2 = b1 - q - 1
	// (fp and fp shifted back meet when fp and fp shifted forward do).
	if q <= uint64(m.Blocks-1) && r < width && meet(r) {
		return true
	}
	if back := m.BlockStride - r; q+1 <= uint64(m.Blocks-1) && back < width && meet(back) {
		return true
	}
	return false
}

// footprintsMeet reports whether fp shifted by a and fp shifted by b share a
// byte.
func footprintsMeet(fp []span, a, b uint64) bool {
	i, j := 0, 0
	for i < len(fp) && j < len(fp) {
		x, y := span{fp[i].lo + a, fp[i].hi + a}, span{fp[j].lo + b, fp[j].hi + b}
		if x.lo < y.hi && y.lo < x.hi {
			return true
		}
		if x.hi <= y.hi {
			i++
		} else {
			j++
		}
	}
	return false
}

// layerIndex is the position of global layer L in m.Layers, or -1.
func (m *KVMemory) layerIndex(L int) int {
	if i, ok := slices.BinarySearch(m.Layers, L); ok {
		return i
	}
	return -1
}

func (m *KVMemory) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %v memory of layers %s, heads [%d,%d): %s", ErrBadMemory, m.Kind,
		layerList(m.Layers), m.HeadLo, m.HeadLo+m.Heads, fmt.Sprintf(format, args...))
}

// layerList renders layers compactly: "[0..79]" for a range, else the list.
func layerList(ls []int) string {
	if len(ls) > 2 && ls[len(ls)-1]-ls[0] == len(ls)-1 {
		return fmt.Sprintf("[%d..%d]", ls[0], ls[len(ls)-1])
	}
	return fmt.Sprint(ls)
}

func mulAdd(a, x, y uint64) (uint64, bool) {
	hi, lo := bits.Mul64(x, y)
	if hi != 0 {
		return 0, false
	}
	return addOK(a, lo)
}

func addOK(a, b uint64) (uint64, bool) {
	s, c := bits.Add64(a, b, 0)
	return s, c == 0
}

// memoryShape is what the constructors share: the rank's layers of group g
// and heads, the layout's element geometry.
func memoryShape(kind MemoryKind, l Layout, s Shape, g, blocks int) (*KVMemory, error) {
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v memory: %w", ErrBadMemory, kind, err)
	}
	if g < 0 || g >= len(l.Groups) || g >= len(s.Layers) {
		return nil, fmt.Errorf("%w: %v memory: group %d outside [0,%d)", ErrBadMemory, kind, g, len(l.Groups))
	}
	if blocks < 0 {
		return nil, fmt.Errorf("%w: %v memory: %d blocks", ErrBadMemory, kind, blocks)
	}
	return &KVMemory{
		Kind: kind, Layers: append([]int(nil), s.Layers[g]...), HeadLo: s.HeadLo, Heads: s.Heads(),
		Parts: l.Parts(), HeadDim: l.HeadDim, ElemBytes: l.DTypeBytes, TokensPerBlock: l.TokensPerBlock,
		Blocks: blocks, ElemStride: uint64(l.DTypeBytes),
	}, nil
}

// perLayer fills Base from one region offset per layer (and per part) and
// validates the result.
func (m *KVMemory) perLayer(offsets [][]uint64, regionLen uint64) (*KVMemory, error) {
	if len(offsets) != len(m.Layers) {
		return nil, m.errorf("%d tensor offsets for %d layers", len(offsets), len(m.Layers))
	}
	m.Base = offsets
	m.RegionLen = regionLen
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// FrameworkKinds are the names FrameworkMemory takes, as the C ABI, the
// Python package and node's config spell them.
var FrameworkKinds = []string{"nhd", "hnd", "split_kv", "mla"}

// FrameworkMemory is the descriptor of layer group g laid out as a serving
// framework's kind names it (FrameworkKinds): NHDMemory, HNDMemory,
// SplitKVMemory (vOffsets: the V tensors) or MLAMemory. An unknown kind is
// an ErrBadMemory naming it and the kinds there are.
func FrameworkMemory(kind string, l Layout, s Shape, g, blocks int, offsets, vOffsets []uint64, regionLen uint64) (*KVMemory, error) {
	switch kind {
	case "nhd":
		return NHDMemory(l, s, g, blocks, offsets, regionLen)
	case "hnd":
		return HNDMemory(l, s, g, blocks, offsets, regionLen)
	case "split_kv":
		return SplitKVMemory(l, s, g, blocks, offsets, vOffsets, regionLen)
	case "mla":
		return MLAMemory(l, s, g, blocks, offsets, regionLen)
	}
	return nil, fmt.Errorf("%w: kind %q, want one of %s", ErrBadMemory, kind, strings.Join(FrameworkKinds, ", "))
}

// TensorStrides are the byte strides of a framework's tensors as they
// really are (views of one cross-layer tensor, a KV cache layout of the
// framework's own order): between blocks, tokens, heads and elements, and
// KV, the V tensor's offset from its layer's K tensor (0: blocks × Block,
// the V half after the K half; split and MLA kinds have none).
type TensorStrides struct {
	Block, Token, Head, Elem, KV uint64
}

// FrameworkMemoryStrided is FrameworkMemory with the tensors' real strides
// st in place of the contiguous ones of kind: it validates the descriptor
// as given (FrameworkMemory would first check the offsets against
// contiguous tensors, which layers interleaved within a block, a few
// hundred bytes apart, overlap). Errors wrap ErrBadMemory.
func FrameworkMemoryStrided(kind string, l Layout, s Shape, g, blocks int, offsets, vOffsets []uint64, st TensorStrides, regionLen uint64) (*KVMemory, error) {
	kinds := map[string]MemoryKind{"nhd": MemNHD, "hnd": MemHND, "split_kv": MemSplitKV, "mla": MemMLA}
	k, ok := kinds[kind]
	if !ok {
		return nil, fmt.Errorf("%w: kind %q, want one of %s", ErrBadMemory, kind, strings.Join(FrameworkKinds, ", "))
	}
	m, err := memoryShape(k, l, s, g, blocks)
	if err != nil {
		return nil, err
	}
	if l.MLA != (k == MemMLA) {
		return nil, m.errorf("layout %q (MLA: %v) and kind %s disagree", l.Name, l.MLA, kind)
	}
	m.BlockStride, m.TokenStride, m.HeadStride, m.ElemStride = st.Block, st.Token, st.Head, st.Elem
	base := make([][]uint64, len(offsets))
	for i, o := range offsets {
		switch k {
		case MemMLA:
			base[i] = []uint64{o}
		case MemSplitKV:
			if len(vOffsets) != len(offsets) {
				return nil, m.errorf("%d K offsets but %d V offsets", len(offsets), len(vOffsets))
			}
			base[i] = []uint64{o, vOffsets[i]}
		default:
			kv := st.KV
			if kv == 0 {
				kv = uint64(blocks) * st.Block
			}
			v, ok := addOK(o, kv)
			if !ok {
				return nil, m.errorf("layer offset %d + V offset %d overflow", o, kv)
			}
			base[i] = []uint64{o, v}
		}
	}
	return m.perLayer(base, regionLen)
}

// NHDMemory describes vLLM-style memory for rank shape s of layout l, layer
// group g: one contiguous tensor per layer, [2, blocks, TokensPerBlock,
// heads, HeadDim], the tensor of the rank's i-th layer of g at region offset
// layerOffsets[i] of a region of regionLen bytes. Errors wrap ErrBadMemory.
func NHDMemory(l Layout, s Shape, g, blocks int, layerOffsets []uint64, regionLen uint64) (*KVMemory, error) {
	return jointKV(MemNHD, l, s, g, blocks, layerOffsets, regionLen)
}

// HNDMemory is NHDMemory with the head outside the token within a block:
// [2, blocks, heads, TokensPerBlock, HeadDim].
func HNDMemory(l Layout, s Shape, g, blocks int, layerOffsets []uint64, regionLen uint64) (*KVMemory, error) {
	return jointKV(MemHND, l, s, g, blocks, layerOffsets, regionLen)
}

func jointKV(kind MemoryKind, l Layout, s Shape, g, blocks int, layerOffsets []uint64, regionLen uint64) (*KVMemory, error) {
	m, err := memoryShape(kind, l, s, g, blocks)
	if err != nil {
		return nil, err
	}
	if l.MLA {
		return nil, m.errorf("layout %q is MLA (one latent part); use MLAMemory", l.Name)
	}
	m.setBlockStrides(kind == MemHND)
	partStride := uint64(blocks) * m.BlockStride
	offsets := make([][]uint64, 0, len(layerOffsets))
	for _, o := range layerOffsets {
		offsets = append(offsets, []uint64{o, o + partStride})
	}
	return m.perLayer(offsets, regionLen)
}

// setBlockStrides sets contiguous strides within a block: token outside
// head (NHD) or head outside token (HND).
func (m *KVMemory) setBlockStrides(hnd bool) {
	vec := uint64(m.HeadDim) * uint64(m.ElemBytes)
	if hnd {
		m.TokenStride, m.HeadStride = vec, vec*uint64(m.TokensPerBlock)
	} else {
		m.HeadStride, m.TokenStride = vec, vec*uint64(m.Heads)
	}
	m.BlockStride = vec * uint64(m.Heads) * uint64(m.TokensPerBlock)
}

// SplitKVMemory describes K and V in separate contiguous tensors per layer,
// each [blocks, TokensPerBlock, heads, HeadDim]: the rank's i-th layer of
// group g has its K tensor at kOffsets[i] and its V tensor at vOffsets[i].
func SplitKVMemory(l Layout, s Shape, g, blocks int, kOffsets, vOffsets []uint64, regionLen uint64) (*KVMemory, error) {
	m, err := memoryShape(MemSplitKV, l, s, g, blocks)
	if err != nil {
		return nil, err
	}
	if l.MLA {
		return nil, m.errorf("layout %q is MLA (one latent part); use MLAMemory", l.Name)
	}
	if len(kOffsets) != len(vOffsets) {
		return nil, m.errorf("%d K offsets but %d V offsets", len(kOffsets), len(vOffsets))
	}
	m.setBlockStrides(false)
	offsets := make([][]uint64, len(kOffsets))
	for i := range kOffsets {
		offsets[i] = []uint64{kOffsets[i], vOffsets[i]}
	}
	return m.perLayer(offsets, regionLen)
}

// MLAMemory describes a latent cache per layer, [blocks, TokensPerBlock,
// HeadDim] contiguous, the rank's i-th layer of group g at layerOffsets[i].
// l must be an MLA layout.
func MLAMemory(l Layout, s Shape, g, blocks int, layerOffsets []uint64, regionLen uint64) (*KVMemory, error) {
	m, err := memoryShape(MemMLA, l, s, g, blocks)
	if err != nil {
		return nil, err
	}
	if !l.MLA {
		return nil, m.errorf("layout %q is not MLA (it has K and V)", l.Name)
	}
	m.setBlockStrides(false)
	offsets := make([][]uint64, 0, len(layerOffsets))
	for _, o := range layerOffsets {
		offsets = append(offsets, []uint64{o})
	}
	return m.perLayer(offsets, regionLen)
}

// PoolMemory describes today's pool of layer group g (the byte order of
// doc.go) for rank shape s, placed by geo, as a KVMemory: a plan between two
// PoolMemory descriptors (NewMemoryPlan) gives the same segments as NewPlan
// with the two geometries. The region is taken to end with the pool.
func PoolMemory(l Layout, s Shape, g int, geo PoolGeometry) (*KVMemory, error) {
	m, err := memoryShape(MemGroupPool, l, s, g, geo.Blocks)
	if err != nil {
		return nil, err
	}
	unit := uint64(l.TokensPerBlock) * uint64(l.TokenBytes()) // one head of one (layer, part)
	m.TokenStride, m.HeadStride, m.BlockStride = uint64(l.TokenBytes()), unit, geo.BlockBytes
	m.Base = make([][]uint64, len(m.Layers))
	for i := range m.Layers {
		m.Base[i] = make([]uint64, m.Parts)
		for p := range m.Parts {
			m.Base[i][p] = geo.Offset + uint64(i*m.Parts+p)*uint64(m.Heads)*unit
		}
	}
	end, ok := mulAdd(geo.Offset, uint64(geo.Blocks), geo.BlockBytes)
	if !ok {
		return nil, m.errorf("pool of %d blocks × %d bytes at offset %d overflows", geo.Blocks, geo.BlockBytes, geo.Offset)
	}
	m.RegionLen = end
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}
