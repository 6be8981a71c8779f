package capi

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Tiny layout of tinyLayout: 2 layers, 2 KV heads, head_dim 4, bf16, 16
// tokens per block.
const (
	memLayers, memHeads, memDim, memTPB, memElem = 2, 2, 4, 16, 2
	memBlocks                                    = 8
	memBlock                                     = memTPB * memHeads * memDim * memElem // one block of one part
	memTensor                                    = 2 * memBlocks * memBlock             // [2, blocks, ...]
)

// hostBuf is framework memory for memoryJSON: on the heap (a Go slice
// that does not escape may live on the goroutine's stack, which moves; its
// address must not be handed out as an integer).
func hostBuf(t *testing.T) []byte {
	t.Helper()
	r, err := kvcache.NewHostRegion(64 + memLayers*(memTensor+128))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r.Bytes()
}

// memoryJSON lays out per-layer tensors inside buf (with a gap between
// them) and returns the "memory" object for kind, addresses and all.
func memoryJSON(buf []byte, kind string, strides string) string {
	base := uint64(uintptr(unsafe.Pointer(&buf[0])))
	var addrs []string
	for i := range memLayers {
		addrs = append(addrs, fmt.Sprint(base+64+uint64(i)*(memTensor+128)))
	}
	js := fmt.Sprintf(`{"kind":%q,"num_blocks":%d,"layers":[%s]`, kind, memBlocks, strings.Join(addrs, ","))
	if strides != "" {
		js += `,"strides":` + strides
	}
	return js + "}"
}

// elemAt is the offset in buf of (layer, part, block, token, head, byte) for
// the tensors memoryJSON laid out as NHD or HND.
func elemAt(kind string, layer, part, block, tok, head, b int) int {
	off := 64 + layer*(memTensor+128) + part*memBlocks*memBlock + block*memBlock
	if kind == "hnd" {
		return off + (head*memTPB+tok)*memDim*memElem + b
	}
	return off + (tok*memHeads+head)*memDim*memElem + b
}

// TestMemoryDescriptorsFromJSON: an NHD engine (strides given, as PyTorch
// would) sends into an HND engine, both described by addresses in the JSON
// config; every byte of the framework's destination blocks is the source's.
func TestMemoryDescriptorsFromJSON(t *testing.T) {
	base := HandleCount()
	srcBuf, dstBuf := hostBuf(t), hostBuf(t)
	open := func(inst string, mem string) *Engine {
		e, _, err := Open(fmt.Sprintf(`{"instance":%q,%s,"workers":2,"memory":%s}`, inst, tinyLayout, mem), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	p := open("capi-mem-p", memoryJSON(srcBuf, "nhd", nhdStrides()))
	d := open("capi-mem-d", memoryJSON(dstBuf, "hnd", ""))
	moveIntoFramework(t, p, d, srcBuf, dstBuf, "m", "capi-mem-p")
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// nhdStrides are the byte strides of PyTorch's NHD tensors of the test's
// memory, as a "memory" object's "strides".
func nhdStrides() string {
	return fmt.Sprintf(`{"block":%d,"token":%d,"head":%d,"elem":%d,"kv":%d}`,
		memBlock, memHeads*memDim*memElem, memDim*memElem, memElem, memBlocks*memBlock)
}

// moveIntoFramework moves request id of 32 tokens from p (NHD tensors in
// srcBuf; its instance is ctxName) into the framework's blocks 7 and 3 of
// d (HND tensors in dstBuf), checks that READY names them and that every
// byte landed where d's layout holds it, then releases the request and
// closes both engines.
func moveIntoFramework(t *testing.T, p, d *Engine, srcBuf, dstBuf []byte, id, ctxName string) {
	t.Helper()
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	pattern := func(layer, part, blk, tok, head, b int) byte {
		return byte(layer*61 + part*29 + blk*17 + tok*7 + head*3 + b + 1)
	}
	each := func(f func(layer, part, blk, tok, head, b int)) {
		for blk := range 2 {
			for layer := range memLayers {
				for part := range 2 {
					for tok := range memTPB {
						for head := range memHeads {
							for b := range memDim * memElem {
								f(layer, part, blk, tok, head, b)
							}
						}
					}
				}
			}
		}
	}
	each(func(layer, part, blk, tok, head, b int) {
		srcBuf[elemAt("nhd", layer, part, int(src[blk]), tok, head, b)] = pattern(layer, part, blk, tok, head, b)
	})
	owned := []kvcache.BlockID{7, 3}
	rx, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: ctxName,
		Blocks: [][]kvcache.BlockID{owned}}})
	if err != nil {
		t.Fatal(err)
	}
	tx, th, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Chunk(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, false); err != nil {
		t.Fatal(err)
	}
	if ev := waitFor(t, p, th); ev.Outcome != OutcomeDone || ev.Error != OK {
		t.Fatalf("tx %+v", ev)
	}
	if ev := waitFor(t, d, rh); ev.Outcome != OutcomeReady {
		t.Fatalf("rx %+v", ev)
	}
	ids, _, err := rx.Blocks(0)
	if err != nil || fmt.Sprint(ids) != fmt.Sprint(owned) {
		t.Fatalf("READY blocks %v (%v), want the framework's %v", ids, err, owned)
	}
	n := 0
	each(func(layer, part, blk, tok, head, b int) {
		got, want := dstBuf[elemAt("hnd", layer, part, int(owned[blk]), tok, head, b)], pattern(layer, part, blk, tok, head, b)
		if got != want {
			t.Fatalf("block %d layer %d part %d token %d head %d byte %d: %#x, want %#x", owned[blk], layer, part, tok, head, b, got, want)
		}
		n++
	})
	if n != 2*memLayers*2*memBlock {
		t.Fatalf("verified %d bytes", n)
	}
	if err := p.FreeBlocks(0, src); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Request{tx, rx} {
		if err := r.Release(); err != nil {
			t.Fatal(err)
		}
	}
	closeBoth(t, p, d)
}

