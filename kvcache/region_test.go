package kvcache

import (
	"errors"
	"strings"
	"testing"
)

// TestNewHostRegionTooLarge: a region no host can hold is an error naming
// its length, not a crash. Checked to fail before the fix: NewHostRegion(1<<50)
// panicked with "makeslice: len out of range" (kvxfer demo --max-tokens
// 99999999999999 crashed that way).
func TestNewHostRegionTooLarge(t *testing.T) {
	for _, n := range []uint64{0, 1<<46 + 1, 1 << 50, 1<<64 - 1} {
		r, err := NewHostRegion(n)
		if !errors.Is(err, ErrBadRegion) || r != nil {
			t.Fatalf("NewHostRegion(%d) = %v, %v; want ErrBadRegion", n, r, err)
		}
		if n > 0 && !strings.Contains(err.Error(), "region length") {
			t.Errorf("NewHostRegion(%d) error %q does not name the length", n, err)
		}
	}
}
