package kvcache

import (
	"math"
	"math/rand"
	"os"
	"strconv"
	"testing"
)

// TestFrameworkMemoryStridedAcceptsOnlyDisjointInRegion: every descriptor FrameworkMemoryStrided
// accepts, over random (and hostile) strides and offsets, keeps each element
// inside the region and no two elements on one byte.
func TestFrameworkMemoryStridedAcceptsOnlyDisjointInRegion(t *testing.T) {
	const layers, heads, blocks = 3, 2, 3
	l := testDense(layers, heads, nil)
	l.TokensPerBlock, l.HeadDim = 2, 2
	s, err := l.Shape(Parallel{TP: 1, PP: 1}, rnk(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	pick := func() uint64 {
		switch r.Intn(8) {
		case 0:
			return 0
		case 1:
			return math.MaxUint64 - uint64(r.Intn(64))
		case 2:
			return 1 << (60 + r.Intn(4))
		}
		return uint64(2 * r.Intn(48))
	}
	accepted := 0
	for it := 0; it < stridedCases(); it++ {
		st := TensorStrides{Block: pick(), Token: pick(), Head: pick(), Elem: pick(), KV: pick()}
		offs := make([]uint64, len(s.Layers[0]))
		for i := range offs {
			offs[i] = pick()
		}
		region := uint64(200 + r.Intn(800))
		if r.Intn(4) == 0 {
			region = math.MaxUint64 >> 2
		}
		m, err := FrameworkMemoryStrided("nhd", l, s, 0, blocks, offs, nil, st, region)
		if err != nil {
			continue
		}
		accepted++
		seen := map[uint64]string{}
		for i := range m.Layers {
			for p := range m.Parts {
				for b := range uint64(m.Blocks) {
					for tk := range uint64(m.TokensPerBlock) {
						for h := range uint64(m.Heads) {
							for e := range uint64(m.HeadDim) {
								o := m.Base[i][p] + b*m.BlockStride + tk*m.TokenStride + h*m.HeadStride + e*m.ElemStride
								for x := range uint64(m.ElemBytes) {
									if o+x >= m.RegionLen || o+x < o {
										t.Fatalf("strides %+v offsets %v region %d: byte %d outside", st, offs, region, o+x)
									}
									if _, dup := seen[o+x]; dup {
										t.Fatalf("strides %+v offsets %v: byte %d twice", st, offs, o+x)
									}
									seen[o+x] = ""
								}
							}
						}
					}
				}
			}
		}
	}
	if accepted == 0 {
		t.Fatal("no descriptor accepted: the check proves nothing")
	}
	t.Logf("%d accepted", accepted)
}

// stridedCases is how many random descriptors the property test draws:
// 100,000 (a fraction of a second), or $KVXFER_STRIDED_CASES (a review ran
// 2,000,000: 107 accepted, every one disjoint and inside its region).
func stridedCases() int {
	if n, err := strconv.Atoi(os.Getenv("KVXFER_STRIDED_CASES")); err == nil && n > 0 {
		return n
	}
	return 100000
}
