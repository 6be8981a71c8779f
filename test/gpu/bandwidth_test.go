package gpu_test

import (
	"fmt"
	"testing"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// BenchmarkDtoD measures device-to-device bandwidth at each size: "raw" is
// b.N cuMemcpyDtoDAsync on one stream then one synchronisation; "cudaipc"
// is b.N batches of one segment posted on a cudaipc endpoint then one
// Flush — the same copies, plus the backend's checks, leases, events and
// polled completions. Both agents live in this process (one GPU: an IPC
// mapping of the same device's memory copies at the same speed).
// gpu-check.sh prints cudaipc/raw per size.
func BenchmarkDtoD(b *testing.B) {
	for _, size := range []uint64{1 << 20, 16 << 20, 256 << 20} {
		b.Run(fmt.Sprintf("size=%dMiB", size>>20), func(b *testing.B) {
			b.Run("raw", func(b *testing.B) { benchRaw(b, size) })
			b.Run("cudaipc", func(b *testing.B) { benchCudaIPC(b, size) })
		})
	}
}

// pair allocates a source and a destination of n bytes on d, freed at
// cleanup.
func pair(b *testing.B, d *cuda.Device, n uint64) (src, dst *cuda.Memory) {
	b.Helper()
	for _, p := range []**cuda.Memory{&src, &dst} {
		m, err := d.Alloc(n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Free() })
		*p = m
	}
	return src, dst
}

func benchRaw(b *testing.B, n uint64) {
	d := gpu(b)
	src, dst := pair(b, d, n)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.SetBytes(int64(n))
	b.ResetTimer()
	for range b.N {
		if err := s.CopyDtoD(dst.Ptr(), src.Ptr(), n); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

func benchCudaIPC(b *testing.B, n uint64) {
	d := gpu(b)
	srcMem, dstMem := pair(b, d, n)
	sa, err := cudaipc.New()
	if err != nil {
		b.Fatal(err)
	}
	defer sa.Close()
	ra, err := cudaipc.New()
	if err != nil {
		b.Fatal(err)
	}
	defer ra.Close()
	reg := func(a *cudaipc.Agent, m *cuda.Memory) rdma.Registration {
		r, err := m.Region()
		if err != nil {
			b.Fatal(err)
		}
		g, err := a.Register(r)
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	src, dst := reg(sa, srcMem), reg(ra, dstMem)
	ep, err := sa.Connect(ra.Address())
	if err != nil {
		b.Fatal(err)
	}
	defer ep.Close()
	segs := []kvcache.Segment{{Src: 0, Dst: 0, Len: n}}
	failed := make(chan error, 1)
	done := func(err error) {
		if err != nil {
			select {
			case failed <- err:
			default:
			}
		}
	}
	b.SetBytes(int64(n))
	b.ResetTimer()
	for range b.N {
		if err := ep.Post(rdma.Batch{Src: src, Dst: dst.Remote(), Segments: segs, Done: done}); err != nil {
			b.Fatal(err)
		}
	}
	flushed := make(chan error, 1)
	ep.Flush(func(err error) { flushed <- err })
	if err := <-flushed; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	select {
	case err := <-failed:
		b.Fatal(err)
	default:
	}
}

// BenchmarkEventQuery measures one cuEventQuery on a completed event: the
// poller's cost per outstanding wait and pass (package cuda's doc).
func BenchmarkEventQuery(b *testing.B) {
	d := gpu(b)
	ev, err := d.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	defer ev.Close()
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Record(ev); err != nil {
		b.Fatal(err)
	}
	if err := ev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if done, err := ev.Query(); !done || err != nil {
			b.Fatalf("Query = %v, %v", done, err)
		}
	}
}