// TestMemoryConfigErrors: a bad "memory" object is refused naming the
// value.
func TestMemoryConfigErrors(t *testing.T) {
	buf := hostBuf(t)
	good := memoryJSON(buf, "nhd", "")
	for _, c := range []struct{ mem, needle string }{
		{strings.Replace(good, `"nhd"`, `"nchw"`, 1), `memory.kind = "nchw"`},
		{strings.Replace(good, `"num_blocks":8`, `"num_blocks":0`, 1), "memory.num_blocks = 0"},
		{fmt.Sprintf(`{"kind":"nhd","num_blocks":8,"layers":[%d]}`, uintptr(unsafe.Pointer(&buf[0]))), "1 addresses, rank"},
		{`{"kind":"nhd","num_blocks":8,"layers":[0,4096]}`, "NULL"},
		{strings.Replace(good, `"layers"`, `"v_layers":[1,2],"layers"`, 1), "v_layers has 2"},
		{memoryJSON(buf, "nhd", `{"block":8,"token":64,"head":8,"elem":2}`), "block stride 8"},
		{`{"kind":"nhd","num_blocks":8,"layers":[4096,140737488359424]}`, "span more than"},
		// float32 tensors under the bf16 layout: both sizes named.
		{strings.Replace(good, `"layers"`, `"dtype_bytes":4,"layers"`, 1), "memory.dtype_bytes = 4 (the tensors' element size), but the layout's dtype_bytes is 2"},
	} {
		_, _, err := Open(fmt.Sprintf(`{"instance":"capi-mem-bad",%s,"memory":%s}`, tinyLayout, c.mem), nil, 0)
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), c.needle) {
			t.Errorf("memory %s: %v, want a config error naming %q", c.mem, err, c.needle)
		}
	}
	if _, _, err := Open(fmt.Sprintf(`{"instance":"capi-mem-bad",%s,"memory":%s}`, tinyLayout, good), unsafe.Pointer(&buf[0]), 64); Code(err) != ErrConfig {
		t.Errorf("memory and a pool: %v", err)
	}
}

// TestMemoryStageSplitNamed: a pipeline stage's tensors of another count
// than kvxfer's split gives the stage (the framework split the model's
// layers otherwise: vLLM's default for an uneven count, 30 layers over PP
// 4 as [7 8 8 7], is not kvxfer's [8 8 7 7]) are refused naming the
// stage's layers, the split and the pp_stages that says vLLM's; with
// pp_stages the same tensors open.
func TestMemoryStageSplitNamed(t *testing.T) {
	r, err := kvcache.NewHostRegion(7 * 4096) // 7 layers of 8 blocks: K and V of 16 tokens × 2 heads × 4 × 2 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	layout := `"layout":{"layers":30,"kv_heads":2,"head_dim":4,"dtype_bytes":2,"tokens_per_block":16}`
	var addrs []string
	for i := range 7 {
		addrs = append(addrs, fmt.Sprint(uintptr(unsafe.Pointer(&r.Bytes()[i*4096]))))
	}
	seven := strings.Join(addrs, ",")
	_, _, err = Open(fmt.Sprintf(`{"instance":"capi-mem-pp",%s,"pp":4,"rank_pp":0,"memory":{"kind":"nhd","num_blocks":8,"layers":[%s]}}`, layout, seven), nil, 0)
	for _, needle := range []string{"memory.layers has 7 addresses, rank tp0/pp0 holds 8 layers", "layers 0 to 7 of the model's 30",
		"as [8 8 7 7]", `says its split in pp_stages (vLLM's default here: "7,8,8,7")`} {
		if Code(err) != ErrConfig || err == nil || !strings.Contains(err.Error(), needle) {
			t.Errorf("7 tensors on stage 0 of 4 over 30 layers: %v, want a config error naming %q", err, needle)
		}
	}
	// With vLLM's split said, the same tensors open stage 0.
	e, _, err := Open(fmt.Sprintf(`{"instance":"capi-mem-pp",%s,"pp":4,"pp_stages":"7,8,8,7","rank_pp":0,"memory":{"kind":"nhd","num_blocks":8,"layers":[%s]}}`, layout, seven), nil, 0)
	if err != nil {
		t.Fatalf("stage 0 of vLLM's split: %v", err)
	}
	if got := e.shape; got.LayerLo != 0 || got.LayerHi != 7 {
		t.Errorf("stage 0 holds layers [%d, %d), want [0, 7)", got.LayerLo, got.LayerHi)
	}
	if err := e.Close(5 * time.Second); err != nil {
		t.Error(err)
	}
}

