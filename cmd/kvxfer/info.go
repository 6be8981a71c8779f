package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	"github.com/kvxfer/kvxfer/internal/sysmon"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// backendInfo is one data-plane backend compiled into this binary.
type backendInfo struct {
	Name        string `json:"name"`
	Memory      string `json:"memory"` // what it moves: host or device memory
	Description string `json:"description"`
}

// backends is the registry of the data-plane backends compiled into kvxfer
// (every backend package the binary links; ucx only when this build has it:
// cgo on Linux with UCX, without the kvxfer_noucx tag).
var backends = func() []backendInfo {
	bs := []backendInfo{
		{loopback.Backend, "host", "in-process"},
		{shm.Backend, "host", "processes of one host, through shared memory"},
	}
	if ucx.Available {
		bs = append(bs, backendInfo{ucx.Backend, "host", "UCX: RDMA, shared memory or TCP, as UCX selects"})
	}
	return append(bs,
		backendInfo{cudaipc.Backend, "device", "processes of one node, GPU to GPU through CUDA IPC handles"},
		backendInfo{"faulty", "any", "wraps any backend and injects faults (tests)"})
}()

// systemInfo is what `kvxfer info` reports.
type systemInfo struct {
	// GPUs are NVML's; GPUError says why there are none, when it knows.
	GPUs          []cuda.GPU    `json:"gpus"`
	GPUError      string        `json:"gpu_error,omitempty"`
	DriverVersion string        `json:"driver_version,omitempty"`
	CUDA          cudaInfo      `json:"cuda"`
	UCX           ucxInfo       `json:"ucx"`
	Backends      []backendInfo `json:"backends"`
	Runtime       runtimeInfo   `json:"runtime"`
}

// runtimeInfo is the Go runtime's settings that the kvxfer command makes
// for itself (internal/sysmon, internal/gcfloor).
type runtimeInfo struct {
	GoDebug     string `json:"godebug"`
	SysmonAwake bool   `json:"sysmon_awake"` // GODEBUG schedtrace keeps sysmon out of its deep sleep
	// GCFloorBytes is the heap the collector waits for (0: the runtime's
	// default pacing, GOGC or KVXFER_GC_FLOOR=off).
	GCFloorBytes uint64 `json:"gc_floor_bytes"`
	// GOMAXPROCS is the runtime's, CPUs the CPUs this process may run on
	// (its affinity): docs/configuration.md, "Small machines", says when
	// GOMAXPROCS 1 serves a small machine better.
	GOMAXPROCS int `json:"gomaxprocs"`
	CPUs       int `json:"cpus"`
}

// cudaInfo is the CUDA driver API as package cuda loads it.
type cudaInfo struct {
	Library string `json:"library"`
	Version string `json:"version,omitempty"`
	Devices int    `json:"devices"`
	Error   string `json:"error,omitempty"`
}

// ucxInfo is what ucx_info reports.
type ucxInfo struct {
	Found      bool           `json:"found"`
	Version    string         `json:"version,omitempty"`
	Transports []ucxTransport `json:"transports"`
	Error      string         `json:"error,omitempty"`
}

type ucxTransport struct {
	Name    string   `json:"name"`
	Devices []string `json:"devices"`
}

// infoOptions are the commands gatherInfo runs (replaced in tests).
type infoOptions struct {
	ucxInfo string // the ucx_info binary
}

// gatherInfo collects the GPUs (NVML), the CUDA driver's state, UCX's
// transports and the compiled-in backends. Nothing here fails: what is
// missing is reported as missing.
func gatherInfo(ctx context.Context, o infoOptions) systemInfo {
	var si systemInfo
	topo, err := cuda.Discover()
	si.GPUs = topo.GPUs
	if si.GPUs == nil {
		si.GPUs = []cuda.GPU{}
	}
	si.DriverVersion = topo.DriverVersion
	if err != nil {
		si.GPUError = reason(err)
	}
	si.CUDA.Library = cuda.LibraryPath()
	if v, err := cuda.DriverVersion(); err != nil {
		si.CUDA.Error = reason(err)
	} else {
		si.CUDA.Version = cuda.FormatCUDAVersion(v)
		si.CUDA.Devices, _ = cuda.DeviceCount()
	}
	si.UCX = probeUCX(ctx, o.ucxInfo)
	si.Backends = backends
	si.Runtime = runtimeInfo{GoDebug: os.Getenv("GODEBUG"), SysmonAwake: sysmon.Awake(), GCFloorBytes: gcfloor.Floor(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), CPUs: runtime.NumCPU()}
	return si
}

