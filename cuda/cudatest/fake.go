// Package cudatest helps test code that uses package cuda on machines
// without a GPU: BuildFake compiles a fake CUDA driver library, a
// libcuda.so.1 stand-in (csrc/fakecuda.c) that implements the driver entry
// points package cuda uses on host memory — shared memfd mappings as device
// memory (so IPC handles open across processes, through /proc), one thread
// per stream, events completed in stream order. Point cuda.LibraryEnv
// ($KVXFER_LIBCUDA) at the built library before the process's first cuda
// call. It tests kvxfer's use of the driver API, not a GPU: the real
// driver's checks run in make gpu-check.
//
// Environment the library reads at cuInit: FAKECUDA_DEVICES (device count,
// default 1; 0 makes cuInit fail with CUDA_ERROR_NO_DEVICE) and
// FAKECUDA_COPY_DELAY_US (a delay before every stream copy, to keep events
// pending).
package cudatest

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed csrc/fakecuda.c
var source []byte

// BuildFake compiles the fake driver into dir and returns the library's path.
// It needs a C compiler ($CC, else cc); without one it returns an error
// that says so.
func BuildFake(dir string) (string, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	args := strings.Fields(cc)
	if _, err := exec.LookPath(args[0]); err != nil {
		return "", fmt.Errorf("cudatest: no C compiler: %w", err)
	}
	src := filepath.Join(dir, "fakecuda.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libcuda.so.1")
	args = append(args, "-shared", "-fPIC", "-O2", "-Wall", "-o", lib, src, "-lpthread")
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cudatest: %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return lib, nil
}
