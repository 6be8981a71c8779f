package capi

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestReceiveContextStages: a receive names a context whose two pipeline
// stages split the 4 layers 1 + 3 (not kvxfer's default 2 + 2) through
// ContextParallel.Stages (kvxfer_receive_stages' context_pp_stages): a
// split that is no list of context_pp counts adding up to the model's
// layers is refused with ErrInvalidArgument naming it, opening nothing,
// and the right one receives every layer of both stages where it belongs.
func TestReceiveContextStages(t *testing.T) {
	const stages = "1,3"
	ctx := make([]*Engine, 2)
	for r := range ctx {
		e, _, err := Open(fmt.Sprintf(`{"instance":"capi-st-p",%s,"pool_bytes":65536,"workers":2,"pp":2,"pp_stages":%q,"rank_pp":%d}`,
			partsLayout, stages, r), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ctx[r] = e
	}
	d := openParts(t, "capi-st-d")
	defer closeBoth(t, append(ctx, d)...)

	for _, c := range []struct {
		stages string
		pp     int
		want   string
	}{
		{"1,x", 2, `stage 1's layer count "x"`},
		{"1, 3", 2, `stage 1's layer count " 3"`},
		{"0,4", 2, `stage 0's layer count "0"`},
		{"1,3", 3, "2 stages, the context's PP (context_pp) is 3"},
		{"1,3", 0, "2 stages, the context's PP (context_pp) is 0"},
		{"2,3", 2, "5 layers in all, the model has 4"},
	} {
		_, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "st-bad", PromptLen: 32, Context: "capi-st-p",
			ContextParallel: kvcache.Parallel{TP: 1, PP: c.pp, Stages: c.stages}}})
		if Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("context_pp_stages %q", c.stages)) ||
			!strings.Contains(err.Error(), c.want) {
			t.Fatalf("stages %q over PP %d: %v (%s), want %s naming the value and %q", c.stages, c.pp, err, Code(err),
				ErrInvalidArgument, c.want)
		}
	}
	if n, err := d.UsedBlocks(0); err != nil || n != 0 {
		t.Fatalf("refused receives hold %d blocks (%v)", n, err)
	}

	rx, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "st", PromptLen: 32, Context: "capi-st-p",
		ContextParallel: kvcache.Parallel{TP: 1, PP: 2, Stages: stages}}})
	if err != nil {
		t.Fatal(err)
	}
	ths := make([]uint64, len(ctx))
	var srcs [][]kvcache.BlockID
	for r, e := range ctx {
		lo, hi := kvcache.Parallel{TP: 1, PP: 2, Stages: stages}.StageLayers(partsLayers, r)
		src, err := e.AllocBlocks(0, 2)
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, src)
		geom := e.Inner().Pools().Geometry(0)
		per := int(geom.BlockBytes) / (hi - lo)
		for blk, id := range src {
			buf := e.Inner().Region().Bytes()[geom.Offset+uint64(id)*geom.BlockBytes:]
			for layer := lo; layer < hi; layer++ {
				for i := range per {
					buf[(layer-lo)*per+i] = partPattern(9, blk, layer, i)
				}
			}
		}
		tx, th, err := e.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "st", PromptLen: 32}})
		if err != nil {
			t.Fatal(err)
		}
		ths[r] = th
		if _, err := tx.Chunk(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, false); err != nil {
			t.Fatal(err)
		}
	}
	for r, e := range ctx {
		if ev := waitFor(t, e, ths[r]); ev.Outcome != OutcomeDone {
			t.Fatalf("context rank pp%d: %+v", r, ev)
		}
		if err := e.FreeBlocks(0, srcs[r]); err != nil {
			t.Fatal(err)
		}
	}
	if ev := waitFor(t, d, rh); ev.Outcome != OutcomeReady {
		t.Fatalf("receive: %+v", ev)
	}
	if n := verifyLayers(t, d, rx, 9); n == 0 {
		t.Fatal("nothing received")
	}
	if err := rx.FreeBlocks(); err != nil {
		t.Fatal(err)
	}
}
