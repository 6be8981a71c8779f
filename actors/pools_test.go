package actors

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
)

func testPools(t *testing.T, blocks int, blockBytes uint64) *Pools {
	t.Helper()
	r, err := kvcache.HostBytesRegion(make([]byte, 2*uint64(blocks)*blockBytes))
	if err != nil {
		t.Fatal(err)
	}
	var pools []*kvcache.Pool
	for g := range 2 {
		p, err := kvcache.NewPool(r, uint64(g*blocks)*blockBytes, blockBytes, blocks)
		if err != nil {
			t.Fatal(err)
		}
		pools = append(pools, p)
	}
	return NewPools(pools)
}

// Issue 17: quarantined blocks are neither free nor used, counted in
// bytes, and past the bound Alloc refuses with ErrQuarantineFull (which
// wraps kvcache.ErrOutOfBlocks, so the allocation queue waits) although
// blocks are free; a proof (ReleaseQuarantine) makes them free again.
func TestPoolsQuarantineBound(t *testing.T) {
	p := testPools(t, 8, 64)
	if got := p.QuarantineLimit(); got != 8*64 { // half of 2×8×64
		t.Fatalf("default limit %d, want %d", got, 8*64)
	}
	p.SetQuarantineLimit(3 * 64)
	a, err := p.Alloc([]int{2, 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Alloc([]int{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Quarantine(a); err != nil {
		t.Fatal(err)
	}
	if err := p.Quarantine(a); err == nil {
		t.Fatal("quarantining quarantined blocks again succeeded")
	}
	if err := p.Free(a); err == nil {
		t.Fatal("Free of quarantined blocks succeeded")
	}
	if q, u, qb := p.Quarantined(), p.Used(), p.QuarantinedBytes(); q != 3 || u != 2 || qb != 3*64 {
		t.Fatalf("quarantined %d blocks %d bytes, used %d; want 3, 192, 2", q, qb, u)
	}
	_, err = p.Alloc([]int{1, 0})
	if !errors.Is(err, ErrQuarantineFull) || !errors.Is(err, kvcache.ErrOutOfBlocks) {
		t.Fatalf("Alloc past the quarantine bound: %v, want ErrQuarantineFull wrapping ErrOutOfBlocks", err)
	}
	// All or nothing: a batch with one bad block quarantines nothing.
	if err := p.Quarantine([][]kvcache.BlockID{b[0], {7}}); err == nil {
		t.Fatal("Quarantine of a free block succeeded")
	}
	if q := p.Quarantined(); q != 3 {
		t.Fatalf("a refused Quarantine changed the count to %d", q)
	}
	if err := p.ReleaseQuarantine(a); err != nil {
		t.Fatal(err)
	}
	if q, qb := p.Quarantined(), p.QuarantinedBytes(); q != 0 || qb != 0 {
		t.Fatalf("after the proof: %d quarantined (%d bytes)", q, qb)
	}
	c, err := p.Alloc([]int{1, 0})
	if err != nil {
		t.Fatalf("Alloc after the quarantine emptied: %v", err)
	}
	if err := p.Free(c); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(b); err != nil {
		t.Fatal(err)
	}
}
