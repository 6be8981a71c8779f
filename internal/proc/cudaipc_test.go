package proc

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/cudatest"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// TestFakeCUDARoles runs TestCUDAIPCRoles against the fake CUDA driver
// (cuda/cudatest) in a child process, so that it runs without a GPU.
func TestFakeCUDARoles(t *testing.T) {
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		t.Skipf("the driver under test is chosen already ($%s=%s)", cuda.LibraryEnv, p)
	}
	out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, "^TestCUDAIPCRoles$", "FAKECUDA_DEVICES=2")
	if err != nil || !strings.Contains(out, "--- PASS: TestCUDAIPCRoles") {
		t.Fatalf("TestCUDAIPCRoles on the fake driver: %v\n%s", err, out)
	}
}

// TestCUDAIPCRoles: the two roles on backend cudaipc, the context on GPU
// 0 and the generation on GPU 1 where there are two: the context role
// fills its source blocks in device memory (host to device copies, part
// by part) and the generation role reads every destination block back
// and checks every byte. Both roles run in this process (the fake
// driver's IPC across processes is node's TestCUDAIPCTwoProcesses).
// (Checked to fail: with fillChunk not writing a device pool back (put),
// the generation role counts mismatches.)
func TestCUDAIPCRoles(t *testing.T) {
	n, err := cuda.DeviceCount()
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("needs a CUDA device (TestFakeCUDARoles runs this on the fake driver): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	layout := &kvcache.Layout{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(2)}
	base := Options{Backend: cudaipc.Backend, Insecure: true, Layout: layout, PoolBytes: 1 << 20, Workers: 2,
		Requests: 6, MinTokens: 20, MaxTokens: 120, ChunkTokens: 32, Concurrency: 2, Seed: 3, LayerParts: 0,
		Heartbeat: 500 * time.Millisecond, HeartbeatMisses: 3, Timeout: 30 * time.Second}
	gen, ctxO := base, base
	gen.Instance, gen.Peer, gen.Bind, gen.PeerEndpoint = "gen", "ctx", "ipc://"+filepath.Join(dir, "gen"), "ipc://"+filepath.Join(dir, "ctx")
	ctxO.Instance, ctxO.Peer, ctxO.Bind, ctxO.PeerEndpoint = "ctx", "gen", gen.PeerEndpoint, gen.Bind
	if n > 1 {
		gen.Device = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		rep Report
		err error
	}
	genDone := make(chan result, 1)
	go func() {
		r, err := RunGen(ctx, gen, io.Discard)
		genDone <- result{r, err}
	}()
	cr, err := RunCtx(ctx, ctxO, io.Discard)
	if err != nil || cr.OK != base.Requests || cr.Failed != 0 || cr.LeakedBlocks != 0 {
		t.Fatalf("context role: %v: %+v", err, cr)
	}
	gr := <-genDone
	if gr.err != nil || gr.rep.OK != base.Requests || gr.rep.Failed != 0 || gr.rep.Mismatches != 0 || gr.rep.LeakedBlocks != 0 {
		t.Fatalf("generation role: %v: %+v", gr.err, gr.rep)
	}
	if gr.rep.BytesVerified == 0 || gr.rep.BytesVerified != gr.rep.Bytes {
		t.Fatalf("generation role verified %d bytes of %d", gr.rep.BytesVerified, gr.rep.Bytes)
	}
	t.Logf("%d requests, %d bytes from device 0 to device %d, every byte checked on the host", gr.rep.OK, gr.rep.Bytes, gen.Device)
}
