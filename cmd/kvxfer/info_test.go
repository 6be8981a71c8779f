package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// runInfo runs `kvxfer info args...` and returns its standard output.
func runInfo(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"info"}, args...))
	err := root.Execute()
	return out.String(), err
}

// infoJSON runs `kvxfer info --json` and decodes it.
func infoJSON(t *testing.T) (systemInfo, string) {
	t.Helper()
	out, err := runInfo(t, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var si systemInfo
	if err := json.Unmarshal([]byte(out), &si); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	return si, out
}

// TestInfoTable: the table names the GPUs or why there are none, the CUDA
// driver, UCX and the backends.
func TestInfoTable(t *testing.T) {
	out, err := runInfo(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kvxfer info:\n%s", out)
	backendsLine := "Backends: loopback, shm, cudaipc"
	if ucx.Available {
		backendsLine = "Backends: loopback, shm, ucx, cudaipc"
	}
	for _, want := range []string{"GPUs: ", "CUDA driver: ", "UCX", backendsLine} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.HasPrefix(out, "GPUs: none") && !strings.Contains(out, "GPUs: none (") {
		t.Errorf("no GPU, and no reason given:\n%s", out)
	}
}

// TestInfoJSON: --json carries the same, and a machine without GPUs says
// why.
func TestInfoJSON(t *testing.T) {
	si, out := infoJSON(t)
	if si.GPUs == nil || si.UCX.Transports == nil {
		t.Errorf("gpus / transports must be arrays, not null:\n%s", out)
	}
	if len(si.GPUs) == 0 && si.GPUError == "" {
		t.Errorf("no GPU and no gpu_error:\n%s", out)
	}
	if si.CUDA.Library == "" || (si.CUDA.Error == "") == (si.CUDA.Version == "") {
		t.Errorf("cuda: %+v: want a version or an error", si.CUDA)
	}
	var names []string
	for _, b := range si.Backends {
		names = append(names, b.Name)
	}
	for _, want := range []string{"loopback", "shm", "cudaipc", "faulty"} {
		if !slices.Contains(names, want) {
			t.Errorf("backend %q missing from %v", want, names)
		}
	}
	if slices.Contains(names, "ucx") != ucx.Available {
		t.Errorf("backends %v: ucx listed %v, built in %v", names, slices.Contains(names, "ucx"), ucx.Available)
	}
}

// TestInfoRuntimeLine: the table and --json say GOMAXPROCS and the CPUs
// usable, and a machine of two CPUs or fewer with GOMAXPROCS above 1 is
// told where GOMAXPROCS=1 helps; one with more CPUs is not.
func TestInfoRuntimeLine(t *testing.T) {
	for _, c := range []struct {
		procs, cpus int
		hint        bool
	}{{2, 2, true}, {1, 2, false}, {8, 8, false}} {
		var b bytes.Buffer
		systemInfo{Runtime: runtimeInfo{GOMAXPROCS: c.procs, CPUs: c.cpus}}.print(&b)
		want := fmt.Sprintf("Go runtime: GOMAXPROCS %d, %d CPUs usable", c.procs, c.cpus)
		if !strings.Contains(b.String(), want) {
			t.Errorf("GOMAXPROCS %d, %d CPUs: no %q in:\n%s", c.procs, c.cpus, want, b.String())
		}
		if got := strings.Contains(b.String(), "Small machines"); got != c.hint {
			t.Errorf("GOMAXPROCS %d, %d CPUs: hint %v, want %v:\n%s", c.procs, c.cpus, got, c.hint, b.String())
		}
	}
	si, _ := infoJSON(t)
	if si.Runtime.GOMAXPROCS != runtime.GOMAXPROCS(0) || si.Runtime.CPUs != runtime.NumCPU() {
		t.Errorf("runtime %+v: want gomaxprocs %d, cpus %d", si.Runtime, runtime.GOMAXPROCS(0), runtime.NumCPU())
	}
}

// TestInfoRequireGPU: --require-gpu fails, saying why, where no GPU is
// usable, and passes where one is.
func TestInfoRequireGPU(t *testing.T) {
	_, err := runInfo(t, "--require-gpu")
	_, cerr := cuda.DeviceCount()
	switch {
	case cerr != nil && err == nil:
		t.Errorf("--require-gpu passed with no CUDA device (%v)", cerr)
	case err != nil && !strings.Contains(err.Error(), "no usable GPU"):
		t.Errorf("--require-gpu: %v", err)
	}
	t.Logf("--require-gpu: %v", err)
}

func TestInfoUCXParse(t *testing.T) {
	const out = `#
# Memory domain: self
#     Component: self
#      Transport: self
#         Device: memory0
#           Type: loopback
#
# Memory domain: tcp
#      Transport: tcp
#         Device: lo
#      Transport: tcp
#         Device: eth0
# Memory domain: cuda_ipc
#      Transport: cuda_ipc
#         Device: cuda
#   < failed to open interface >
`
	got := parseUCXTransports(out)
	want := []ucxTransport{{"self", []string{"memory0"}}, {"tcp", []string{"lo", "eth0"}}, {"cuda_ipc", []string{"cuda"}}}
	if len(got) != len(want) {
		t.Fatalf("transports %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Name != want[i].Name || !slices.Equal(got[i].Devices, want[i].Devices) {
			t.Errorf("transport %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if v := parseUCXVersion("# Version 1.13.1\n# Git branch '<unknown>'\n"); v != "1.13.1" {
		t.Errorf("version %q", v)
	}
	if v := parseUCXVersion("# UCT version=1.10.0 revision 7477e81\n"); v != "1.10.0" {
		t.Errorf("old-style version %q", v)
	}
	if got := parseUCXTransports(""); got == nil || len(got) != 0 {
		t.Errorf("no output: %v", got)
	}
}

// TestInfoUCXMissing: without ucx_info, info says UCX was not found.
func TestInfoUCXMissing(t *testing.T) {
	u := probeUCX(context.Background(), "kvxfer-test-no-such-ucx_info")
	if u.Found || !strings.Contains(u.Error, "not found") {
		t.Fatalf("probe of a missing ucx_info: %+v", u)
	}
	var b bytes.Buffer
	systemInfo{UCX: u, GPUError: "no NVIDIA driver"}.print(&b)
	if !strings.Contains(b.String(), "UCX: not found (kvxfer-test-no-such-ucx_info not found)") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestInfoPrintGPUs: the GPU table's columns.
func TestInfoPrintGPUs(t *testing.T) {
	si := systemInfo{
		DriverVersion: "550.54.15",
		GPUs: []cuda.GPU{
			{Index: 0, Name: "NVIDIA H200", MemoryBytes: 141 << 30, PCIBusID: "00000000:19:00.0", NUMANode: 0, NVLinks: 18, NVLinkPeers: []int{1}},
			{Index: 1, Name: "NVIDIA H200", MemoryBytes: 141 << 30, PCIBusID: "00000000:3B:00.0", NUMANode: -1, NVLinkPeers: []int{}},
		},
		CUDA:     cudaInfo{Library: "libcuda.so.1", Version: "12.4", Devices: 2},
		UCX:      ucxInfo{Found: true, Version: "1.13.1", Transports: []ucxTransport{{"cuda_ipc", []string{"cuda"}}}},
		Backends: backends,
	}
	var b bytes.Buffer
	si.print(&b)
	out := b.String()
	for _, want := range []string{
		"GPUs: 2 (NVIDIA driver 550.54.15)",
		"GPU  NAME         MEMORY     PCI BUS ID        NUMA  NVLINKS  NVLINK PEERS",
		"0    NVIDIA H200  141.0 GiB  00000000:19:00.0  0     18       1",
		"1    NVIDIA H200  141.0 GiB  00000000:3B:00.0  -     0        -",
		"CUDA driver: 12.4 (libcuda.so.1), 2 devices",
		"UCX 1.13.1 transports: cuda_ipc (cuda)",
		"Backends: loopback, shm, ",
		"cudaipc, faulty",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if si.usable() != nil {
		t.Errorf("usable() = %v with two GPUs", si.usable())
	}
}
