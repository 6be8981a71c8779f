package kvcache

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// tb is what test helpers need of testing.T and rapid.T alike.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// packedMemory builds a descriptor of kind for rank shape s of layout l,
// group g, with blocks blocks: its tensors packed from offset off with gap
// bytes after each (for MemGroupPool, gap pads each block). Split-KV puts
// every V tensor before every K tensor, so that nothing relies on K coming
// first.
func packedMemory(t tb, kind MemoryKind, l Layout, s Shape, g, blocks int, off, gap uint64) *KVMemory {
	t.Helper()
	n := uint64(len(s.Layers[g]))
	blockBytes := uint64(s.Heads()) * uint64(l.TokensPerBlock) * uint64(l.TokenBytes()) // one tensor's block
	tensor := uint64(blocks) * blockBytes
	var m *KVMemory
	var err error
	switch kind {
	case MemNHD, MemHND:
		offs := make([]uint64, n)
		for i := range offs {
			offs[i] = off + uint64(i)*(2*tensor+gap)
		}
		end := off + n*(2*tensor+gap)
		if kind == MemNHD {
			m, err = NHDMemory(l, s, g, blocks, offs, end)
		} else {
			m, err = HNDMemory(l, s, g, blocks, offs, end)
		}
	case MemSplitKV:
		ks, vs := make([]uint64, n), make([]uint64, n)
		for i := range ks {
			vs[i] = off + uint64(i)*(tensor+gap)
			ks[i] = off + (n+uint64(i))*(tensor+gap)
		}
		m, err = SplitKVMemory(l, s, g, blocks, ks, vs, off+2*n*(tensor+gap))
	case MemMLA:
		offs := make([]uint64, n)
		for i := range offs {
			offs[i] = off + uint64(i)*(tensor+gap)
		}
		m, err = MLAMemory(l, s, g, blocks, offs, off+n*(tensor+gap))
	case MemGroupPool:
		m, err = PoolMemory(l, s, g, PoolGeometry{Offset: off, BlockBytes: s.BlockBytes(l, g) + gap, Blocks: blocks})
	default:
		t.Fatalf("packedMemory: kind %v", kind)
	}
	if err != nil {
		t.Fatalf("%v memory: %v", kind, err)
	}
	return m
}

// eachElement calls f for every element of m that holds the global blocks
// first, first+1, … in block ids ids, of layers layers and model heads
// [hlo, hhi): its region offset and the (layer, part, model head, token,
// element) it holds.
func eachElement(m *KVMemory, ids []BlockID, first int, layers []int, hlo, hhi int,
	f func(off uint64, layer, part, head, token, elem int)) {
	tpb := m.TokensPerBlock
	for i, id := range ids {
		for _, L := range layers {
			li := m.layerIndex(L)
			for p := range m.Parts {
				for h := hlo; h < hhi; h++ {
					for tok := range tpb {
						for x := range m.HeadDim {
							off := m.Base[li][p] + uint64(id)*m.BlockStride + uint64(tok)*m.TokenStride +
								uint64(h-m.HeadLo)*m.HeadStride + uint64(x)*m.ElemStride
							f(off, L, p, h, (first+i)*tpb+tok, x)
						}
					}
				}
			}
		}
	}
}

// fillMemory writes the pattern into every element of m's blocks ids (the
// global blocks from first), all of m's layers and heads.
func fillMemory(m *KVMemory, buf []byte, ids []BlockID, first int) {
	e := m.ElemBytes
	eachElement(m, ids, first, m.Layers, m.HeadLo, m.HeadLo+m.Heads, func(off uint64, layer, part, head, token, elem int) {
		for b := range e {
			buf[off+uint64(b)] = kvByte(layer, part, head, token, elem*e+b)
		}
	})
}

// garbage fills buf with bytes unlike the pattern's neighbours.
func garbage(buf []byte, seed int) {
	for i := range buf {
		buf[i] = byte(0x5A ^ (i*13 + seed))
	}
}

