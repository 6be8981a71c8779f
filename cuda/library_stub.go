//go:build !(linux && cgo)

package cuda

// Without cgo on Linux the driver cannot be loaded: every entry point
// reports ErrNoDevice (through libLoad, which loadDriver calls first), and
// the others are never reached.

const cgoAvailable = false

func libLoad(string) error {
	return loadError("built without cgo on linux: the CUDA driver cannot be loaded")
}

func errorName(int) (string, string) { return "", "" }

func unreachable() error { return ErrNoDevice }

func libInit() error                                 { return unreachable() }
func libDriverVersion() (int, error)                 { return 0, unreachable() }
func libDeviceCount() (int, error)                   { return 0, unreachable() }
func libDeviceGet(int) (int, error)                  { return 0, unreachable() }
func libDeviceName(int) (string, error)              { return "", unreachable() }
func libDeviceTotalMem(int) (uint64, error)          { return 0, unreachable() }
func libDevicePCIBusID(int) (string, error)          { return "", unreachable() }
func libPrimaryCtxRetain(int) (uintptr, error)       { return 0, unreachable() }
func libPrimaryCtxRelease(int) error                 { return unreachable() }
func libMemAlloc(uintptr, uint64) (DevicePtr, error) { return 0, unreachable() }
func libMemFree(uintptr, DevicePtr) error            { return unreachable() }
func libMemAddressRange(uintptr, DevicePtr) (DevicePtr, uint64, error) {
	return 0, 0, unreachable()
}
func libPointerDevice(uintptr, DevicePtr) (int, error)           { return 0, unreachable() }
func libCopyHtoD(uintptr, DevicePtr, []byte) error               { return unreachable() }
func libCopyDtoH(uintptr, []byte, DevicePtr) error               { return unreachable() }
func libCopyDtoD(uintptr, DevicePtr, DevicePtr, uint64) error    { return unreachable() }
func libCopyHtoDAsync(uintptr, DevicePtr, []byte, uintptr) error { return unreachable() }
func libCopyDtoHAsync(uintptr, []byte, DevicePtr, uintptr) error { return unreachable() }
func libCopyDtoDAsync(uintptr, DevicePtr, DevicePtr, uint64, uintptr) error {
	return unreachable()
}
func libMemsetD8Async(uintptr, DevicePtr, byte, uint64, uintptr) error { return unreachable() }
func libCopyDtoDBatch(uintptr, uintptr, []uint64) (int, error)         { return 0, unreachable() }
func libStreamCreate(uintptr, uint) (uintptr, error)                   { return 0, unreachable() }
func libStreamDestroy(uintptr, uintptr) error                          { return unreachable() }
func libStreamSynchronize(uintptr, uintptr) error                      { return unreachable() }
func libStreamQuery(uintptr, uintptr) (bool, error)                    { return false, unreachable() }
func libEventCreate(uintptr, uint) (uintptr, error)                    { return 0, unreachable() }
func libEventDestroy(uintptr, uintptr) error                           { return unreachable() }
func libEventRecord(uintptr, uintptr, uintptr) error                   { return unreachable() }
func libEventQuery(uintptr, uintptr) (bool, error)                     { return false, unreachable() }
func libEventSynchronize(uintptr, uintptr) error                       { return unreachable() }
func libIPCGet(uintptr, DevicePtr) (IPCHandle, error)                  { return IPCHandle{}, unreachable() }
func libIPCOpen(uintptr, IPCHandle, uint) (DevicePtr, error)           { return 0, unreachable() }
func libIPCClose(uintptr, DevicePtr) error                             { return unreachable() }
