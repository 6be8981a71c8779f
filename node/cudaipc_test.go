package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/cudatest"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

// The node's cudaipc tests need a CUDA driver with a device. TestFakeCUDA
// runs them (every test named TestCUDAIPC…) in a child process on the
// fake driver of cuda/cudatest, with two devices; on a GPU machine
// KVXFER_LIBCUDA=libcuda.so.1 runs them on the real driver. Without a
// driver they skip, saying why.

// fakeDevices is how many devices the fake driver reports here.
const fakeDevices = 2

// TestFakeCUDA runs the cudaipc tests against the fake driver, so that
// they run on machines without a GPU: two nodes in two processes move
// requests GPU to GPU, and every refusal that needs a driver.
func TestFakeCUDA(t *testing.T) {
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		t.Skipf("the driver under test is chosen already ($%s=%s)", cuda.LibraryEnv, p)
	}
	out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, "^TestCUDAIPC", "FAKECUDA_COPY_DELAY_US=20",
		fmt.Sprintf("FAKECUDA_DEVICES=%d", fakeDevices))
	if err != nil {
		t.Fatalf("cudaipc tests on the fake driver: %v\n%s", err, out)
	}
	for l := range strings.Lines(out) {
		switch l := strings.TrimSpace(l); {
		case strings.HasPrefix(l, "--- SKIP"):
			t.Errorf("a cudaipc test skipped on the fake driver: %s", l)
		case strings.HasPrefix(l, "--- PASS"):
			t.Log(l)
		}
	}
	for _, name := range []string{"TestCUDAIPCTwoProcesses", "TestCUDAIPCPerLayerTensors", "TestCUDAIPCPeerOnAnotherHost", "TestCUDAIPCRefusals", "TestCUDAIPCConnectGonePeer", "TestCUDAIPCNotAuto",
		"TestCUDAIPCPeerNamesAnotherAgent", "TestCUDAIPCHelloOfAnotherPeer"} {
		if !strings.Contains(out, "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass on the fake driver:\n%s", name, out)
		}
	}
}

// TestFakeCUDANoDevice: on a host whose driver reports no device
// (FAKECUDA_DEVICES=0: cuInit fails), and on one without the driver
// library, Open on backend cudaipc fails with an error wrapping
// cuda.ErrNoDevice that names the backend and says what to use instead.
// (Checked to fail: with Open not checking the driver first, the error
// names cudaipc's own failure without the backend's name and the hint.)
func TestFakeCUDANoDevice(t *testing.T) {
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		t.Skipf("the driver under test is chosen already ($%s=%s)", cuda.LibraryEnv, p)
	}
	for _, env := range [][]string{{"FAKECUDA_DEVICES=0"}, {cuda.LibraryEnv + "=" + t.TempDir() + "/no-libcuda.so.1"}} {
		out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, "^TestChildNoCUDA$", append(env, noDeviceEnv+"=1")...)
		if err != nil || !strings.Contains(out, "--- PASS: TestChildNoCUDA") {
			t.Errorf("%s: %v\n%s", env, err, out)
		}
	}
}

// noDeviceEnv makes TestChildNoCUDA run.
const noDeviceEnv = "KVXFER_NODE_NO_CUDA"

// TestChildNoCUDA is TestFakeCUDANoDevice's child.
func TestChildNoCUDA(t *testing.T) {
	if os.Getenv(noDeviceEnv) == "" {
		t.Skip("runs only as TestFakeCUDANoDevice's child")
	}
	for _, sendOnly := range []bool{false, true} {
		_, gc := pair(t, cudaipc.Backend)
		gc.SendOnly = sendOnly
		n, err := node.Open(context.Background(), gc)
		if err == nil {
			n.Close(context.Background())
			t.Fatal("Open on backend cudaipc without a CUDA device succeeded")
		}
		if !errors.Is(err, cuda.ErrNoDevice) {
			t.Fatalf("Open without a CUDA device: %v, want cuda.ErrNoDevice", err)
		}
		for _, want := range []string{`backend = "cudaipc"`, `use backend "shm"`, "ucx"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open without a CUDA device: %q does not say %q", err, want)
			}
		}
		t.Logf("send_only %v: %v", sendOnly, err)
	}
}

