package gpu_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// TestDemo is the demo on a GPU: a context engine and a generation engine,
// each with its block pool in device memory and a cudaipc agent, move one
// 1,000-token request. Prefill is simulated by host-to-device copies of a
// known pattern into each chunk's blocks on a stream; each chunk's fence is
// a CUDA event recorded behind them, watched by the poller. The
// generation side's blocks are then read back and compared byte for byte.
func TestDemo(t *testing.T) {
	d := gpu(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	layout := kvcache.Layout{Name: "gpu-demo", Layers: 4, KVHeads: 8, HeadDim: 128, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(4)}
	const promptLen, chunkTokens, poolBytes = 1000, 256, 64 << 20

	// Memory first, agents and engines after: cleanups run in reverse.
	regions := make([]*kvcache.Region, 2)
	for i := range regions {
		r, m, err := d.NewRegion(poolBytes)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Close(); err != nil {
				t.Errorf("free pool memory: %v", err)
			}
		})
		regions[i] = r
	}
	link := control.NewMemLink()
	start := func(instance string, r *kvcache.Region) *kvxfer.Engine {
		a, err := cudaipc.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := a.Close(); err != nil {
				t.Errorf("agent Close: %v", err)
			}
		})
		e, err := kvxfer.Start(ctx, kvxfer.Config{Instance: instance, Layout: &layout, Region: r, Agent: a, Link: link,
			Workers: 2, TransferTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := e.Close(context.Background()); err != nil {
				t.Errorf("engine %s Close: %v", instance, err)
			}
		})
		return e
	}
	prefill, decode := start("prefill", regions[0]), start("decode", regions[1])
	geo := prefill.Pools().Geometry(0)
	blockBytes := geo.BlockBytes

	rx, err := decode.Receive(ctx, kvxfer.ReceiveRequest{ID: "gpu-1", PromptLen: promptLen, Context: "prefill"})
	if err != nil {
		t.Fatal(err)
	}
	nblocks := layout.BlocksFor(promptLen)
	src, err := prefill.Pools().Alloc([]int{nblocks})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := prefill.Send(context.Background(), kvxfer.SendRequest{ID: "gpu-1", PromptLen: promptLen})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	blockAddr := func(r *kvcache.Region, g kvcache.PoolGeometry, id kvcache.BlockID) cuda.DevicePtr {
		return cuda.DevicePtr(r.Base) + cuda.DevicePtr(g.Offset+uint64(id)*g.BlockBytes)
	}
	want := make([][]byte, nblocks) // the host buffers stay alive until their fences fired
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, layout.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for _, c := range chunks {
		b0, b1 := c.Blocks(layout.TokensPerBlock)
		for i := b0; i < b1; i++ { // "prefill" writes the chunk's blocks
			want[i] = blockPattern(int(blockBytes), i)
			if err := s.CopyHtoD(blockAddr(regions[0], geo, src[0][i]), want[i]); err != nil {
				t.Fatal(err)
			}
		}
		fence, err := s.Fence(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Chunk(c, []kvcache.BlockRun{{First: b0, IDs: src[0][b0:b1]}}, fence); err != nil {
			t.Fatalf("chunk %+v: %v", c, err)
		}
	}
	var out kvxfer.Outcome
	select {
	case out = <-rx.Done():
	case <-ctx.Done():
		t.Fatal("no outcome on the generation side")
	}
	elapsed := time.Since(began)
	if !out.OK {
		t.Fatalf("generation side: %s: %v", out.Status, out.Err)
	}
	if len(out.Blocks) != 1 || len(out.Blocks[0]) != nblocks {
		t.Fatalf("generation side got blocks %v, want %d in group 0", out.Blocks, nblocks)
	}
	dgeo := decode.Pools().Geometry(0)
	got := make([]byte, blockBytes)
	for i, id := range out.Blocks[0] {
		if err := d.CopyDtoH(got, blockAddr(regions[1], dgeo, id)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Fatalf("block %d (destination block %d) differs from what prefill wrote", i, id)
		}
	}
	t.Logf("demo: %d tokens, %d blocks of %d KiB (%d MiB) from device pool to device pool in %d chunks with event fences: %s, %v, bytes verified",
		promptLen, nblocks, blockBytes>>10, out.Bytes>>20, len(chunks), out.Status, elapsed.Round(time.Microsecond))
	if err := decode.FreeBlocks(out.Blocks); err != nil {
		t.Error(err)
	}
	select {
	case done := <-tx.Done():
		if !done.OK {
			t.Errorf("context side: %s: %v", done.Status, done.Err)
		}
	case <-ctx.Done():
		t.Fatal("no outcome on the context side")
	}
	if err := prefill.Pools().Free(src); err != nil {
		t.Error(err)
	}
}

// blockPattern is block i's bytes.
func blockPattern(n, i int) []byte {
	b := make([]byte, n)
	seed := fmt.Sprintf("block-%d-", i)
	for k := range b {
		b[k] = seed[k%len(seed)] ^ byte(k>>8)
	}
	return b
}
