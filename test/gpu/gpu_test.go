package gpu_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/cudatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Both fences are engine fences, structurally.
var (
	_ actors.Fence = (*cuda.EventFence)(nil)
	_ actors.Fence = (*cuda.HostFence)(nil)
)

// gpu opens device 0, closed at cleanup, or skips saying why there is
// none.
func gpu(tb testing.TB) *cuda.Device {
	tb.Helper()
	d, err := cuda.OpenDevice(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		tb.Skipf("needs a GPU: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("device Close: %v", err)
		}
	})
	return d
}

// TestDiscovery: NVML and the CUDA driver agree on the GPUs there are, or
// both say there are none.
func TestDiscovery(t *testing.T) {
	topo, nerr := cuda.Discover()
	n, cerr := cuda.DeviceCount()
	switch {
	case nerr != nil && !errors.Is(nerr, cuda.ErrNoDevice):
		t.Fatalf("Discover: %v", nerr)
	case cerr != nil && !errors.Is(cerr, cuda.ErrNoDevice):
		t.Fatalf("DeviceCount: %v", cerr)
	case nerr != nil && cerr != nil:
		t.Skipf("no GPU: NVML: %v; CUDA: %v", nerr, cerr)
	case nerr != nil || cerr != nil:
		t.Fatalf("NVML and CUDA disagree: NVML %v (%d GPUs), CUDA %v (%d devices)", nerr, len(topo.GPUs), cerr, n)
	}
	if len(topo.GPUs) != n && os.Getenv("CUDA_VISIBLE_DEVICES") == "" {
		t.Errorf("NVML lists %d GPUs, CUDA %d devices", len(topo.GPUs), n)
	}
	d := gpu(t)
	found := false
	for _, g := range topo.GPUs {
		t.Logf("GPU %d: %s, %d MiB, %s, NUMA %d, %d NVLinks, peers %v", g.Index, g.Name, g.MemoryBytes>>20, g.PCIBusID, g.NUMANode, g.NVLinks, g.NVLinkPeers)
		if strings.EqualFold(strings.TrimPrefix(g.PCIBusID, "0000"), strings.TrimPrefix(d.PCIBusID(), "0000")) {
			found = true
		}
	}
	if !found {
		t.Errorf("CUDA device 0 (%s) is none of NVML's GPUs", d.PCIBusID())
	}
}

// TestFakeDriver runs the demo and TestChunkBehindCUDAEvent against the
// fake driver in a child process
// (a no-op where $KVXFER_LIBCUDA already names the driver under test).
func TestFakeDriver(t *testing.T) {
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		t.Skipf("the driver under test is chosen already ($%s=%s)", cuda.LibraryEnv, p)
	}
	if testing.Short() {
		t.Skip("-short")
	}
	out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, "^(TestDemo|TestChunkBehindCUDAEvent)$", "FAKECUDA_COPY_DELAY_US=5")
	if err != nil || !strings.Contains(out, "--- PASS: TestDemo") || !strings.Contains(out, "--- PASS: TestChunkBehindCUDAEvent") {
		t.Fatalf("demo and chunk behind a CUDA event on the fake driver: %v\n%s", err, out)
	}
	for l := range strings.Lines(out) {
		if strings.Contains(l, "demo:") || strings.Contains(l, "borrowed CUDA event") {
			t.Log(strings.TrimSpace(l))
		}
	}
}
