package node

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
)

// TestPeerMapCache: a parallelism's map is computed once and is the one
// a fresh computation gives; an error is returned and not cached; the
// cache never holds more than maxPeerMaps maps.
func TestPeerMapCache(t *testing.T) {
	l := kvcache.Layout{Name: "t", Layers: 4, KVHeads: 8, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(4)}
	gen := kvcache.Parallel{TP: 2, PP: 1}
	var c peerMapCache
	cp := kvcache.Parallel{TP: 4, PP: 1}
	a, err := c.get(l, cp, gen)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.get(l, cp, gen)
	if err != nil || a != b {
		t.Fatalf("second get: %p, %v; want the cached %p", b, err, a)
	}
	fresh, err := kvcache.NewPeerMap(l, cp, gen)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < gen.TP; r++ {
		rk := kvcache.Rank{TP: r}
		if got, want := a.WritersOf(rk), fresh.WritersOf(rk); len(got) != len(want) || (len(got) > 0 && got[0] != want[0]) {
			t.Fatalf("rank %v: cached writers %v, fresh %v", rk, got, want)
		}
	}

	bad := kvcache.Parallel{TP: 3, PP: 1} // 8 KV heads do not split 3 ways
	if _, err := c.get(l, bad, gen); !errors.Is(err, kvcache.ErrBadParallelism) {
		t.Fatalf("TP 3 over 8 KV heads: %v, want ErrBadParallelism", err)
	}
	if _, ok := c.m[bad]; ok {
		t.Fatal("an error was cached")
	}

	deep := l
	deep.Layers = 4 * maxPeerMaps
	deep.Groups = kvcache.FullAttention(deep.Layers)
	var d peerMapCache
	full := false
	for pp := 1; pp <= 2*maxPeerMaps; pp++ {
		if _, err := d.get(deep, kvcache.Parallel{TP: 1, PP: pp}, gen); err != nil {
			t.Fatalf("PP %d over %d layers: %v", pp, deep.Layers, err)
		}
		if len(d.m) > maxPeerMaps {
			t.Fatalf("%d maps cached, bound %d", len(d.m), maxPeerMaps)
		}
		full = full || len(d.m) == maxPeerMaps
	}
	if !full {
		t.Fatalf("the cache never filled to %d maps", maxPeerMaps)
	}
}
