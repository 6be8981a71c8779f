//go:build linux

package capi

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// mappingOf is the line of /proc/self/maps whose range holds addr, or "".
func mappingOf(t *testing.T, addr uintptr) string {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var lo, hi uintptr
		if _, err := fmt.Sscanf(sc.Text(), "%x-%x", &lo, &hi); err != nil {
			continue
		}
		if lo <= addr && addr < hi {
			return sc.Text()
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ""
}

// TestSmallPoolIsNotGoHeap: the pool of an engine opened through the C
// ABI without a pool of the caller's, however small, is an anonymous
// mapping of its own, not Go heap memory: kvxfer_engine_info_get hands
// pool_base to C, which writes into it after the call returns (cgo's rules
// allow that only for memory Go does not manage; cgocheck cannot see it,
// as it travels as an integer). Checked to fail before the fix: a 64 KiB
// pool lay in the Go heap's mapping, beside a fresh Go allocation.
func TestSmallPoolIsNotGoHeap(t *testing.T) {
	e, _, err := Open(`{"instance":"capi-pool-mapped",`+tinyLayout+`,"workers":1}`, nil, 65536)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Close(5 * time.Second); err != nil {
			t.Error(err)
		}
	}()
	info := e.Info()
	if info.PoolBase == 0 || info.PoolBytes != 65536 {
		t.Fatalf("info %+v: want a pool of 65536 bytes", info)
	}
	heap := make([]byte, 65536) // as the pool was allocated before
	heapAt := uintptr(unsafe.Pointer(&heap[0]))
	pool, inHeap := mappingOf(t, info.PoolBase), mappingOf(t, heapAt)
	runtime.KeepAlive(heap)
	if pool == "" || inHeap == "" {
		t.Fatalf("pool %#x in %q, Go heap %#x in %q: want both mapped", info.PoolBase, pool, heapAt, inHeap)
	}
	if pool == inHeap {
		t.Fatalf("pool %#x lies in the Go heap's mapping %q (a Go allocation is at %#x)", info.PoolBase, pool, heapAt)
	}
	if f := strings.Fields(pool); len(f) != 5 || !strings.HasPrefix(f[1], "rw") {
		t.Fatalf("pool %#x in %q: want an anonymous read-write mapping", info.PoolBase, pool)
	}
	if info.PoolBase%uintptr(os.Getpagesize()) != 0 {
		t.Errorf("pool %#x: not page-aligned", info.PoolBase)
	}
}
