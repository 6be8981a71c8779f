//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"bufio"
	"fmt"
	"os"
	"testing"
)

// mapped reports whether [base, base+n) lies inside one mapping of this
// process (/proc/self/maps).
func mapped(t *testing.T, base, n uint64) bool {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var lo, hi uint64
		if _, err := fmt.Sscanf(sc.Text(), "%x-%x", &lo, &hi); err == nil && lo <= base && base+n <= hi {
			return true
		}
	}
	return false
}

// TestKeepMemory: an agent told to keep its memory (a node whose close
// could not prove its peers' writes over) leaves what it allocated mapped
// after Close — a late write by address (cma) must not land in memory the
// process has unmapped and may reuse; one not told unmaps it. (Checked to
// fail with KeepMemory ignored: the region was unmapped.)
func TestKeepMemory(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			a, err := New()
			if err != nil {
				t.Skipf("no UCX: %v", err)
			}
			const n = 8 << 20
			r, _, err := a.Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			base := uint64(r.Base)
			if !mapped(t, base, n) {
				t.Fatalf("the allocation at %#x is not mapped", base)
			}
			if keep {
				a.KeepMemory()
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if got := mapped(t, base, n); got != keep {
				t.Fatalf("after Close: mapped=%v, want %v", got, keep)
			}
			if keep {
				r.Bytes()[n-1] = 1 // still ours: writable, no fault
			}
		})
	}
}
