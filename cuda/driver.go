package cuda

import (
	"fmt"
	"os"
	"sync"
)

// LibraryEnv names the environment variable that overrides the driver
// library's path (default DefaultLibrary, found through the dynamic
// loader's search path). Tests point it at a fake driver.
const LibraryEnv = "KVXFER_LIBCUDA"

// DefaultLibrary is the CUDA driver library's soname.
const DefaultLibrary = "libcuda.so.1"

// LibraryPath is the driver library Init loads: $KVXFER_LIBCUDA, else
// libcuda.so.1.
func LibraryPath() string {
	if p := os.Getenv(LibraryEnv); p != "" {
		return p
	}
	return DefaultLibrary
}

// driver is the process's one attempt to load and initialise the driver.
var driver struct {
	mu    sync.Mutex
	tried bool
	path  string
	err   error
}

// Init loads the driver library (LibraryPath) with dlopen and calls
// cuInit, once per process; later calls return the first outcome. Without
// a library, without a device or with too old a driver it returns an error
// wrapping ErrNoDevice that says why, and nothing else in the package
// works; nothing panics. Every other entry point calls Init itself.
func Init() error {
	driver.mu.Lock()
	defer driver.mu.Unlock()
	if driver.tried {
		return driver.err
	}
	driver.tried = true
	driver.path = LibraryPath()
	driver.err = initDriver(driver.path)
	return driver.err
}

// initDriver loads the library at path and initialises it. A failed load
// leaves nothing loaded.
func initDriver(path string) error {
	if err := libLoad(path); err != nil {
		todo := fmt.Sprintf("install the NVIDIA driver, or set $%s to the path of its %s", LibraryEnv, DefaultLibrary)
		if !cgoAvailable {
			todo = "build kvxfer for linux with cgo (CGO_ENABLED=1)"
		}
		return fmt.Errorf("%w: no CUDA driver: %v: %s", ErrNoDevice, err, todo)
	}
	if err := libInit(); err != nil {
		return fmt.Errorf("%w: %s loaded but %w: check that a GPU is visible to this process (nvidia-smi; $CUDA_VISIBLE_DEVICES) and the driver is recent enough",
			ErrNoDevice, path, err)
	}
	return nil
}

// DriverVersion returns the driver's CUDA version as 1000×major +
// 10×minor (12040 is 12.4).
func DriverVersion() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	return libDriverVersion()
}

// DeviceCount returns the number of CUDA devices; with no usable driver it
// returns 0 and an error wrapping ErrNoDevice.
func DeviceCount() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	return libDeviceCount()
}
