package capi

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestChunkCUDAWithoutDriver: a chunk behind a CUDA event is refused with
// ErrInvalidArgument naming cu_event when the handle is 0, and (where no
// CUDA driver is usable) with ErrUnsupported naming the missing driver;
// a refused chunk leaves the request going: a plain chunk then completes
// it. The driver case is skipped where a driver is present (test/gpu
// covers that side).
func TestChunkCUDAWithoutDriver(t *testing.T) {
	base := HandleCount()
	p, d := open(t, "capi-cu-p"), open(t, "capi-cu-d")
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "cu", PromptLen: 32, Context: "capi-cu-p"}})
	if err != nil {
		t.Fatal(err)
	}
	tx, th, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "cu", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	runs := []kvcache.BlockRun{{First: 0, IDs: src}}
	if err := tx.ChunkCUDA(0, 32, true, runs, 0, 0); Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "cu_event is 0") {
		t.Fatalf("ChunkCUDA(cu_event 0) = %v (%v), want INVALID_ARGUMENT naming cu_event", err, Code(err))
	}
	if err := tx.ChunkCUDA(0, 32, true, runs, 0x1000, -1); Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "device -1") {
		t.Fatalf("ChunkCUDA(device -1) = %v (%v), want INVALID_ARGUMENT naming the device", err, Code(err))
	}
	if cuda.Init() == nil {
		t.Log("a CUDA driver is present: its absence is not tested here")
	} else {
		err := tx.ChunkCUDA(0, 32, true, runs, 0x1000, 0) // no driver: the handle is never used
		if Code(err) != ErrUnsupported || !strings.Contains(err.Error(), "no CUDA driver") {
			t.Fatalf("ChunkCUDA without a driver = %v (%v), want UNSUPPORTED naming the missing CUDA driver", err, Code(err))
		}
		t.Logf("without a driver: %v", err)
	}
	if _, err := tx.Chunk(0, 32, true, runs, false); err != nil {
		t.Fatalf("plain chunk after the refused ones: %v", err)
	}
	if ev := waitFor(t, p, th); ev.Outcome != OutcomeDone {
		t.Fatalf("tx %+v", ev)
	}
	if ev := waitFor(t, d, rh); ev.Outcome != OutcomeReady {
		t.Fatalf("rx %+v", ev)
	}
	closeBoth(t, p, d)
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}