// execute copies every segment from src to dst, counting writes per
// destination byte, and returns the bytes moved. A segment outside either
// buffer or of length 0 fails the test.
func execute(t tb, segs []Segment, src, dst []byte, count []uint8) uint64 {
	t.Helper()
	var total uint64
	for _, sg := range segs {
		if sg.Len == 0 || sg.Src+sg.Len > uint64(len(src)) || sg.Dst+sg.Len > uint64(len(dst)) {
			t.Fatalf("segment %+v outside regions (%d, %d)", sg, len(src), len(dst))
		}
		copy(dst[sg.Dst:sg.Dst+sg.Len], src[sg.Src:sg.Src+sg.Len])
		for j := sg.Dst; j < sg.Dst+sg.Len; j++ {
			count[j]++
		}
		total += sg.Len
	}
	return total
}

// checkMaximal fails when two consecutive segments are contiguous on both
// sides (they should have been one).
func checkMaximal(t tb, segs []Segment) {
	t.Helper()
	for i := 1; i < len(segs); i++ {
		a, b := segs[i-1], segs[i]
		if a.Src+a.Len == b.Src && a.Dst+a.Len == b.Dst {
			t.Fatalf("segments %d and %d are contiguous on both sides: %v %v", i-1, i, a, b)
		}
	}
}

func TestMemoryKindString(t *testing.T) {
	want := map[MemoryKind]string{MemStrided: "strided", MemNHD: "NHD", MemHND: "HND", MemSplitKV: "split-KV",
		MemGroupPool: "group-pool", MemMLA: "MLA", MemoryKind(42): "MemoryKind(42)"}
	for k, s := range want {
		if k.String() != s {
			t.Errorf("%d.String() = %q, want %q", uint8(k), k.String(), s)
		}
	}
}

// TestMemoryConstructorsStrides checks the strides and offsets each
// constructor derives, against the tensor shapes the frameworks document.
func TestMemoryConstructorsStrides(t *testing.T) {
	l := testDense(2, 4, nil) // HeadDim 4, 2 bytes, 4 tokens per block
	s, err := l.Shape(Parallel{TP: 2, PP: 1}, rnk(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	const blocks, vec = 3, 4 * 2 // head vector: 8 bytes; 2 local heads
	for _, tc := range []struct {
		kind              MemoryKind
		block, tok, head  uint64
		base              [][]uint64
		regionLen, offset uint64
	}{
		// [2, 3, 4, 2, 4] per layer: block = 4 tokens × 2 heads × 8.
		{MemNHD, 64, 2 * vec, vec, [][]uint64{{10, 10 + 3*64}, {10 + 6*64 + 5, 10 + 9*64 + 5}}, 10 + 12*64 + 10, 10},
		// [2, 3, 2, 4, 4]: head stride = 4 tokens × 8.
		{MemHND, 64, vec, 4 * vec, [][]uint64{{10, 10 + 3*64}, {10 + 6*64 + 5, 10 + 9*64 + 5}}, 10 + 12*64 + 10, 10},
		// V tensors first: V0, V1, K0, K1, each 3 × 64 bytes + 5.
		{MemSplitKV, 64, 2 * vec, vec, [][]uint64{{10 + 2*197, 10}, {10 + 3*197, 10 + 197}}, 10 + 4*197, 10},
		// Pool: block = 2 layers × 2 parts × 2 heads × 32 bytes + 5 pad.
		{MemGroupPool, 256 + 5, vec, 4 * vec, [][]uint64{{10, 10 + 64}, {10 + 128, 10 + 192}}, 10 + 3*261, 10},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			m := packedMemory(t, tc.kind, l, s, 0, blocks, tc.offset, 5)
			if m.BlockStride != tc.block || m.TokenStride != tc.tok || m.HeadStride != tc.head || m.ElemStride != 2 {
				t.Fatalf("strides block %d token %d head %d elem %d, want %d %d %d 2",
					m.BlockStride, m.TokenStride, m.HeadStride, m.ElemStride, tc.block, tc.tok, tc.head)
			}
			if fmt.Sprint(m.Base) != fmt.Sprint(tc.base) || m.RegionLen != tc.regionLen {
				t.Fatalf("Base %v RegionLen %d, want %v %d", m.Base, m.RegionLen, tc.base, tc.regionLen)
			}
			if m.HeadLo != 2 || m.Heads != 2 || m.Parts != 2 || m.Kind != tc.kind {
				t.Fatalf("heads [%d,+%d) parts %d kind %v", m.HeadLo, m.Heads, m.Parts, m.Kind)
			}
		})
	}
	mla := testMLA(2)
	ms, _ := mla.Shape(Parallel{TP: 2, PP: 1}, rnk(1, 0))
	m := packedMemory(t, MemMLA, mla, ms, 0, blocks, 0, 0)
	if m.Parts != 1 || m.Heads != 1 || m.HeadLo != 0 || m.BlockStride != 4*16 || m.TokenStride != 16 ||
		fmt.Sprint(m.Base) != "[[0] [192]]" {
		t.Fatalf("MLA memory %+v", m)
	}
}

