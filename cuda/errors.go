package cuda

import (
	"errors"
	"fmt"
)

// Sentinel errors of the cuda package.
var (
	// ErrNoDevice: no usable GPU — the driver library is missing, the
	// driver is too old, cuInit found no device, or the ordinal does not
	// exist. The error wrapping it says which.
	ErrNoDevice = errors.New("cuda: no device")
	// ErrClosed: the device, stream, event, memory or queue was closed.
	ErrClosed = errors.New("cuda: closed")
	// ErrBadHandle: a handle the caller passed is not usable (a zero
	// CUevent, a negative device ordinal).
	ErrBadHandle = errors.New("cuda: bad handle")
)

// Error is a CUDA driver call that failed: the call, the driver's result
// code and its name. It matches ErrNoDevice for the codes that mean no
// usable device.
type Error struct {
	// Op is the driver function, e.g. "cuMemAlloc".
	Op string
	// Code is the CUresult.
	Code int
	// Name and Desc are the driver's name and description of Code
	// (empty when the driver does not know it).
	Name, Desc string
}

// Driver result codes the package interprets.
const (
	codeNoDevice           = 100 // CUDA_ERROR_NO_DEVICE
	codeInvalidDevice      = 101 // CUDA_ERROR_INVALID_DEVICE
	codeInsufficientDriver = 35  // CUDA_ERROR_INSUFFICIENT_DRIVER
	codeSystemNotReady     = 802 // CUDA_ERROR_SYSTEM_NOT_READY
	codeDriverMismatch     = 803 // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
)

func newError(op string, code int) *Error {
	name, desc := errorName(code)
	return &Error{Op: op, Code: code, Name: name, Desc: desc}
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = "CUresult"
	}
	if e.Desc != "" {
		return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Op, name, e.Code, e.Desc)
	}
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, name, e.Code)
}

// Is reports whether e means no usable device.
func (e *Error) Is(target error) bool {
	if target != ErrNoDevice {
		return false
	}
	switch e.Code {
	case codeNoDevice, codeInvalidDevice, codeInsufficientDriver, codeSystemNotReady, codeDriverMismatch:
		return true
	}
	return false
}

// loadError is why the driver library could not be loaded.
func loadError(why string) error { return errors.New(why) }
