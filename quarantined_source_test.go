package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestChunkRefusesQuarantinedSource: a source block in quarantine is
// refused as quarantined (ErrPin, kvcache.ErrBlockQuarantined), naming
// it; before, the error wrapped kvcache.ErrBlockFree and read "block is
// free", which it is not (nobody may allocate it until its quarantine is
// released). Nothing is pinned, and the request goes on once the caller
// hands blocks it holds.
func TestChunkRefusesQuarantinedSource(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, tp1, tp1, 2)
	ctx := c.ctx[0]
	src, err := ctx.Pools().Alloc([]int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	q := src[0][2]
	if err := ctx.Pools().Quarantine([][]kvcache.BlockID{{q}}); err != nil {
		t.Fatal(err)
	}
	tx, err := ctx.Send(context.Background(), kvxfer.SendRequest{ID: "q", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	whole := kvcache.Chunk{Start: 0, End: 64, Last: true}
	err = tx.Chunk(whole, whole.Runs(l.TokensPerBlock, src), nil)
	if !errors.Is(err, kvxfer.ErrPin) || !errors.Is(err, kvcache.ErrBlockQuarantined) || errors.Is(err, kvcache.ErrBlockFree) ||
		!strings.Contains(err.Error(), fmt.Sprintf("block %d is quarantined", q)) {
		t.Fatalf("chunk naming quarantined block %d: %v, want ErrPin and ErrBlockQuarantined (not ErrBlockFree) naming it", q, err)
	}
	if st := ctx.Pools().Stats(); st[0].Pinned != 0 || st[1].Pinned != 0 {
		t.Fatalf("a refused chunk pinned blocks: %+v", st)
	}
	tx.Cancel()
	waitOutcome(t, tx.Done())
	if err := ctx.Pools().ReleaseQuarantine([][]kvcache.BlockID{{q}}); err != nil {
		t.Fatal(err)
	}
	src[0] = append(src[0][:2], src[0][3:]...)
	if err := ctx.FreeBlocks(src); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}