func TestMemoryValidateErrors(t *testing.T) {
	l := testDense(2, 4, nil)
	s, _ := l.Shape(Parallel{TP: 1, PP: 1}, rnk(0, 0))
	good := func() *KVMemory { return packedMemory(t, MemNHD, l, s, 0, 3, 0, 0) }
	if err := good().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(m *KVMemory)
		names []string
	}{
		{"zero heads", func(m *KVMemory) { m.Heads = 0 }, []string{"Heads = 0"}},
		{"negative head", func(m *KVMemory) { m.HeadLo = -1 }, []string{"HeadLo = -1"}},
		{"three parts", func(m *KVMemory) { m.Parts = 3 }, []string{"Parts = 3"}},
		{"huge head dim", func(m *KVMemory) { m.HeadDim = MaxHeadDim + 1 }, []string{"HeadDim = 65537"}},
		{"layers descending", func(m *KVMemory) { m.Layers = []int{1, 0} }, []string{"Layers[1] = 0"}},
		{"missing base", func(m *KVMemory) { m.Base = m.Base[:1] }, []string{"1 base offset lists for 2 layers"}},
		{"one part offset", func(m *KVMemory) { m.Base[1] = m.Base[1][:1] }, []string{"Base[1] (layer 1) has 1 offsets"}},
		{"element stride below size", func(m *KVMemory) { m.ElemStride = 1 }, []string{"element stride 1 < element size 2"}},
		{"token stride overlaps heads", func(m *KVMemory) { m.TokenStride = 8 },
			[]string{"token stride 8", "head stride 8", "overlap"}},
		{"zero head stride", func(m *KVMemory) { m.HeadStride = 0 }, []string{"head stride 0", "overlap"}},
		{"block stride below block", func(m *KVMemory) { m.BlockStride = 100 },
			[]string{"block stride 100 < 128 bytes one block spans"}},
		{"past region", func(m *KVMemory) { m.RegionLen-- },
			[]string{"layer 1 V at offset 1152", "end past region length 1535"}},
		{"layers share a tensor", func(m *KVMemory) { m.Base[1][0] = m.Base[0][1] + 64 },
			[]string{"layer 1 K at offset 448 overlaps layer 0 V at offset 384"}},
		{"strides overflow", func(m *KVMemory) { m.TokenStride = 1 << 63 }, []string{"overflow"}},
		{"too many padded elements", func(m *KVMemory) { m.Heads, m.TokensPerBlock, m.ElemStride = 64, 65536, 4 },
			[]string{"65536 tokens × 64 heads × 4 elements at element stride 4", "more than 4194304"}},
		{"base overflow", func(m *KVMemory) { m.Base[1][1] = 1<<64 - 8 }, []string{"layer 1 V at offset 18446744073709551608"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := good()
			tc.edit(m)
			err := m.Validate()
			if !errors.Is(err, ErrBadMemory) {
				t.Fatalf("Validate = %v, want ErrBadMemory", err)
			}
			for _, n := range append(tc.names, "NHD memory of layers") {
				if !strings.Contains(err.Error(), n) {
					t.Fatalf("error %q does not name %q", err, n)
				}
			}
		})
	}

	// Interleaved tensors (a group pool) are fine; shifting one into its
	// neighbour is not, and neither is a block stride that lets block 1 of
	// one tensor land on block 0 of the next.
	p := packedMemory(t, MemGroupPool, l, s, 0, 3, 0, 0)
	p.Base[0][1] -= 2
	if err := p.Validate(); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("pool with V of layer 0 shifted into K: %v", err)
	}
	// Block 0 of V of layer 0 moved to the end of block 0 (from 128 to 448
	// of a 512-byte block) reaches into block 1 of K of layer 0.
	p = packedMemory(t, MemGroupPool, l, s, 0, 3, 0, 0)
	p.Base[0][1], p.RegionLen = 448, p.RegionLen+64
	if err := p.Validate(); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "layer 0 V at offset 448 overlaps layer 0 K at offset 0") {
		t.Fatalf("pool with V of layer 0 reaching into the next block: %v", err)
	}
	p = packedMemory(t, MemGroupPool, l, s, 0, 3, 0, 0)
	p.BlockStride = 64 * 3 // blocks of a 4-tensor block collide with the fourth tensor
	if err := p.Validate(); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("pool with block stride of 3 tensors: %v", err)
	}

	// Constructors refuse what does not fit them.
	mla := testMLA(2)
	ms, _ := mla.Shape(Parallel{TP: 1, PP: 1}, rnk(0, 0))
	if _, err := NHDMemory(mla, ms, 0, 2, []uint64{0, 1 << 10}, 1<<11); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "MLAMemory") {
		t.Fatalf("NHDMemory of an MLA layout: %v", err)
	}
	if _, err := MLAMemory(l, s, 0, 2, []uint64{0, 1 << 10}, 1<<11); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "not MLA") {
		t.Fatalf("MLAMemory of a dense layout: %v", err)
	}
	if _, err := NHDMemory(l, s, 0, 2, []uint64{0}, 1<<11); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "1 tensor offsets for 2 layers") {
		t.Fatalf("NHDMemory with one offset for two layers: %v", err)
	}
	if _, err := SplitKVMemory(l, s, 0, 2, []uint64{0, 1}, []uint64{2}, 1<<11); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "2 K offsets but 1 V offsets") {
		t.Fatalf("SplitKVMemory with mismatched offsets: %v", err)
	}
	if _, err := NHDMemory(l, s, 3, 2, nil, 1<<11); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "group 3") {
		t.Fatalf("NHDMemory of group 3: %v", err)
	}
}

