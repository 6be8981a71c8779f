package capi

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
)

// partsLayers is the layer count of partsLayout: one layer group holding
// every layer, so that layer L of a block is the L-th quarter of its bytes
// (a block is ordered layer, part, head, token, dim).
const (
	partsLayers = 4
	partsLayout = `"layout":{"layers":4,"kv_heads":2,"head_dim":4,"dtype_bytes":2,"tokens_per_block":16}`
)

func openParts(t *testing.T, instance string) *Engine {
	t.Helper()
	e, _, err := Open(fmt.Sprintf(`{"instance":%q,%s,"pool_bytes":65536,"workers":2}`, instance, partsLayout), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// partsRequest is request id between a prefill engine (instance
// capi-<id>-p) and a decode engine (capi-<id>-d), both opened on the parts
// layout, with blocks source blocks allocated on the prefill side.
type partsRequest struct {
	p, d   *Engine
	src    []kvcache.BlockID
	tx, rx *Request
	th, rh uint64
}

func openPartsRequest(t *testing.T, id string, prompt, blocks int) partsRequest {
	t.Helper()
	r := partsRequest{p: openParts(t, "capi-"+id+"-p"), d: openParts(t, "capi-"+id+"-d")}
	var err error
	if r.src, err = r.p.AllocBlocks(0, blocks); err != nil {
		t.Fatal(err)
	}
	if r.rx, r.rh, err = r.d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: prompt, Context: "capi-" + id + "-p"}}); err != nil {
		t.Fatal(err)
	}
	if r.tx, r.th, err = r.p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: prompt}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func partPattern(req, blk, layer, i int) byte { return byte(req*53 + blk*31 + layer*17 + i*7 + 1) }

// fillLayers writes the pattern of layers [lo, hi) of global block blk
// into pool block id of e's only group.
func fillLayers(e *Engine, id kvcache.BlockID, blk, req, lo, hi int) {
	geom := e.Inner().Pools().Geometry(0)
	per := int(geom.BlockBytes) / partsLayers
	buf := e.Inner().Region().Bytes()[geom.Offset+uint64(id)*geom.BlockBytes:]
	for layer := lo; layer < hi; layer++ {
		for i := range per {
			buf[layer*per+i] = partPattern(req, blk, layer, i)
		}
	}
}

// verifyLayers checks every byte of every layer of a READY request's
// destination blocks and returns how many it checked.
func verifyLayers(t *testing.T, d *Engine, rx *Request, req int) int {
	t.Helper()
	ids, first, err := rx.Blocks(0)
	if err != nil {
		t.Fatal(err)
	}
	geom := d.Inner().Pools().Geometry(0)
	per := int(geom.BlockBytes) / partsLayers
	n := 0
	for k, id := range ids {
		buf := d.Inner().Region().Bytes()[geom.Offset+uint64(id)*geom.BlockBytes:]
		for layer := range partsLayers {
			for i := range per {
				if got, want := buf[layer*per+i], partPattern(req, first+k, layer, i); got != want {
					t.Fatalf("req %d block %d layer %d byte %d: got %d, want %d", req, first+k, layer, i, got, want)
				}
				n++
			}
		}
	}
	return n
}

