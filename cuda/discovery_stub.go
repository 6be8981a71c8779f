//go:build !cgo

package cuda

import "fmt"

// Discover needs cgo (go-nvml); this build has none.
func Discover() (Topology, error) {
	return Topology{}, fmt.Errorf("%w: built without cgo: NVML cannot be loaded", ErrNoDevice)
}