// reason is err's text without the "cuda: no device: " prefix the
// context already says.
func reason(err error) string {
	return strings.TrimPrefix(err.Error(), cuda.ErrNoDevice.Error()+": ")
}

// probeUCX runs `ucx_info -v` and `ucx_info -d` (10 s at most) and parses
// the version and the transports with their devices.
func probeUCX(ctx context.Context, bin string) ucxInfo {
	u := ucxInfo{Transports: []ucxTransport{}}
	path, err := exec.LookPath(bin)
	if err != nil {
		u.Error = fmt.Sprintf("%s not found", bin)
		return u
	}
	u.Found = true
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, "-v").Output(); err == nil {
		u.Version = parseUCXVersion(string(out))
	}
	out, err := exec.CommandContext(ctx, path, "-d").Output()
	if err != nil {
		u.Error = fmt.Sprintf("%s -d: %v", bin, err)
		return u
	}
	u.Transports = parseUCXTransports(string(out))
	return u
}

// parseUCXVersion finds "# Version 1.13.1" (or "# UCT version=1.13.1").
func parseUCXVersion(s string) string {
	for l := range strings.Lines(s) {
		f := strings.Fields(strings.TrimLeft(l, "# \t"))
		switch {
		case len(f) >= 2 && f[0] == "Version":
			return f[1]
		case len(f) >= 2 && strings.HasPrefix(f[1], "version="):
			return strings.TrimPrefix(f[1], "version=")
		}
	}
	return ""
}

// parseUCXTransports reads `ucx_info -d`: each "Transport: NAME" line
// followed by "Device: DEV". A transport on several devices is listed once
// with all of them, in the order UCX prints.
func parseUCXTransports(s string) []ucxTransport {
	ts := []ucxTransport{}
	cur := -1
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		key, val, ok := strings.Cut(strings.TrimLeft(sc.Text(), "# \t"), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "Transport":
			cur = slices.IndexFunc(ts, func(t ucxTransport) bool { return t.Name == val })
			if cur < 0 {
				ts = append(ts, ucxTransport{Name: val, Devices: []string{}})
				cur = len(ts) - 1
			}
		case "Device":
			if cur >= 0 && val != "" && !slices.Contains(ts[cur].Devices, val) {
				ts[cur].Devices = append(ts[cur].Devices, val)
			}
		}
	}
	return ts
}

// usable says whether a GPU is usable: NVML lists one and the CUDA driver
// has a device.
func (si systemInfo) usable() error {
	switch {
	case len(si.GPUs) == 0 && si.GPUError != "":
		return errors.New(si.GPUError)
	case len(si.GPUs) == 0:
		return errors.New("NVML lists no GPU")
	case si.CUDA.Error != "":
		return errors.New(si.CUDA.Error)
	case si.CUDA.Devices == 0:
		return errors.New("the CUDA driver has no device")
	}
	return nil
}

