//go:build !cgo || kvxfer_nonvml

package cuda

import "fmt"

// Discover needs cgo and go-nvml; this build has neither (without cgo, or
// with the kvxfer_nonvml tag: libkvxfer.so is built so, since go-nvml's
// unresolved NVML symbols would make the shared library fail to load).
func Discover() (Topology, error) {
	return Topology{}, fmt.Errorf("%w: built without NVML (no cgo, or the kvxfer_nonvml tag): discovery is unavailable", ErrNoDevice)
}
