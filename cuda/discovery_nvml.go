//go:build cgo && !kvxfer_nonvml

package cuda

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discover lists the GPUs through NVML (libnvidia-ml.so.1, loaded at run
// time by go-nvml): name, memory, PCI bus id, NUMA node and NVLink peers.
// Without the library or the driver it returns an error wrapping
// ErrNoDevice that says which; a driver with no GPU is an empty Topology
// and no error.
func Discover() (Topology, error) { return discover(nvml.New()) }

func discover(lib nvml.Interface) (Topology, error) {
	var t Topology
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return t, fmt.Errorf("%w: no NVIDIA driver (libnvidia-ml.so.1 not found)", ErrNoDevice)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return t, fmt.Errorf("%w: NVIDIA driver not loaded (NVML: %v)", ErrNoDevice, ret)
	default:
		return t, fmt.Errorf("%w: NVML init: %v", ErrNoDevice, ret)
	}
	defer lib.Shutdown()

	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		t.DriverVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		t.CUDAVersion = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return t, fmt.Errorf("NVML device count: %v", ret)
	}
	// The NUMA call is recent (driver 535+): calling a symbol the
	// library lacks would crash, so look it up first.
	hasNUMA := lib.Extensions().LookupSymbol("nvmlDeviceGetNumaNodeId") == nil

	devs := make([]nvml.Device, 0, n)
	t.GPUs = make([]GPU, 0, n)
	byBus := make(map[string]int, n)
	remotes := make([][]string, 0, n) // per GPU: bus ids at the far end of its links
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return t, fmt.Errorf("NVML device %d: %v", i, ret)
		}
		g := GPU{Index: i, NUMANode: -1, NVLinkPeers: []int{}}
		if g.Name, ret = d.GetName(); ret != nvml.SUCCESS {
			return t, fmt.Errorf("NVML device %d name: %v", i, ret)
		}
		g.UUID, _ = d.GetUUID()
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryBytes = m.Total
		}
		if p, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			g.PCIBusID = busID(p)
		}
		if hasNUMA {
			if node, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS {
				g.NUMANode = node
			}
		}
		if g.NUMANode < 0 && g.PCIBusID != "" {
			g.NUMANode = numaFromSysfs(g.PCIBusID)
		}
		var far []string
		for link := range nvml.NVLINK_MAX_LINKS {
			st, ret := d.GetNvLinkState(link)
			if ret != nvml.SUCCESS {
				if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
					break // no NVLink, or no more links
				}
				continue
			}
			if st != nvml.FEATURE_ENABLED {
				continue
			}
			g.NVLinks++
			if p, ret := d.GetNvLinkRemotePciInfo(link); ret == nvml.SUCCESS {
				far = append(far, busID(p))
			}
		}
		devs = append(devs, d)
		byBus[g.PCIBusID] = i
		remotes = append(remotes, far)
		t.GPUs = append(t.GPUs, g)
	}

	// Peers: a link whose far end is another GPU, or NVML's NVLink P2P
	// status (which also covers GPUs joined through NVSwitches).
	for i := range t.GPUs {
		if t.GPUs[i].NVLinks == 0 {
			continue
		}
		for _, b := range remotes[i] {
			if j, ok := byBus[b]; ok && j != i && !slices.Contains(t.GPUs[i].NVLinkPeers, j) {
				t.GPUs[i].NVLinkPeers = append(t.GPUs[i].NVLinkPeers, j)
			}
		}
		for j := range t.GPUs {
			if j == i || slices.Contains(t.GPUs[i].NVLinkPeers, j) {
				continue
			}
			if st, ret := devs[i].GetP2PStatus(devs[j], nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
				t.GPUs[i].NVLinkPeers = append(t.GPUs[i].NVLinkPeers, j)
			}
		}
		slices.Sort(t.GPUs[i].NVLinkPeers)
	}
	return t, nil
}

// busID is the NUL-terminated bus id of a PCI info.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