// TestPropertyValidateAgreesWithByteMap draws small descriptors with
// arbitrary strides and offsets and compares Validate with a byte map of
// every element: an element past the region or a byte two elements share
// must be an error; a clean byte map must validate, except that Validate
// also refuses blocks of one tensor that interleave (a block stride below
// one block's span), which it names.
func TestPropertyValidateAgreesWithByteMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := &KVMemory{
			Heads:          rapid.IntRange(1, 3).Draw(t, "heads"),
			HeadLo:         rapid.IntRange(0, 2).Draw(t, "headLo"),
			Parts:          rapid.IntRange(1, 2).Draw(t, "parts"),
			HeadDim:        rapid.IntRange(1, 3).Draw(t, "dim"),
			ElemBytes:      rapid.IntRange(1, 2).Draw(t, "elem"),
			TokensPerBlock: rapid.IntRange(1, 3).Draw(t, "tpb"),
			Blocks:         rapid.IntRange(0, 3).Draw(t, "blocks"),
		}
		m.ElemStride = uint64(m.ElemBytes + rapid.IntRange(0, 2).Draw(t, "elemPad"))
		m.TokenStride = uint64(rapid.IntRange(0, 24).Draw(t, "tokenStride"))
		m.HeadStride = uint64(rapid.IntRange(0, 24).Draw(t, "headStride"))
		m.BlockStride = uint64(rapid.IntRange(0, 80).Draw(t, "blockStride"))
		layers := rapid.IntRange(1, 3).Draw(t, "layers")
		for L := range layers {
			m.Layers = append(m.Layers, L)
			var b []uint64
			for range m.Parts {
				b = append(b, uint64(rapid.IntRange(0, 160).Draw(t, "base")))
			}
			m.Base = append(m.Base, b)
		}
		m.RegionLen = uint64(rapid.IntRange(0, 320).Draw(t, "regionLen"))

		// With no blocks there are no elements, but strides that would
		// make one block's elements overlap are still refused: map one
		// block of one tensor, without the region bound.
		mapped, bounded := m, true
		if m.Blocks == 0 {
			one := *m
			one.Blocks, one.Parts, one.Layers, one.Base = 1, 1, m.Layers[:1], [][]uint64{{0}}
			mapped, bounded = &one, false
		}
		owner := map[uint64]string{}
		var clash string
		ids := make([]BlockID, mapped.Blocks)
		for i := range ids {
			ids[i] = BlockID(i)
		}
		eachElement(mapped, ids, 0, mapped.Layers, m.HeadLo, m.HeadLo+m.Heads, func(off uint64, layer, part, head, token, elem int) {
			who := fmt.Sprint(layer, part, head, token, elem)
			for b := range uint64(m.ElemBytes) {
				if bounded && off+b >= m.RegionLen && clash == "" {
					clash = fmt.Sprintf("element %s byte at %d past region %d", who, off+b, m.RegionLen)
				}
				if o, ok := owner[off+b]; ok && clash == "" {
					clash = fmt.Sprintf("elements %s and %s share byte %d", o, who, off+b)
				}
				owner[off+b] = who
			}
		})
		err := m.Validate()
		switch {
		case clash != "" && err == nil:
			t.Fatalf("Validate = nil but %s", clash)
		case err != nil && !errors.Is(err, ErrBadMemory):
			t.Fatalf("Validate = %v, not ErrBadMemory", err)
		case clash == "" && err != nil && !strings.Contains(err.Error(), "block stride"):
			t.Fatalf("byte map clean but Validate = %v", err)
		}
	})
}