// requireCUDA skips t unless the driver under test has a device.
func requireCUDA(t *testing.T) *cuda.Device {
	t.Helper()
	d, err := cuda.OpenDevice(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("needs a CUDA device (TestFakeCUDA runs this on the fake driver): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("device Close: %v", err)
		}
	})
	return d
}

// genChildEnv carries the generation child's JSON config (Layout is
// tiny()); callerEnv makes it give the node device memory it allocated
// itself (CallerMemory) instead of letting it allocate its pool.
const (
	genChildEnv = "KVXFER_NODE_CUDA_GEN"
	callerEnv   = "KVXFER_NODE_CUDA_CALLER"
	// layersEnv makes the caller memory vLLM's shape: one allocation per
	// layer (fourLayers()), NHD, unmapped gaps between them.
	layersEnv = "KVXFER_NODE_CUDA_LAYERS"
)

// fourLayers is tiny() with 4 layers.
func fourLayers() *kvcache.Layout {
	l := tiny()
	l.Name, l.Layers, l.Groups = "four", 4, kvcache.FullAttention(4)
	return l
}

// layerBlocks is how many blocks each per-layer tensor holds.
const layerBlocks = 16

// perLayer is a framework's KV cache as vLLM allocates it: one NHD tensor
// [2, blocks, tokens, heads, head_dim] per layer, each its own
// allocation, with an allocation made and freed after each (an unmapped
// gap between them where the driver allocates in order, as the fake
// does).
type perLayer struct {
	mems   []*cuda.Memory // by layer
	offs   []uint64       // each layer's tensor's offset in region
	region *kvcache.Region
	mem    *kvcache.KVMemory
}

// newPerLayer allocates the tensors of layout l (one group of full
// attention, TP 1) on d, freed at cleanup.
func newPerLayer(t *testing.T, d *cuda.Device, l *kvcache.Layout) *perLayer {
	t.Helper()
	kl, s, err := kvxfer.Config{Layout: l, Parallel: kvcache.Parallel{TP: 1, PP: 1}}.LayoutShape()
	if err != nil {
		t.Fatal(err)
	}
	size := uint64(kl.Parts()) * layerBlocks * uint64(kl.TokensPerBlock*s.Heads()*kl.TokenBytes())
	p := &perLayer{}
	for range s.Layers[0] {
		m, err := d.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // after the node's Close (cleanups run in reverse)
			if err := m.Free(); err != nil {
				t.Errorf("free the framework's memory: %v", err)
			}
		})
		p.mems = append(p.mems, m)
		gap, err := d.Alloc(8192)
		if err != nil {
			t.Fatal(err)
		}
		if err := gap.Free(); err != nil {
			t.Fatal(err)
		}
	}
	lo, hi := ^uintptr(0), uintptr(0)
	for _, m := range p.mems {
		lo, hi = min(lo, uintptr(m.Ptr())), max(hi, uintptr(m.Ptr())+uintptr(m.Len()))
	}
	if p.region, err = kvcache.ExternalDeviceRegion(lo, uint64(hi-lo), d.Ordinal()); err != nil {
		t.Fatal(err)
	}
	for _, m := range p.mems {
		p.offs = append(p.offs, uint64(uintptr(m.Ptr())-lo))
	}
	if p.mem, err = kvcache.FrameworkMemory("nhd", kl, s, 0, layerBlocks, p.offs, nil, p.region.Len); err != nil {
		t.Fatal(err)
	}
	return p
}

