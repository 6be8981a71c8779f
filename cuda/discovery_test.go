//go:build cgo && !kvxfer_nonvml

package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// TestDiscoverNoLibrary: without libnvidia-ml.so.1 go-nvml's Init returns
// ERROR_LIBRARY_NOT_FOUND (no panic), and Discover says "no NVIDIA
// driver".
func TestDiscoverNoLibrary(t *testing.T) {
	lib := nvml.New(nvml.WithLibraryPath("/nonexistent/libnvidia-ml.so.1"))
	if ret := lib.Init(); ret != nvml.ERROR_LIBRARY_NOT_FOUND {
		t.Fatalf("go-nvml Init with no library = %v, want ERROR_LIBRARY_NOT_FOUND", ret)
	}
	topo, err := discover(lib)
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "no NVIDIA driver") {
		t.Fatalf("discover = %v, want ErrNoDevice saying no NVIDIA driver", err)
	}
	if len(topo.GPUs) != 0 {
		t.Errorf("GPUs without a driver: %v", topo.GPUs)
	}
}

// TestDiscoverHere: on this machine Discover either lists GPUs or says
// why there are none; it never panics.
func TestDiscoverHere(t *testing.T) {
	topo, err := Discover()
	switch {
	case errors.Is(err, ErrNoDevice):
		t.Logf("no GPU here: %v", err)
	case err != nil:
		t.Fatalf("Discover: %v", err)
	default:
		t.Logf("driver %s (CUDA %s), %d GPUs", topo.DriverVersion, FormatCUDAVersion(topo.CUDAVersion), len(topo.GPUs))
		for _, g := range topo.GPUs {
			if g.Name == "" || g.PCIBusID == "" || g.MemoryBytes == 0 {
				t.Errorf("GPU %d incomplete: %+v", g.Index, g)
			}
		}
	}
}

// TestDiscoverDGXH100: NVML's mock of an 8-GPU DGX H100, with NVLink
// through NVSwitches (P2P status OK between every pair), one direct link
// from GPU 0 to GPU 1, NUMA nodes 0/1, and one GPU without NVLink.
func TestDiscoverDGXH100(t *testing.T) {
	s := dgxh100.New()
	devs := make([]*server.Device, len(s.Devices))
	for i, d := range s.Devices {
		devs[i] = d.(*server.Device)
	}
	bus := func(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x18+i) }
	pci := func(b string) nvml.PciInfo {
		var p nvml.PciInfo
		for k := range len(b) {
			p.BusId[k] = int8(b[k])
		}
		return p
	}
	const lonely = 7 // no NVLink
	for i, d := range devs {
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pci(bus(i)), nvml.SUCCESS }
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if i == lonely {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			if i == 0 && link == 0 {
				return pci(bus(1)), nvml.SUCCESS
			}
			return pci("00000000:C0:00.0"), nvml.SUCCESS // an NVSwitch
		}
		d.GetP2PStatusFunc = func(other nvml.Device, _ nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			if other.(*server.Device).Index == lonely || i == 1 {
				return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
	}
	topo, err := discover(s)
	if err != nil {
		t.Fatal(err)
	}
	if topo.DriverVersion != "550.54.15" || FormatCUDAVersion(topo.CUDAVersion) != "12.4" || len(topo.GPUs) != 8 {
		t.Fatalf("topology: driver %q, CUDA %d, %d GPUs", topo.DriverVersion, topo.CUDAVersion, len(topo.GPUs))
	}
	for i, g := range topo.GPUs {
		if g.Index != i || !strings.Contains(g.Name, "H100") || g.MemoryBytes == 0 || g.PCIBusID != bus(i) || g.NUMANode != i/4 || g.UUID == "" {
			t.Errorf("GPU %d: %+v", i, g)
		}
		var want []int
		switch i {
		case lonely:
			want = []int{}
		case 1: // P2P reports nothing; no link of its own names a GPU
			want = []int{}
		default:
			for j := range 7 {
				if j != i {
					want = append(want, j)
				}
			}
		}
		if !slices.Equal(g.NVLinkPeers, want) {
			t.Errorf("GPU %d: NVLink peers %v, want %v", i, g.NVLinkPeers, want)
		}
		if wantLinks := map[bool]int{true: 0, false: 18}[i == lonely]; g.NVLinks != wantLinks {
			t.Errorf("GPU %d: %d links, want %d", i, g.NVLinks, wantLinks)
		}
	}
}

func TestNUMAFromSysfs(t *testing.T) {
	if n := numaFromSysfs("00000000:FF:1F.7"); n != -1 {
		t.Errorf("a device that does not exist: node %d, want -1", n)
	}
}

// TestInitNoDevice: a driver that loads but finds no device makes Init
// return ErrNoDevice (run in a child process: Init is once per process).
func TestInitNoDevice(t *testing.T) {
	if os.Getenv("KVXFER_CUDA_TEST_CHILD") == "nodevice" {
		err := Init()
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("Init with no device = %v, want ErrNoDevice", err)
		}
		if _, err := OpenDevice(0); !errors.Is(err, ErrNoDevice) {
			t.Fatalf("OpenDevice with no device = %v, want ErrNoDevice", err)
		}
		fmt.Println("CHILD-OK:", err)
		return
	}
	if fakeErr != nil || os.Getenv("FAKECUDA_COPY_DELAY_US") == "" {
		t.Skip("needs the fake driver (FAKECUDA_DEVICES=0)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInitNoDevice$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVXFER_CUDA_TEST_CHILD=nodevice", "FAKECUDA_DEVICES=0")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CHILD-OK:") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for l := range strings.Lines(string(out)) {
		if strings.HasPrefix(l, "CHILD-OK:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}
