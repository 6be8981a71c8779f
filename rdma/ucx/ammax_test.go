//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"testing"
	"unsafe"
)

// TestOversizedControlMessageIsDropped: a control message comes from any
// process that can reach the agent's UCP worker, before anything in it is
// checked. One of 2 GiB or more was copied with C.GoBytes, whose length
// is a C int: the conversion went negative and GoBytes panicked on the
// progress goroutine, killing the process (or, past 4 GiB, it read a
// prefix). It is dropped, as any other malformed message, and its C copy
// freed. (The event is made here rather than sent: a real one would cost
// the test several GiB.)
func TestOversizedControlMessageIsDropped(t *testing.T) {
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, n := range []uint64{1 << 31, 1<<32 - 1, maxMessage + 1} {
		var dropped int
		a.w.do(func() {
			before := a.w.dropped
			ev := &a.w.c.out[0] // the poll's scratch: free between polls
			ev.kind = 4         // KVX_EV_AM
			ev.status, ev.id = 0, 0
			ev.data = nil // C.free(NULL) does nothing
			*(*uint64)(unsafe.Pointer(&ev.len)) = n
			a.w.event(ev)
			dropped = a.w.dropped - before
		})
		if dropped != 1 {
			t.Errorf("control message of %d bytes: %d dropped, want 1", n, dropped)
		}
	}
}