// verify copies each layer's tensor back to host memory and checks every
// byte of the request's blocks against what the context side wrote from
// its own pool (sendDevice: pattern by pool block byte, the group-pool
// layout of the node's own pool); it returns the bytes checked.
func (p *perLayer) verify(d *cuda.Device, l *kvcache.Layout, req string, blocks [][]kvcache.BlockID) (uint64, error) {
	kl, s, err := kvxfer.Config{Layout: l, Parallel: kvcache.Parallel{TP: 1, PP: 1}}.LayoutShape()
	if err != nil {
		return 0, err
	}
	e := uint64(kl.DTypeBytes)
	content := uint64(len(s.Layers[0])*kl.Parts()*s.Heads()*kl.TokensPerBlock) * uint64(kl.TokenBytes())
	src, err := kvcache.PoolMemory(kl, s, 0, kvcache.PoolGeometry{BlockBytes: content, Blocks: 1})
	if err != nil {
		return 0, err
	}
	dst := p.mem
	var n uint64
	for li, m := range p.mems {
		buf := make([]byte, m.Len())
		if err := d.CopyDtoH(buf, m.Ptr()); err != nil {
			return n, err
		}
		for b, id := range blocks[0] {
			for part := range kl.Parts() {
				for tok := range uint64(kl.TokensPerBlock) {
					for h := range uint64(s.Heads()) {
						for x := range uint64(kl.HeadDim) * e {
							so := src.Base[li][part] + tok*src.TokenStride + h*src.HeadStride + x
							do := dst.Base[li][part] + uint64(id)*dst.BlockStride + tok*dst.TokenStride + h*dst.HeadStride + x - p.offs[li]
							if want := pattern(req, 0, b, int(so)); buf[do] != want {
								return n, fmt.Errorf("layer %d part %d block %d (destination block %d) token %d head %d byte %d = %#x, want %#x",
									li, part, b, id, tok, h, x, buf[do], want)
							}
							n++
						}
					}
				}
			}
		}
	}
	return n, nil
}

// The generation child's protocol, one line each way:
//
//	child:  READY <pool base>
//	parent: RECV <id> <prompt len>   child: RECEIVING <id>
//	child:  VERIFIED <id> <bytes> | FAILED <id> <status>: <error> | MISMATCH <id> <what>
//
// On EOF the child closes its node (and frees the memory it allocated).

// TestChildGenCUDA is the generation side of the two-process tests: a
// node on backend cudaipc (its own device pool, or CallerMemory) that
// receives what the parent asks for and checks every byte by copying it
// back to host memory.
func TestChildGenCUDA(t *testing.T) {
	js := os.Getenv(genChildEnv)
	if js == "" {
		t.Skip("runs only as a child of the TestCUDAIPC tests")
	}
	requireCUDA(t)
	cfg, err := node.DecodeConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Layout = tiny()
	if os.Getenv(layersEnv) != "" {
		cfg.Layout = fourLayers()
	}
	d, err := cuda.OpenDevice(cfg.Device) // the node's GPU
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("device Close: %v", err)
		}
	})
	var layers *perLayer
	if os.Getenv(layersEnv) != "" { // vLLM's per-layer tensors
		layers = newPerLayer(t, d, cfg.Layout)
		cfg.CallerMemory = &node.CallerMemory{Region: layers.region, Memory: []*kvcache.KVMemory{layers.mem}}
		cfg.PoolBytes = 0
	} else if os.Getenv(callerEnv) != "" { // a framework's own device tensors
		r, m, err := d.NewRegion(cfg.PoolBytes)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // after the node's Close (cleanups run in reverse)
			if err := m.Free(); err != nil {
				t.Errorf("free the framework's memory: %v", err)
			}
		})
		cfg.CallerMemory = &node.CallerMemory{Region: r}
		cfg.PoolBytes = 0
	}
	n := open(t, cfg)
	e := n.Engine()
	if r := e.Region(); r.Kind != kvcache.DeviceMem || r.Device != cfg.Device {
		t.Fatalf("pool %s memory of device %d, want device memory of device %d", r.Kind, r.Device, cfg.Device)
	}
	if layers != nil && n.CallerAllocations() != len(layers.mems) {
		t.Fatalf("the framework's memory is registered by %d allocations, want %d (one per layer)", n.CallerAllocations(), len(layers.mems))
	}
	fmt.Printf("READY %#x\n", e.Region().Base)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := n.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 3 || f[0] != "RECV" {
			t.Fatalf("bad command %q", in.Text())
		}
		id := f[1]
		promptLen, _ := strconv.Atoi(f[2])
		rx, err := n.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: promptLen, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("RECEIVING", id)
		var o kvxfer.Outcome
		select {
		case o = <-rx.Done():
		case <-ctx.Done():
			t.Fatalf("%s: no outcome within %v", id, patience)
		}
		if !o.OK {
			fmt.Printf("FAILED %s %s: %v\n", id, o.Status, o.Err)
			continue
		}
		var got uint64
		if layers != nil {
			got, err = layers.verify(d, cfg.Layout, id, o.Blocks)
		} else {
			got, err = verifyDevice(d, e, id, o.Blocks)
		}
		if err != nil {
			fmt.Println("MISMATCH", id, err)
		} else if got != o.Bytes || got == 0 {
			fmt.Printf("MISMATCH %s verified %d bytes, READY says %d\n", id, got, o.Bytes)
		} else {
			fmt.Println("VERIFIED", id, got)
		}
		if err := e.FreeBlocks(o.Blocks); err != nil {
			t.Error(err)
		}
	}
}

