package node

import (
	"os"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
)

// TestRevokeBlock: the unit of revocation is the layer groups' common
// block size when it is whole pages and divides the pool, else the page.
func TestRevokeBlock(t *testing.T) {
	page := uint64(os.Getpagesize())
	c := Config{Model: "Llama-3.1-8B"}
	l, err := c.kvLayout()
	if err != nil {
		t.Fatal(err)
	}
	shape, err := l.Shape(kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{})
	if err != nil {
		t.Fatal(err)
	}
	bb := shape.BlockBytes(l, 0)
	if got := c.revokeBlock(1 << 30); got != bb || bb <= page {
		t.Fatalf("Llama-3.1-8B: block %d, want its KV block of %d bytes", got, bb)
	}
	if got := c.revokeBlock(1<<30 + page); got != page {
		t.Fatalf("a pool that is not whole blocks: %d, want the page %d", got, page)
	}
	tiny := &kvcache.Layout{Name: "tiny", Layers: 1, KVHeads: 1, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(1)}
	if got := (Config{Layout: tiny}).revokeBlock(1 << 20); got != page {
		t.Fatalf("blocks of %d bytes: %d, want the page %d", uint64(16*8*2*2), got, page)
	}
}