// print writes si as a table.
func (si systemInfo) print(w io.Writer) {
	if len(si.GPUs) == 0 {
		why := "NVML lists no GPU"
		if si.GPUError != "" {
			why = si.GPUError
		}
		fmt.Fprintf(w, "GPUs: none (%s)\n", why)
	} else {
		fmt.Fprintf(w, "GPUs: %d (NVIDIA driver %s)\n", len(si.GPUs), si.DriverVersion)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  GPU\tNAME\tMEMORY\tPCI BUS ID\tNUMA\tNVLINKS\tNVLINK PEERS")
		for _, g := range si.GPUs {
			numa := "-"
			if g.NUMANode >= 0 {
				numa = strconv.Itoa(g.NUMANode)
			}
			peers := "-"
			if len(g.NVLinkPeers) > 0 {
				ps := make([]string, len(g.NVLinkPeers))
				for i, p := range g.NVLinkPeers {
					ps[i] = strconv.Itoa(p)
				}
				peers = strings.Join(ps, ",")
			}
			fmt.Fprintf(tw, "  %d\t%s\t%.1f GiB\t%s\t%s\t%d\t%s\n", g.Index, g.Name, float64(g.MemoryBytes)/(1<<30), g.PCIBusID, numa, g.NVLinks, peers)
		}
		tw.Flush()
	}
	if si.CUDA.Error != "" {
		fmt.Fprintf(w, "CUDA driver: not usable (%s)\n", si.CUDA.Error)
	} else {
		fmt.Fprintf(w, "CUDA driver: %s (%s), %d devices\n", si.CUDA.Version, si.CUDA.Library, si.CUDA.Devices)
	}
	switch {
	case !si.UCX.Found:
		fmt.Fprintf(w, "UCX: not found (%s)\n", si.UCX.Error)
	case si.UCX.Error != "":
		fmt.Fprintf(w, "UCX %s: %s\n", si.UCX.Version, si.UCX.Error)
	default:
		ts := make([]string, len(si.UCX.Transports))
		for i, t := range si.UCX.Transports {
			ts[i] = t.Name
			if len(t.Devices) > 0 {
				ts[i] += " (" + strings.Join(t.Devices, ", ") + ")"
			}
		}
		if len(ts) == 0 {
			ts = []string{"none"}
		}
		fmt.Fprintf(w, "UCX %s transports: %s\n", si.UCX.Version, strings.Join(ts, ", "))
	}
	names := make([]string, len(si.Backends))
	for i, b := range si.Backends {
		names[i] = b.Name
		if b.Memory == "device" && si.usable() != nil {
			names[i] += " (needs a GPU: none usable here)"
		}
	}
	fmt.Fprintf(w, "Backends: %s\n", strings.Join(names, ", "))
	if si.Runtime.SysmonAwake {
		fmt.Fprintf(w, "Go runtime: sysmon kept out of its deep sleep (GODEBUG=%s)\n", si.Runtime.GoDebug)
	} else {
		fmt.Fprintf(w, "Go runtime: sysmon sleeps deeply when idle (%s=deep, or not started as kvxfer): the control round trip pays for it on a CPU-limited host\n", sysmon.OptOut)
	}
	if f := si.Runtime.GCFloorBytes; f > 0 {
		fmt.Fprintf(w, "Go runtime: the collector waits for a heap of %s (%s)\n", config.FormatSize(f), gcfloor.Env)
	} else {
		fmt.Fprintf(w, "Go runtime: the collector's default pacing (GOGC, or %s=off, or not started as kvxfer): a collection every few hundred requests is the control path's tail\n", gcfloor.Env)
	}
	if r := si.Runtime; r.GOMAXPROCS > 0 {
		fmt.Fprintf(w, "Go runtime: GOMAXPROCS %d, %d CPUs usable", r.GOMAXPROCS, r.CPUs)
		if r.GOMAXPROCS > 1 && r.CPUs <= 2 {
			// BENCHMARKS.md, "The shared-vCPU round trip".
			fmt.Fprint(w, ": where both sides share these CPUs, GOMAXPROCS=1 cuts the control round trip and slows the data plane's workers (docs/configuration.md, Small machines)")
		}
		fmt.Fprintln(w)
	}
}

func newInfoCmd() *cobra.Command {
	var asJSON, requireGPU bool
	o := infoOptions{ucxInfo: "ucx_info"}
	cmd := &cobra.Command{
		Use:   "info",
		Short: "Show the GPUs, CUDA driver, UCX transports and data-plane backends of this machine",
		Long: `info lists the GPUs NVML sees (name, memory, PCI bus id, NUMA node, NVLink
links and peers), whether the CUDA driver API loads (libcuda.so.1 or
$KVXFER_LIBCUDA) and how many devices it has, the UCX transports ucx_info
reports, and the data-plane backends compiled into kvxfer. A machine
without an NVIDIA driver or without UCX says so; info itself does not fail.`,
		Example: `  # a table
  kvxfer info
  # the same as JSON
  kvxfer info --json
  # exit non-zero unless a GPU is usable (scripts)
  kvxfer info --require-gpu`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			si := gatherInfo(cmd.Context(), o)
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(si); err != nil {
					return err
				}
			} else {
				si.print(out)
			}
			if requireGPU {
				if err := si.usable(); err != nil {
					return fmt.Errorf("no usable GPU: %w", err)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&requireGPU, "require-gpu", false, "exit non-zero unless NVML lists a GPU and the CUDA driver has a device")
	return cmd
}