// blockAddr is the device address of block id of group g of e's pool.
func blockAddr(e *kvxfer.Engine, g int, id kvcache.BlockID) cuda.DevicePtr {
	geom := e.Pools().Geometry(g)
	return cuda.DevicePtr(e.Region().Base) + cuda.DevicePtr(geom.Offset+uint64(id)*geom.BlockBytes)
}

// verifyDevice copies each READY block back to host memory and counts its
// bytes that hold the request's pattern; it fails at the first that does
// not.
func verifyDevice(d *cuda.Device, e *kvxfer.Engine, req string, blocks [][]kvcache.BlockID) (uint64, error) {
	var n uint64
	for g := range blocks {
		buf := make([]byte, e.Pools().Geometry(g).BlockBytes)
		for b, id := range blocks[g] {
			if err := d.CopyDtoH(buf, blockAddr(e, g, id)); err != nil {
				return n, err
			}
			for i := range buf {
				if want := pattern(req, g, b, i); buf[i] != want {
					return n, fmt.Errorf("group %d block %d (destination block %d) byte %d = %#x, want %#x", g, b, id, i, buf[i], want)
				}
			}
			n += uint64(len(buf))
		}
	}
	return n, nil
}

// sendDevice sends a request from e's device pool in chunks of
// chunkTokens, each chunk's source blocks filled (host to device, as a
// prefill would) just before its fence fires, and returns the outcome.
func sendDevice(t *testing.T, d *cuda.Device, e *kvxfer.Engine, id string, promptLen, chunkTokens int) kvxfer.Outcome {
	t.Helper()
	l := e.Layout()
	counts := make([]int, len(l.Groups))
	for g := range counts {
		if len(e.Shape().Layers[g]) > 0 {
			counts[g] = l.BlocksFor(promptLen)
		}
	}
	src, err := e.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen})
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) < 2 {
		t.Fatalf("%d chunks: want several", len(chunks))
	}
	for _, c := range chunks {
		fence := &kvxfer.ManualFence{}
		if err := tx.Chunk(c, c.Runs(l.TokensPerBlock, src), fence); err != nil {
			fence.Fire(err)
			t.Fatalf("chunk %+v: %v", c, err)
		}
		b0, b1 := c.Blocks(l.TokensPerBlock)
		for g := range src {
			for b := b0; b < b1 && b < len(src[g]); b++ {
				buf := make([]byte, e.Pools().Geometry(g).BlockBytes)
				for i := range buf {
					buf[i] = pattern(id, g, b, i)
				}
				if err := d.CopyHtoD(blockAddr(e, g, src[g][b]), buf); err != nil {
					t.Fatal(err)
				}
			}
		}
		fence.Fire(nil)
	}
	var o kvxfer.Outcome
	select {
	case o = <-tx.Done():
	case <-time.After(patience):
		t.Fatalf("%s: no outcome on the context side within %v", id, patience)
	}
	if err := e.Pools().Free(src); err != nil {
		t.Error(err)
	}
	return o
}

// genChild starts the generation node in a child process (another
// process than the writer's: a process cannot open its own CUDA IPC
// handles) and waits for its READY.
func genChild(t *testing.T, gc node.Config, caller bool, env ...string) *rdmatest.Child {
	t.Helper()
	gc.Layout = nil
	gc.Model = ""
	js, err := json.Marshal(gc)
	if err != nil {
		t.Fatal(err)
	}
	env = append(env, genChildEnv+"="+string(js))
	if caller {
		env = append(env, callerEnv+"=1")
	}
	child := rdmatest.StartChild(t, "TestChildGenCUDA", env...)
	child.Expect(t, "READY ")
	return child
}