// TestFrameworkMemory: each framework kind name builds the descriptor its
// constructor builds; an unknown name is an ErrBadMemory naming it.
func TestFrameworkMemory(t *testing.T) {
	l := testDense(2, 4, nil)
	s, err := l.Shape(Parallel{TP: 1, PP: 1}, rnk(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	const blocks, region = 3, 1 << 20
	offs, voffs := []uint64{0, 4096}, []uint64{8192, 12288}
	for kind, want := range map[string]func() (*KVMemory, error){
		"nhd":      func() (*KVMemory, error) { return NHDMemory(l, s, 0, blocks, offs, region) },
		"hnd":      func() (*KVMemory, error) { return HNDMemory(l, s, 0, blocks, offs, region) },
		"split_kv": func() (*KVMemory, error) { return SplitKVMemory(l, s, 0, blocks, offs, voffs, region) },
		"mla":      func() (*KVMemory, error) { return MLAMemory(l, s, 0, blocks, offs, region) },
	} {
		got, gerr := FrameworkMemory(kind, l, s, 0, blocks, offs, voffs, region)
		w, werr := want()
		if (gerr == nil) != (werr == nil) || (gerr == nil && !reflect.DeepEqual(got, w)) {
			t.Fatalf("%s: %+v %v, want %+v %v", kind, got, gerr, w, werr)
		}
	}
	if _, err := FrameworkMemory("nchw", l, s, 0, blocks, offs, nil, region); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), `"nchw"`) {
		t.Fatalf("unknown kind: %v, want ErrBadMemory naming it", err)
	}
}

