package copier

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/kvxfer/kvxfer/kvcache"
)

// BenchmarkRunJob is the copier's own cost per job without the queue and
// the goroutine hand-off (which dominate, and vary with the scheduler): one
// segment, two leases, run on the benchmark's goroutine. own: both regions
// are this process's memory (loopback); peer: the destination and its lease
// lie in a PeerMemory (shm), so the copy and that lease are fault-guarded.
func BenchmarkRunJob(b *testing.B) {
	for _, size := range []int{64, 4 << 10} {
		for _, mode := range []string{"own", "peer"} {
			b.Run(fmt.Sprintf("bytes=%d/%s", size, mode), func(b *testing.B) {
				c := New("bench")
				defer c.Close()
				src := make([]byte, size)
				mem := make([]byte, 64+size) // a lease, then the destination
				ls, ld := new(Lease), (*Lease)(unsafe.Pointer(&mem[0]))
				segs := []kvcache.Segment{{Len: uint64(size)}}
				done := func(err error) {
					if err != nil {
						b.Fatal(err)
					}
				}
				j := Job{Src: src, Dst: mem[64:], Segs: segs, Done: done, Leases: [2]*Lease{ls, ld}}
				if mode == "peer" {
					j.Peer = NewPeerMemory("bench", mem)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					ls.Acquire()
					ld.Acquire()
					job := j
					c.runJob(&job)
				}
			})
		}
	}
}

// BenchmarkCatchFault is what the guard around a backend's header access
// (one per Post, on the caller's goroutine) adds: a lease acquire and
// release, direct and under CatchFault.
func BenchmarkCatchFault(b *testing.B) {
	var l Lease
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			l.Acquire()
			l.Release()
		}
	})
	b.Run("guarded", func(b *testing.B) {
		for b.Loop() {
			CatchFault(func() {
				l.Acquire()
				l.Release()
			})
		}
	})
}