// TestCUDAIPCTwoProcesses: a context node in this process and a
// generation node in another, both on backend cudaipc, move requests GPU
// to GPU in several chunks; the generation side copies every block back
// to host memory and checks every byte, and READY's byte count. Once with
// the node's own device pool on both sides, once with the generation
// node over device memory its "framework" allocated (CallerMemory).
// (Checked to fail: with openData not giving a cudaipc node a device pool,
// the context node's pool is host memory and the generation node's Open
// fails; with the caller-memory agent left to ucx, the generation node's
// Open fails; with a source block left unwritten, the child reports the
// block's mismatch.)
func TestCUDAIPCTwoProcesses(t *testing.T) {
	for _, caller := range []bool{false, true} {
		name := map[bool]string{false: "own device pool", true: "caller memory"}[caller]
		t.Run(name, func(t *testing.T) {
			d := requireCUDA(t)
			cc, gc := pair(t, cudaipc.Backend)
			cc.SendOnly = true
			if n, _ := cuda.DeviceCount(); caller && n > 1 {
				gc.Device = 1 // GPU 0 to GPU 1, as prefill and decode on two GPUs
			}
			child := genChild(t, gc, caller)
			moveRequests(t, d, cc, child, gc.Device)
		})
	}
}

// moveRequests opens the context node of cc in this process, and moves
// two requests of several chunks each to the generation child, which
// checks every byte and READY's byte count; then lets the child close.
func moveRequests(t *testing.T, d *cuda.Device, cc node.Config, child *rdmatest.Child, genDevice int) {
	t.Helper()
	ctxN := open(t, cc)
	if ctxN.Backend() != cudaipc.Backend {
		t.Fatalf("backend %s", ctxN.Backend())
	}
	if r := ctxN.Engine().Region(); r.Kind != kvcache.DeviceMem {
		t.Fatalf("the context node's pool is %s memory, want device memory", r.Kind)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := ctxN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	for i, promptLen := range []int{100, 37} {
		id := fmt.Sprintf("gpu-%d", i)
		child.Send(t, fmt.Sprintf("RECV %s %d", id, promptLen))
		child.Expect(t, "RECEIVING "+id)
		if o := sendDevice(t, d, ctxN.Engine(), id, promptLen, 32); !o.OK {
			t.Fatalf("%s: context side %s: %v", id, o.Status, o.Err)
		}
		got := child.Expect(t, "")
		if !strings.HasPrefix(got, "VERIFIED "+id+" ") {
			t.Fatalf("%s: generation side: %s", id, got)
		}
		t.Logf("%s: %d tokens from device 0 to device %d: %s", id, promptLen, genDevice, got)
	}
	if u := ctxN.Engine().Pools().Used(); u != 0 {
		t.Errorf("%d source blocks in use after both requests", u)
	}
	child.Wait(t)
}

// TestCUDAIPCPerLayerTensors: the generation node runs over its
// framework's KV cache as vLLM allocates it — one NHD tensor [2, blocks,
// tokens, heads, head_dim] per layer, 4 layers, each its own CUDA
// allocation with unmapped gaps between them — on backend cudaipc; the
// node registers it by the 4 allocations the described tensors lie in,
// and a context node in this process moves requests into it in several
// chunks; the generation side checks every byte of every layer's tensor
// where NHD puts it, and READY's count.
func TestCUDAIPCPerLayerTensors(t *testing.T) {
	d := requireCUDA(t)
	cc, gc := pair(t, cudaipc.Backend)
	cc.Layout, gc.Layout = fourLayers(), fourLayers()
	cc.SendOnly = true
	if n, _ := cuda.DeviceCount(); n > 1 {
		gc.Device = 1
	}
	child := genChild(t, gc, false, layersEnv+"=1")
	moveRequests(t, d, cc, child, gc.Device)
}

// TestCUDAIPCPeerOnAnotherHost: the generation node's Hello names a
// process of another host (this process is told its host is another one,
// and the generation agent's agent file is made to say another host, as
// an agent elsewhere that shared this Dir would): the request fails at
// once on both sides, the context side's error wrapping node.ErrOtherHost
// and saying the backend reaches one host only; no write is posted,
// nothing waits for a deadline. (Checked to fail: with cudaipc's Connect
// not checking the agent file's host, the request succeeds — the fake
// driver's handles open on this host; with oneHostAgent.Connect not
// wording it, the error is rdma.ErrPeerGone.)
func TestCUDAIPCPeerOnAnotherHost(t *testing.T) {
	d := requireCUDA(t)
	cc, gc := pair(t, cudaipc.Backend)
	cc.SendOnly = true
	cc.TransferTimeout = node.Duration(time.Hour) // a hang would show as the test's timeout
	gc.TransferTimeout = cc.TransferTimeout
	child := genChild(t, gc, false)
	agentFilesElsewhere(t, child.Process().Pid)
	defer node.SetThisHost("another-boot-id/pid:[4026531836]")()
	ctxN := open(t, cc)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := ctxN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	child.Send(t, "RECV far 64")
	child.Expect(t, "RECEIVING far")
	o := sendDevice(t, d, ctxN.Engine(), "far", 64, 32)
	if o.OK || !errors.Is(o.Err, node.ErrOtherHost) {
		t.Fatalf("a peer of another host: %s: %v, want node.ErrOtherHost", o.Status, o.Err)
	}
	for _, want := range []string{"gen/0", "one host", `"ucx"`} {
		if !strings.Contains(o.Err.Error(), want) {
			t.Errorf("the error %q does not say %q", o.Err, want)
		}
	}
	t.Logf("context side: %s: %v", o.Status, o.Err)
	got := child.Expect(t, "")
	if !strings.HasPrefix(got, "FAILED far ") {
		t.Fatalf("generation side: %s, want FAILED", got)
	}
	t.Logf("generation side: %s", got)
	child.Wait(t)
}

// agentFilesElsewhere makes the agent files of process pid's cudaipc
// agents say another host than this one (its bytes, of the same length,
// all 'x'): cudaipc's Connect then finds those agents on another host.
func agentFilesElsewhere(t *testing.T, pid int) {
	t.Helper()
	host, err := pidwatch.Host()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(cudaipc.Dir(), fmt.Sprintf("kvxfer-cudaipc-agent-%d-*", pid)))
	if err != nil || len(files) == 0 {
		t.Fatalf("no agent file of process %d in %s: %v", pid, cudaipc.Dir(), err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte(host)) {
			t.Fatalf("agent file %s: %v, or it does not hold this host %q", f, err, host)
		}
		if err := os.WriteFile(f, bytes.Replace(b, []byte(host), bytes.Repeat([]byte("x"), len(host)), 1), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCUDAIPCRefusals: each setting a cudaipc node cannot honour is
// refused by name, at Validate or at Open, and nothing stays open; the
// caller memory refused is left as it was. (Checked to fail, one
// mechanism at a time: without validateDevice, memory, revocation, a
// negative device and a device on another backend are not refused by
// name; without the cudaipc case of validateCallerMemory, host memory
// and another GPU's memory are refused without saying so; without the
// device count check, device 64 fails in cuda without naming "device";
// without useCallerMemory's check, memory past its allocation and a
// layer's tensor that runs out of its allocation fail in the agent's
// Register, without ErrConfig or the tensor's name; without its device
// check, device 0's memory declared as device 1's opens.)
func TestCUDAIPCRefusals(t *testing.T) {
	d := requireCUDA(t)
	host, err := kvcache.NewHostRegion(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	dev, mem, err := d.NewRegion(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	// Caller memory without descriptors is one pool: it must lie in one
	// allocation.
	over, err := kvcache.ExternalDeviceRegion(dev.Base, 2*dev.Len, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Per-layer tensors may lie in several allocations, but each in one:
	// layer 1's tensor described 64 bytes past its allocation's start
	// runs out of it.
	crossing := crossingTensors(t, d)
	// Device 0's memory, declared as device 1's.
	other, err := kvcache.ExternalDeviceRegion(dev.Base, dev.Len, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		edit  func(*node.Config)
		wants []string
	}{
		{"host caller memory", func(c *node.Config) { c.CallerMemory = &node.CallerMemory{Region: host}; c.PoolBytes = 0 },
			[]string{"CallerMemory.Region", "host memory", fmt.Sprintf("%#x", host.Base), `"shm"`, `"ucx"`}},
		{"device mismatch", func(c *node.Config) { c.Device = 1; c.CallerMemory = &node.CallerMemory{Region: dev}; c.PoolBytes = 0 },
			[]string{"device 0", "device = 1"}},
		{"memory of another device than the region says", func(c *node.Config) {
			c.Device = 1
			c.CallerMemory = &node.CallerMemory{Region: other}
			c.PoolBytes = 0
		}, []string{"says device 1", "on device 0", fmt.Sprintf("%#x", other.Base)}},
		{"caller memory past its allocation", func(c *node.Config) { c.CallerMemory = &node.CallerMemory{Region: over}; c.PoolBytes = 0 },
			[]string{"CallerMemory.Region", "run past the CUDA allocation", "one allocation"}},
		{"a layer's tensor past its allocation", func(c *node.Config) { c.CallerMemory = crossing; c.PoolBytes = 0 },
			[]string{"CallerMemory.Memory[0]", "layer 1 ", "run past the CUDA allocation", "one allocation", `"ucx"`}},
		{"negative device", func(c *node.Config) { c.Device = -1 }, []string{"device = -1"}},
		{"device past the count", func(c *node.Config) { c.Device = 64 }, []string{"device = 64", "CUDA devices"}},
		{"memory", func(c *node.Config) { c.Memory = &node.Memory{Kind: "nhd", NumBlocks: 4} }, []string{"memory = ", "cudaipc", "CallerMemory"}},
		{"revocation", func(c *node.Config) { c.RevokeSpareBytes = 4096 }, []string{"revoke_spare_bytes = 4096", "cudaipc"}},
		{"device on another backend", func(c *node.Config) { c.Backend = "shm"; c.Device = 1 }, []string{"device = 1", `"shm"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, gc := pair(t, cudaipc.Backend)
			c.edit(&gc)
			n, err := node.Open(context.Background(), gc)
			if err == nil {
				n.Close(context.Background())
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, node.ErrConfig) {
				t.Errorf("%v: does not wrap ErrConfig", err)
			}
			for _, w := range c.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			t.Log(err)
		})
	}
	// The memory refused above is untouched: still device memory of device
	// 0 that this process can write and read.
	want := bytes.Repeat([]byte{0x5a}, 4096)
	if err := d.CopyHtoD(mem.Ptr(), want); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := d.CopyDtoH(got, mem.Ptr()); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the refused caller memory after the refusals: %v", err)
	}
}

// crossingTensors is caller memory of tiny()'s two layers, NHD, each
// layer's tensor its own allocation, but layer 1's — the allocation at
// the higher address, whatever order the driver placed them in —
// described 64 bytes past its allocation's start, so that it runs out of
// its allocation (and overlaps no other tensor).
func crossingTensors(t *testing.T, d *cuda.Device) *node.CallerMemory {
	t.Helper()
	kl, s, err := kvxfer.Config{Layout: tiny(), Parallel: kvcache.Parallel{TP: 1, PP: 1}}.LayoutShape()
	if err != nil {
		t.Fatal(err)
	}
	size := uint64(kl.Parts()) * layerBlocks * uint64(kl.TokensPerBlock*s.Heads()*kl.TokenBytes())
	var ms []*cuda.Memory
	for range 2 {
		m, err := d.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Free(); err != nil {
				t.Error(err)
			}
		})
		ms = append(ms, m)
	}
	if ms[0].Ptr() > ms[1].Ptr() {
		ms[0], ms[1] = ms[1], ms[0]
	}
	lo, hi := uintptr(ms[0].Ptr()), uintptr(ms[1].Ptr())+uintptr(size)
	r, err := kvcache.ExternalDeviceRegion(lo, uint64(hi-lo)+64, d.Ordinal())
	if err != nil {
		t.Fatal(err)
	}
	offs := []uint64{0, uint64(uintptr(ms[1].Ptr())-lo) + 64}
	mem, err := kvcache.FrameworkMemory("nhd", kl, s, 0, layerBlocks, offs, nil, r.Len)
	if err != nil {
		t.Fatal(err)
	}
	return &node.CallerMemory{Region: r, Memory: []*kvcache.KVMemory{mem}}
}

// TestCUDAIPCNotAuto: backend "auto" never picks cudaipc, even where a
// GPU is present: its peers might be on other hosts, and its pool would
// be memory the CPU cannot address. (Checked to fail: with Config.backend
// resolving auto to cudaipc when a device is present.)
func TestCUDAIPCNotAuto(t *testing.T) {
	requireCUDA(t)
	for _, b := range []string{"", node.BackendAuto} {
		_, gc := pair(t, b)
		n := open(t, gc)
		if n.Backend() == cudaipc.Backend {
			t.Errorf("backend %q picked %s", b, n.Backend())
		}
		if r := n.Engine().Region(); r.Kind != kvcache.HostMem {
			t.Errorf("backend %q: pool of %s memory", b, r.Kind)
		}
	}
}
