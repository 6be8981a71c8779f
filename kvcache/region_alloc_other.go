//go:build !linux

package kvcache

import "fmt"

func allocHost(n uint64) ([]byte, func() error, error) {
	if n > MaxHostRegion {
		return nil, nil, fmt.Errorf("%w: region length %d: more than %d bytes", ErrBadRegion, n, uint64(MaxHostRegion))
	}
	return make([]byte, n), nil, nil
}