// TestFrameworkMemoryStridedInterleaved: vLLM's cross-layer tensor in
// FlashAttention's HND order (block, head, layer, K/V, token, dim) puts
// each layer's K and V a few hundred bytes from the next layer's, heads a
// layer-row apart: FrameworkMemoryStrided validates it with those strides
// (FrameworkMemory first checks the offsets against contiguous tensors,
// which overlap: the C ABI refused such caches that way), and still
// refuses strides that do make two layers share bytes.
func TestFrameworkMemoryStridedInterleaved(t *testing.T) {
	const layers, heads, blocks = 4, 2, 8
	l := testDense(layers, heads, nil)
	s, err := l.Shape(Parallel{TP: 1, PP: 1}, rnk(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	e := uint64(l.DTypeBytes)
	row := uint64(l.TokensPerBlock*l.HeadDim) * e // one head's tokens of one part
	st := TensorStrides{Block: heads * layers * 2 * row, Token: uint64(l.HeadDim) * e, Head: layers * 2 * row, Elem: e, KV: row}
	offs := make([]uint64, layers)
	for i := range offs {
		offs[i] = uint64(i) * 2 * row
	}
	end := blocks * st.Block
	if _, err := NHDMemory(l, s, 0, blocks, offs, end); !errors.Is(err, ErrBadMemory) {
		t.Fatalf("NHDMemory (contiguous strides) of interleaved layers: %v, want the overlap it sees", err)
	}
	m, err := FrameworkMemoryStrided("nhd", l, s, 0, blocks, offs, nil, st, end)
	if err != nil {
		t.Fatalf("FrameworkMemoryStrided of vLLM's FlashAttention HND cross-layer order: %v", err)
	}
	if off, n, ok := m.TensorBlock(1, 1, 3); !ok || off != 3*st.Block+2*row+row || n == 0 {
		t.Fatalf("layer 1 V block 3 at %d (%d bytes, %v), want %d", off, n, ok, 3*st.Block+3*row)
	}
	// The same layout on both sides moves whole blocks: in source order the
	// per-(layer, part, head) pieces merge (before, a plan had one piece for
	// each, 16 here: a chunk moved 2.7x slower in process).
	link := PeerLink{Ctx: rnk(0, 0), Gen: rnk(0, 0), HeadLo: 0, HeadHi: heads, Layers: [][]int{{0, 1, 2, 3}}}
	plan, err := NewMemoryPlan(link, 0, m, m)
	if err != nil {
		t.Fatal(err)
	}
	if st := plan.Stats(); st.PiecesPerBlock != 1 || !st.WholeBlock || st.BytesPerBlock != st.MaxPiece {
		t.Fatalf("plan between two FlashAttention HND cross-layer memories: %+v, want whole blocks", st)
	}
	native, err := PoolMemory(l, s, 0, PoolGeometry{BlockBytes: st.Block, Blocks: blocks})
	if err != nil {
		t.Fatal(err)
	}
	cross, err := NewMemoryPlan(link, 0, native, m)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cross.Stats().PiecesPerBlock, layers*2*heads; got != want {
		t.Fatalf("plan from kvxfer's block layout into FlashAttention's: %d pieces a block, want %d (one per layer, part and head)", got, want)
	}
	bad := st
	bad.Head = row // heads one part-row apart: head 1 of K lands on V
	if _, err := FrameworkMemoryStrided("nhd", l, s, 0, blocks, offs, nil, bad, end); !errors.Is(err, ErrBadMemory) || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("strides making K's head 1 land on V: %v, want an overlap", err)
	}
}
