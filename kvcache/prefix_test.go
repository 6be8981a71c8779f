package kvcache

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestBlockHashesGolden pins the documented encoding; the values were
// computed independently (Python hashlib) from the formula in BlockHashes.
func TestBlockHashesGolden(t *testing.T) {
	got := BlockHashes([]int32{1, 2, 3, 4, 5, 6, 7, -1, 9}, 4, 0)
	want := []uint64{0x9c3fb1b4d48d2330, 0xda34abdd63a3bf18}
	if !slices.Equal(got, want) {
		t.Fatalf("BlockHashes = %#x, want %#x", got, want)
	}
}

func TestBlockHashesPartialAndEdgeCases(t *testing.T) {
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		name   string
		tokens []int32
		tpb    int
		want   int
	}{
		{"partial last block dropped", tokens, 4, 2},
		{"exact", tokens[:8], 4, 2},
		{"shorter than a block", tokens[:3], 4, 0},
		{"empty", nil, 4, 0},
		{"one token per block", tokens, 1, 10},
		{"zero tpb", tokens, 0, 0},
		{"negative tpb", tokens, -4, 0},
	}
	for _, tt := range tests {
		if got := BlockHashes(tt.tokens, tt.tpb, 0); len(got) != tt.want {
			t.Errorf("%s: %d hashes, want %d", tt.name, len(got), tt.want)
		}
	}
	// The partial block never influences the full blocks' hashes.
	a := BlockHashes(tokens[:9], 4, 0)
	b := BlockHashes(tokens[:8], 4, 0)
	if !slices.Equal(a, b) {
		t.Fatal("a partial tail changed the full blocks' hashes")
	}
}

// TestBlockHashesChained: changing token k changes the hash of its block and
// every later block, and no earlier one; the parent changes every hash.
func TestBlockHashesChained(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tpb := rapid.IntRange(1, 8).Draw(t, "tpb")
		tokens := rapid.SliceOfN(rapid.Int32(), tpb, 8*tpb).Draw(t, "tokens")
		parent := rapid.Uint64().Draw(t, "parent")
		base := BlockHashes(tokens, tpb, parent)
		k := rapid.IntRange(0, len(tokens)-1).Draw(t, "k")
		mod := slices.Clone(tokens)
		mod[k]++
		got := BlockHashes(mod, tpb, parent)
		for i := range base {
			changed := got[i] != base[i]
			if want := i >= k/tpb; changed != want {
				t.Fatalf("token %d changed: block %d hash changed=%t, want %t", k, i, changed, want)
			}
		}
		other := BlockHashes(tokens, tpb, parent+1)
		for i := range base {
			if other[i] == base[i] {
				t.Fatalf("parent change left block %d's hash unchanged", i)
			}
		}
	})
}

func TestPrefixIndex(t *testing.T) {
	var x PrefixIndex // the zero value works
	if n, ids := x.Lookup([]uint64{1}); n != 0 || len(ids) != 0 {
		t.Fatalf("empty Lookup = %d, %v", n, ids)
	}
	if !x.Insert(10, 3) || !x.Insert(20, 4) || !x.Insert(40, 6) {
		t.Fatal("Insert of new hashes returned false")
	}
	if x.Insert(10, 9) {
		t.Fatal("Insert of an indexed hash returned true")
	}
	if id, ok := x.Get(10); !ok || id != 3 {
		t.Fatalf("Get(10) = %d, %t; want the first inserted block 3", id, ok)
	}
	tests := []struct {
		hashes []uint64
		n      int
		ids    []BlockID
	}{
		{[]uint64{10, 20, 30, 40}, 2, []BlockID{3, 4}}, // stops at the first miss
		{[]uint64{10, 20}, 2, []BlockID{3, 4}},
		{[]uint64{30, 10}, 0, nil},
		{nil, 0, nil},
	}
	for _, tt := range tests {
		n, ids := x.Lookup(tt.hashes)
		if n != tt.n || !slices.Equal(ids, tt.ids) {
			t.Errorf("Lookup(%v) = %d, %v; want %d, %v", tt.hashes, n, ids, tt.n, tt.ids)
		}
	}
	if !x.Remove(20) || x.Remove(20) {
		t.Fatal("Remove(20) should report true then false")
	}
	if n, _ := x.Lookup([]uint64{10, 20}); n != 1 || x.Len() != 2 {
		t.Fatalf("after Remove: Lookup n = %d, Len = %d", n, x.Len())
	}
	if id, ok := x.Get(20); ok || id != NoBlock {
		t.Fatalf("Get(removed) = %d, %t", id, ok)
	}
	if NewPrefixIndex().Len() != 0 {
		t.Fatal("NewPrefixIndex not empty")
	}
}

// TestPrefixReuseFlow shows the intended use: a second request sharing a
// prompt prefix finds the first request's full blocks, not its partial one.
func TestPrefixReuseFlow(t *testing.T) {
	l, _ := Preset("Llama-3.1-8B")
	l = l.WithTokensPerBlock(4)
	first := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	second := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	x := NewPrefixIndex()
	for i, h := range BlockHashes(first, l.TokensPerBlock, l.Hash()) {
		x.Insert(h, BlockID(100+i))
	}
	n, ids := x.Lookup(BlockHashes(second, l.TokensPerBlock, l.Hash()))
	if n != 2 || !slices.Equal(ids, []BlockID{100, 101}) {
		t.Fatalf("Lookup = %d, %v; want the 2 full shared blocks", n, ids)
	}
	other := l.WithTokensPerBlock(4)
	other.Name = "other"
	if n, _ := x.Lookup(BlockHashes(second, 4, other.Hash())); n != 0 {
		t.Fatal("a different layout hash as parent still matched")
	}
}

func BenchmarkBlockHashes(b *testing.B) {
	tokens := make([]int32, 8192)
	for i := range tokens {
		tokens[i] = int32(i * 7919)
	}
	b.SetBytes(int64(4 * len(tokens)))
	for b.Loop() {
		BlockHashes(tokens, 32, 0)
	}
}