// TestChunkLayersTransfer: chunks handed in layer parts through ChunkLayers
// (uneven parts, one chunk whole through the zero part), each part handed
// before its layers are written and fenced once they are; the request
// completes on both sides with exactly the prompt's bytes (a part that
// carried layers of another part, or every layer, would move more), and
// every byte of every layer at the receiver is the sender's.
func TestChunkLayersTransfer(t *testing.T) {
	base := HandleCount()
	const prompt, req = 100, 3
	chunks, err := kvcache.Chunks(prompt, 32, 16)
	if err != nil {
		t.Fatal(err)
	}
	r := openPartsRequest(t, "lp", prompt, 7)
	p, src, tx := r.p, r.src, r.tx
	split := []kvcache.LayerPart{{Lo: 0, Hi: 1, Of: 4}, {Lo: 1, Hi: 3, Of: 4}, {Lo: 3, Hi: 4, Of: 4}}
	for ci, c := range chunks {
		parts := split
		if ci == 2 {
			parts = []kvcache.LayerPart{{}} // the zero part: the whole chunk
		}
		runs := c.Runs(16, [][]kvcache.BlockID{src})
		b0, b1 := c.Blocks(16)
		for _, part := range parts {
			f, err := tx.ChunkLayers(c.Start, c.End, c.Last, part, runs, true)
			if err != nil {
				t.Fatalf("%v %+v: %v", c, part, err)
			}
			lo, hi := part.Lo, part.Hi
			if part.Of == 0 {
				lo, hi = 0, partsLayers
			}
			for b := b0; b < b1; b++ {
				fillLayers(p, src[b], b, req, lo, hi)
			}
			if err := FenceReady(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.landed(t, req, 7*p.Info().BytesPerToken*16)
	r.release(t, base)
}

// TestChunkLayersRefused: bad layers (negative, empty, past the model,
// another model's count) and parts out of order are refused with
// ErrBadChunk naming the layers, through both ChunkLayers and
// ChunkLayersCUDA (before any CUDA driver is needed), with no fence handle
// made; the request goes on, and the right parts then complete it with
// every byte.
func TestChunkLayersRefused(t *testing.T) {
	base := HandleCount()
	const prompt, req = 64, 5
	r := openPartsRequest(t, "lpr", prompt, 4)
	p, src, tx := r.p, r.src, r.tx
	for b, id := range src { // written before the chunks: no fences needed
		fillLayers(p, id, b, req, 0, partsLayers)
	}
	r0 := []kvcache.BlockRun{{First: 0, IDs: src[:2]}}
	r1 := []kvcache.BlockRun{{First: 2, IDs: src[2:]}}
	handles := HandleCount()
	refuse := func(start, end int, part kvcache.LayerPart, runs []kvcache.BlockRun, want string) {
		t.Helper()
		f, err := tx.ChunkLayers(start, end, end == prompt, part, runs, true)
		if Code(err) != ErrBadChunk || !strings.Contains(err.Error(), want) {
			t.Fatalf("ChunkLayers [%d,%d) %+v = %v (%v), want BAD_CHUNK naming %q", start, end, part, err, Code(err), want)
		}
		if f != 0 || HandleCount() != handles {
			t.Fatalf("refused part made fence %d (%d handles, want %d)", f, HandleCount(), handles)
		}
	}
	for _, c := range []struct {
		part kvcache.LayerPart
		want string
	}{
		{kvcache.LayerPart{Lo: -1, Hi: 2, Of: 4}, "layers [-1, 2) of 4"},
		{kvcache.LayerPart{Lo: 2, Hi: 2, Of: 4}, "layers [2, 2) of 4"},
		{kvcache.LayerPart{Lo: 3, Hi: 1, Of: 4}, "layers [3, 1) of 4"},
		{kvcache.LayerPart{Lo: 0, Hi: 5, Of: 4}, "layers [0, 5) of 4"},
		{kvcache.LayerPart{Lo: 0, Hi: 2, Of: 8}, "layers [0, 2) of 8: want 0 ≤ Lo < Hi ≤ Of = 4"},
		{kvcache.LayerPart{Lo: 0, Hi: 2, Of: 0}, "layers [0, 2) of 0"},
		{kvcache.LayerPart{Lo: 0, Hi: 0, Of: -4}, "layers [0, 0) of -4"},
	} {
		refuse(0, 32, c.part, r0, c.want)
		err := tx.ChunkLayersCUDA(0, 32, false, c.part, r0, 0x1000, 0)
		if Code(err) != ErrBadChunk || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("ChunkLayersCUDA %+v = %v (%v), want BAD_CHUNK naming %q before the driver", c.part, err, Code(err), c.want)
		}
	}
	refuse(0, 32, kvcache.LayerPart{Lo: 1, Hi: 2, Of: 4}, r0, "the first part of a chunk starts at layer 0")
	f, err := tx.ChunkLayers(0, 32, false, kvcache.LayerPart{Lo: 0, Hi: 2, Of: 4}, r0, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := FenceReady(f); err != nil {
		t.Fatal(err)
	}
	handles = HandleCount()
	refuse(0, 32, kvcache.LayerPart{Lo: 3, Hi: 4, Of: 4}, r0, "layers [3, 4) of 4: the next part of the chunk starts at layer 2")
	refuse(32, 64, kvcache.LayerPart{Lo: 0, Hi: 4, Of: 4}, r1, "layers [2, 4) of chunk [0, 32) block 0 layers [0, 2) of 4 are not handed yet")
	refuse(32, 64, kvcache.LayerPart{}, r1, "are not handed yet")
	refuse(0, 32, kvcache.LayerPart{Lo: 2, Hi: 4, Of: 4}, []kvcache.BlockRun{{First: 0, IDs: src[2:]}},
		"source blocks differ from the chunk's first part")
	for _, c := range []struct {
		start, end int
		part       kvcache.LayerPart
		runs       []kvcache.BlockRun
	}{
		{0, 32, kvcache.LayerPart{Lo: 2, Hi: 4, Of: 4}, r0},
		{32, 64, kvcache.LayerPart{Lo: 0, Hi: 1, Of: 4}, r1},
		{32, 64, kvcache.LayerPart{Lo: 1, Hi: 4, Of: 4}, r1},
	} {
		if _, err := tx.ChunkLayers(c.start, c.end, c.end == prompt, c.part, c.runs, false); err != nil {
			t.Fatalf("[%d,%d) %+v after the refused ones: %v", c.start, c.end, c.part, err)
		}
	}
	refuse(32, 64, kvcache.LayerPart{Lo: 0, Hi: 4, Of: 4}, r1, "after the last chunk")
	r.landed(t, req, 4*p.Info().BytesPerToken*16)
	r.release(t, base)
}

// TestChunkLayersCUDA (on the fake driver, in a child process): every
// part of every chunk behind its own CUDA event, recorded after the part's
// layers are written; the request completes with every byte.
func TestChunkLayersCUDA(t *testing.T) {
	if !onFakeDriver(t, "TestChunkLayersCUDA") {
		return
	}
	base := HandleCount()
	dev, s := fakeStream(t)
	const prompt, req = 64, 7
	r := openPartsRequest(t, "lpc", prompt, 4)
	p, src, tx := r.p, r.src, r.tx
	var events []*cuda.Event // borrowed by kvxfer until the request's event
	for _, c := range []kvcache.Chunk{{Start: 0, End: 32}, {Start: 32, End: 64, FirstBlock: 2, Last: true}} {
		b0, b1 := c.Blocks(16)
		for layer := range partsLayers {
			for b := b0; b < b1; b++ {
				fillLayers(p, src[b], b, req, layer, layer+1)
			}
			ev, err := dev.NewEvent()
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, ev)
			if err := s.Record(ev); err != nil {
				t.Fatal(err)
			}
			part := kvcache.LayerPart{Lo: layer, Hi: layer + 1, Of: partsLayers}
			if err := tx.ChunkLayersCUDA(c.Start, c.End, c.Last, part, c.Runs(16, [][]kvcache.BlockID{src}), uint64(ev.Handle()), 0); err != nil {
				t.Fatalf("%v %+v: %v", c, part, err)
			}
		}
	}
	want := 4 * p.Info().BytesPerToken * 16
	r.landed(t, req, want)
	for _, ev := range events {
		if err := ev.Close(); err != nil {
			t.Fatal(err)
		}
	}
	r.release(t, base)
	fmt.Println("CHILD-OK:", want, "bytes verified")
}

// landed waits for both sides' events of the request, a transfer of want
// bytes, and checks every byte of every layer (pattern req) at the
// receiver.
func (r partsRequest) landed(t *testing.T, req int, want uint64) {
	t.Helper()
	p, d, rx := r.p, r.d, r.rx
	if ev := waitFor(t, p, r.th); ev.Outcome != OutcomeDone || ev.Error != OK || ev.Bytes != want {
		t.Fatalf("tx %+v, want DONE of %d bytes", ev, want)
	}
	if ev := waitFor(t, d, r.rh); ev.Outcome != OutcomeReady || ev.Bytes != want {
		t.Fatalf("rx %+v, want READY of %d bytes", ev, want)
	}
	if n := verifyLayers(t, d, rx, req); n != int(want) {
		t.Fatalf("verified %d bytes, want %d", n, want)
	}
}

// release frees both sides' blocks, closes both engines and wants the
// handle table back at base.
func (r partsRequest) release(t *testing.T, base int) {
	t.Helper()
	if err := r.rx.FreeBlocks(); err != nil {
		t.Fatal(err)
	}
	if err := r.p.FreeBlocks(0, r.src); err != nil {
		t.Fatal(err)
	}
	closeBoth(t, r.p, r.d)
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}