// TestLowHostAddressesRefused: host memory at an address below the first
// page (a small integer where an address belongs) is refused naming it,
// ErrInvalidArgument, before it becomes a pointer: tensors by address and
// a node's pool_address (kvxfer_engine_open's pool argument is checked the
// same way in cmd/libkvxfer, test/c). (Checked to fail: the engine opened
// over the tensors at 0x10, and the node went on to its backend's
// refusal; held as an unsafe.Pointer such an address aborts the process
// at a stack move.)
func TestLowHostAddressesRefused(t *testing.T) {
	if _, _, err := Open(fmt.Sprintf(`{"instance":"capi-mem-low",%s,"memory":{"kind":"nhd","num_blocks":8,"layers":[16,65552]}}`,
		tinyLayout), nil, 0); Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "= 0x10: not an address of host memory") {
		t.Errorf("tensors at 0x10: %v, want ErrInvalidArgument naming the address", err)
	}
	js := fmt.Sprintf(`{"instance":"capi-pool-low",%s,"insecure":true,"bind":"ipc://%s","pool_bytes":4096,"pool_address":16}`,
		tinyLayout, filepath.Join(t.TempDir(), "low.sock"))
	if _, _, err := OpenNode(js); Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "pool_address = 0x10: not an address of host memory") {
		t.Errorf("pool_address 16: %v, want ErrInvalidArgument naming it", err)
	}
	for _, c := range []struct {
		a  uint64
		ok bool
	}{{0, true}, {1, false}, {4095, false}, {4096, true}, {1 << 46, true}} {
		if err := HostAddress("pool", c.a); (err == nil) != c.ok {
			t.Errorf("HostAddress(%#x) = %v, want ok %v", c.a, err, c.ok)
		}
	}
}

// TestMemoryLayersOfInterleavedGroups: memory.layers lists the rank's
// layers in ascending layer order (kvxfer.h), also when its layer groups
// interleave (a sliding-window group of the even layers and a full one of
// the odd, as GPT-OSS and Gemma 3 have them): each group's descriptor
// places each of its layers at that layer's address, not at the next
// address in the list.
func TestMemoryLayersOfInterleavedGroups(t *testing.T) {
	const layers, tensor = 4, memTensor // [2, blocks, 16 tokens, 2 heads, 4] per layer
	r, err := kvcache.NewHostRegion(layers * tensor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	base := uint64(uintptr(unsafe.Pointer(&r.Bytes()[0])))
	var addrs []string
	for L := range layers {
		addrs = append(addrs, fmt.Sprint(base+uint64(L)*tensor))
	}
	layout := fmt.Sprintf(`"layout":{"layers":%d,"kv_heads":2,"head_dim":4,"dtype_bytes":2,"tokens_per_block":16,`+
		`"groups":[{"name":"swa","layers":[0,2],"window":32},{"name":"full","layers":[1,3]}]}`, layers)
	c, err := ParseConfig(fmt.Sprintf(`{"instance":"mem-groups",%s,"workers":2,"memory":{"kind":"nhd","num_blocks":%d,"layers":[%s]}}`,
		layout, memBlocks, strings.Join(addrs, ",")))
	if err != nil {
		t.Fatal(err)
	}
	kc, err := c.engineConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Memory.describe(&kc); err != nil {
		t.Fatal(err)
	}
	for g, d := range kc.Memory {
		for i, L := range d.Layers {
			if got, want := d.Base[i][0], uint64(L)*tensor; got != want {
				t.Errorf("group %d layer %d: K tensor at offset %d (layer %d's address), want %d (its own)", g, L, got, got/tensor, want)
			}
		}
	}
}
