package capi

import (
	"fmt"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestPoolMisuseIsInvalidArgument: freeing blocks a live receive owns, or
// blocks already free, is the caller's mistake: KVXFER_ERR_INVALID_ARGUMENT,
// not KVXFER_ERR_INTERNAL.
func TestPoolMisuseIsInvalidArgument(t *testing.T) {
	for _, err := range []error{kvcache.ErrBlockReceiving, kvcache.ErrBlockQuarantined, kvcache.ErrNotQuarantined,
		kvcache.ErrNotReceiving, kvcache.ErrBlockFree, kvcache.ErrBadCount, kvcache.ErrDoubleFree} {
		if got := Code(fmt.Errorf("engine 1 group 0: %w", err)); got != ErrInvalidArgument {
			t.Errorf("Code(%v) = %v, want %v", err, got, ErrInvalidArgument)
		}
	}

	p, d := open(t, "capi-misuse-p"), open(t, "capi-misuse-d")
	defer closeBoth(t, p, d)
	ids, err := d.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	rx, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "misuse", PromptLen: 32,
		Context: "capi-misuse-p", Blocks: [][]kvcache.BlockID{ids}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.FreeBlocks(0, ids); Code(err) != ErrInvalidArgument {
		t.Fatalf("freeing blocks a live receive owns: %v (%v), want %v", err, Code(err), ErrInvalidArgument)
	}
	rx.Cancel()
	if ev := waitFor(t, d, rh); ev.Outcome != OutcomeCancelled {
		t.Fatalf("rx %+v, want CANCELLED", ev)
	}
	if err := rx.Release(); err != nil {
		t.Fatal(err)
	}
	// The cancelled receive gave the blocks back: they free once, and a
	// second free is the caller's mistake too.
	if err := d.FreeBlocks(0, ids); err != nil {
		t.Fatal(err)
	}
	if err := d.FreeBlocks(0, ids); Code(err) != ErrInvalidArgument {
		t.Fatalf("double free: %v (%v), want %v", err, Code(err), ErrInvalidArgument)
	}
}
