package gpu_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/capi"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestChunkBehindCUDAEvent is the C ABI's CUDA-event fence on a GPU,
// driven from Go through package capi (the calls kvxfer_chunk_cuda makes):
// two in-process engines with host pools; "prefill" memsets a device
// buffer block by block on a stream, copies it into the context engine's
// source blocks on the same stream, and records an event — created by
// package cuda, not torch — behind them. One chunk is handed over behind
// that event's raw handle; the generation side's blocks must hold the
// memset bytes. kvxfer borrows the event: the test still owns it, queries
// it and destroys it after the request's events arrived.
//
// On the fake driver (TestFakeDriver) the stream's copies are truly
// asynchronous, so a chunk sent before the event completed would carry
// zeros; on a GPU the copy into pageable host memory returns once it
// landed, so there the test checks the real driver's handle and query path.
func TestChunkBehindCUDAEvent(t *testing.T) {
	d := gpu(t)
	const layout = `"layout":{"layers":2,"kv_heads":2,"head_dim":64,"dtype_bytes":2,"tokens_per_block":16}`
	open := func(instance string) *capi.Engine {
		e, _, err := capi.Open(fmt.Sprintf(`{"instance":%q,%s,"pool_bytes":4194304,"workers":2}`, instance, layout), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	ctxEng, genEng := open("cuev-prefill"), open("cuev-decode")
	defer func() {
		for _, e := range []*capi.Engine{genEng, ctxEng} {
			if err := e.Close(10 * time.Second); err != nil {
				t.Errorf("engine Close: %v", err)
			}
		}
	}()
	const promptLen, nblocks = 96, 6
	geo, err := ctxEng.Group(0)
	if err != nil {
		t.Fatal(err)
	}
	bb := geo.BlockBytes
	src, err := ctxEng.AllocBlocks(0, nblocks)
	if err != nil {
		t.Fatal(err)
	}
	rx, rh, err := genEng.Receive(capi.ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "cuev-1", PromptLen: promptLen, Context: "cuev-prefill"}})
	if err != nil {
		t.Fatal(err)
	}
	tx, th, err := ctxEng.Send(capi.SendRequest{SendRequest: kvxfer.SendRequest{ID: "cuev-1", PromptLen: promptLen}})
	if err != nil {
		t.Fatal(err)
	}

	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf, err := d.Alloc(nblocks * bb)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	pool := ctxEng.Inner().Region().Bytes()
	want := make([][]byte, nblocks)
	for i := range nblocks {
		v := byte(0x21 + 17*i)
		want[i] = bytes.Repeat([]byte{v}, int(bb))
		if err := s.MemsetD8(buf.Ptr()+cuda.DevicePtr(uint64(i)*bb), v, bb); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range src { // device buffer → the context engine's source blocks
		off := geo.Offset + uint64(id)*bb
		if err := s.CopyDtoH(pool[off:off+bb], buf.Ptr()+cuda.DevicePtr(uint64(i)*bb)); err != nil {
			t.Fatal(err)
		}
	}
	ev, err := d.NewEvent() // the framework's event: kvxfer only borrows it
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ev.Close(); err != nil {
			t.Errorf("the owner's event Close: %v", err)
		}
	}()
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.ChunkCUDA(0, promptLen, true, []kvcache.BlockRun{{First: 0, IDs: src}}, uint64(ev.Handle()), d.Ordinal()); err != nil {
		t.Fatalf("ChunkCUDA: %v (%v)", err, capi.Code(err))
	}
	wait := func(e *capi.Engine, h uint64) capi.Event {
		evs := make([]capi.Event, 4)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			for _, got := range evs[:e.Poll(evs, 100*time.Millisecond)] {
				if got.Request == h {
					return got
				}
			}
		}
		t.Fatalf("no event for request %d in 30 s", h)
		return capi.Event{}
	}
	if got := wait(ctxEng, th); got.Outcome != capi.OutcomeDone {
		msg, _ := tx.ErrorMessage()
		t.Fatalf("context side: outcome %d, %v: %s", got.Outcome, got.Error, msg)
	}
	if got := wait(genEng, rh); got.Outcome != capi.OutcomeReady {
		msg, _ := rx.ErrorMessage()
		t.Fatalf("generation side: outcome %d, %v: %s", got.Outcome, got.Error, msg)
	}
	ids, first, err := rx.Blocks(0)
	if err != nil || first != 0 || len(ids) != nblocks {
		t.Fatalf("destination blocks %v (first %d): %v", ids, first, err)
	}
	dgeo, err := genEng.Group(0)
	if err != nil {
		t.Fatal(err)
	}
	dpool := genEng.Inner().Region().Bytes()
	for i, id := range ids {
		off := dgeo.Offset + uint64(id)*dgeo.BlockBytes
		if !bytes.Equal(dpool[off:off+bb], want[i]) {
			t.Fatalf("block %d (destination %d) is not the memset's bytes %#x (first byte %#x)", i, id, want[i][0], dpool[off])
		}
	}
	if ok, err := ev.Query(); !ok || err != nil { // still alive: kvxfer did not destroy it
		t.Fatalf("the owner's event after the transfer: %v, %v", ok, err)
	}
	t.Logf("chunk behind a borrowed CUDA event: %d blocks of %d bytes, bytes verified", nblocks, bb)
	if err := rx.FreeBlocks(); err != nil {
		t.Error(err)
	}
	if err := ctxEng.FreeBlocks(0, src); err != nil {
		t.Error(err)
	}
	for _, r := range []*capi.Request{tx, rx} {
		if err := r.Release(); err != nil {
			t.Error(err)
		}
	}
}
