package actors

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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

// Pools whose blocks are ids over memory a descriptor lays out (an
// engine over Config.Memory: blocks of one byte each) count the
// quarantine's bytes and its default bound by what SetBlockWeights says a
// block holds, so that a bound given in bytes is one: one block of 4 KiB
// quarantined fills a bound of 4 KiB, and the next Alloc waits.
// (Checked to fail: counted as one byte a block, 4 KiB of bound took
// 4096 blocks.)
func TestPoolsQuarantineCountsBlockWeights(t *testing.T) {
	p := testPools(t, 8, 1)
	p.SetBlockWeights([]uint64{4096, 0})
	if got, want := p.QuarantineLimit(), uint64(8*4096+8*1)/2; got != want {
		t.Fatalf("default limit %d, want %d (half of 8 blocks of 4096 bytes and 8 of 1)", got, want)
	}
	p.SetQuarantineLimit(4096)
	a, err := p.Alloc([]int{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Quarantine(a); err != nil {
		t.Fatal(err)
	}
	if qb := p.QuarantinedBytes(); qb != 4096+1 {
		t.Fatalf("quarantined %d bytes, want %d (a block of each group)", qb, 4096+1)
	}
	if _, err := p.Alloc([]int{1, 0}); !errors.Is(err, ErrQuarantineFull) {
		t.Fatalf("Alloc past a bound of one block's bytes: %v, want ErrQuarantineFull", err)
	}
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

// TestPoolsAllocWait: AllocWait returns at once what fits, fails at once
// what no free can make fit, waits while blocks are in use until a free
// makes room, and gives up, naming both (the end first: a cancel read as
// "out of blocks" sent a review's user to grow the pool), when its ctx
// ends while it waits.
func TestPoolsAllocWait(t *testing.T) {
	p := testPools(t, 4, 64)
	all, err := p.AllocWait(context.Background(), []int{4, 4})
	if err != nil {
		t.Fatalf("AllocWait of free blocks: %v", err)
	}
	if _, err := p.AllocWait(context.Background(), []int{5, 0}); !errors.Is(err, kvcache.ErrPoolTooSmall) {
		t.Fatalf("AllocWait larger than the pool: %v, want ErrPoolTooSmall at once", err)
	}
	type res struct {
		ids [][]kvcache.BlockID
		err error
	}
	got := make(chan res, 1)
	go func() {
		ids, err := p.AllocWait(context.Background(), []int{1, 0})
		got <- res{ids, err}
	}()
	if err := p.Free(all); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil || len(r.ids) != 2 || len(r.ids[0]) != 1 {
			t.Fatalf("AllocWait after a free: %v %v, want one block of group 0", r.ids, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AllocWait still waiting 10s after a free made room")
	}
	if _, err := p.Alloc([]int{3, 4}); err != nil { // the pools are full again
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		ids, err := p.AllocWait(ctx, []int{1, 0})
		got <- res{ids, err}
	}()
	cancel()
	select {
	case r := <-got:
		if !errors.Is(r.err, kvcache.ErrOutOfBlocks) || !errors.Is(r.err, context.Canceled) ||
			!strings.HasPrefix(r.err.Error(), "waiting for blocks ended (context canceled): ") {
			t.Fatalf("AllocWait whose ctx ended: %v %v, want the cancel first, wrapping it and ErrOutOfBlocks", r.ids, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AllocWait still waiting 10s after its ctx ended")
	}
}
