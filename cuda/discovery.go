package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GPU is one device as NVML reports it.
type GPU struct {
	// Index is NVML's index (the order nvidia-smi shows; CUDA's order
	// may differ unless CUDA_DEVICE_ORDER=PCI_BUS_ID).
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	// MemoryBytes is the device's total memory.
	MemoryBytes uint64 `json:"memory_bytes"`
	// PCIBusID is domain:bus:device.function, as NVML writes it.
	PCIBusID string `json:"pci_bus_id"`
	// NUMANode is the host NUMA node closest to the device, -1 when
	// unknown.
	NUMANode int `json:"numa_node"`
	// NVLinks is the number of active NVLink links.
	NVLinks int `json:"nvlinks"`
	// NVLinkPeers are the indexes of the GPUs this one reaches over
	// NVLink (directly or through NVSwitch).
	NVLinkPeers []int `json:"nvlink_peers"`
}

// Topology is what Discover found.
type Topology struct {
	// DriverVersion is the NVIDIA driver's version, e.g. "550.54.15".
	DriverVersion string `json:"driver_version,omitempty"`
	// CUDAVersion is the CUDA version the driver supports, as
	// 1000×major + 10×minor (12040 is 12.4); 0 when unknown.
	CUDAVersion int `json:"cuda_version,omitempty"`
	// GPUs are the devices, by index; empty when there are none.
	GPUs []GPU `json:"gpus"`
}

// FormatCUDAVersion writes a driver CUDA version (12040) as "12.4".
func FormatCUDAVersion(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// numaFromSysfs reads a device's NUMA node from
// /sys/bus/pci/devices/<bus id>/numa_node (-1 when unknown). NVML writes
// an eight-digit PCI domain; sysfs uses four, in lower case.
func numaFromSysfs(busID string) int {
	id := strings.ToLower(busID)
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) > 4 {
		id = dom[len(dom)-4:] + ":" + rest
	}
	b, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", id, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}
