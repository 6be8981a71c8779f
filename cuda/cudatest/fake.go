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
	"testing"
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

// RunOnFake re-runs this test binary's tests matching run (a -test.run
// pattern) in a child process on a fake driver built for it, with env
// added to this process's environment, and returns the child's combined
// output and its exit error. libraryEnv is package cuda's LibraryEnv (this
// package cannot import cuda, whose tests import it). It skips t when the
// fake cannot be built (no C compiler).
func RunOnFake(t testing.TB, libraryEnv, run string, env ...string) (string, error) {
	t.Helper()
	lib, err := BuildFake(t.TempDir())
	if err != nil {
		t.Skipf("no fake driver: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), libraryEnv+"="+lib), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
