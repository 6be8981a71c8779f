package capi

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestReceiveRunFirstChecked: a destination run must start at its group's
// first needed block (a sliding window of 32 tokens over a 100-token
// prompt: block 4 of [4, 7)). One starting elsewhere is refused naming the
// group, its first and the expected one; before, it was taken and READY's
// ids held other global blocks than the caller's run said.
func TestReceiveRunFirstChecked(t *testing.T) {
	base := HandleCount()
	d, _, err := Open(`{"instance":"capi-first","layout":{"layers":2,"kv_heads":2,"head_dim":4,"dtype_bytes":2,`+
		`"tokens_per_block":16,"groups":[{"name":"swa","layers":[0,1],"window":32}]},"pool_bytes":65536,"workers":2}`, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := d.AllocBlocks(0, 3)
	if err != nil {
		t.Fatal(err)
	}
	req := func(first int) ReceiveRequest {
		return ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 100, Context: "capi-nobody",
			Blocks: [][]kvcache.BlockID{dst}}, Firsts: []int{first}}
	}
	for _, first := range []int{0, 3, 5} {
		_, _, err := d.Receive(req(first))
		if Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "blocks[0].first = ") ||
			!strings.Contains(err.Error(), "want 4: layer group 0 receives global blocks [4, 7)") {
			t.Fatalf("a run at block %d for needed blocks [4, 7): %v", first, err)
		}
	}
	rx, rh, err := d.Receive(req(4))
	if err != nil {
		t.Fatal(err)
	}
	rx.Cancel()
	if ev := waitFor(t, d, rh); ev.Outcome != OutcomeCancelled {
		t.Fatalf("%+v", ev)
	}
	if err := rx.Release(); err != nil {
		t.Fatal(err)
	}
	if err := d.FreeBlocks(0, dst); err != nil {
		t.Fatal(err)
	}
	closeBoth(t, d)
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}
