package rdmabench

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(PeerEnv); spec != "" { // a peer rig's receiver
		if err := ServePeer(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func backends() []string { return append([]string{Copy}, Backends()...) }

// bench runs b.N operations of shape s on backend.
func bench(b *testing.B, backend string, s Shape) {
	r, err := NewRig(backend, s)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	// Warm up (pages, caches, the copier goroutine), so that a short run
	// such as -benchtime 20x measures the steady state.
	if err := r.Run(16); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(s.Bytes()))
	b.ReportAllocs()
	b.ResetTimer()
	if err := r.Run(b.N); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*s.Segments)/b.Elapsed().Seconds(), "segs/s")
	if err := r.Verify(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPost is Post bandwidth, one segment per batch, per size; the copy
// sub-benchmark is Go's copy of the same bytes in the same run.
func BenchmarkPost(b *testing.B) {
	for _, size := range []uint64{4 << 10, 64 << 10, 1 << 20, 16 << 20} {
		for _, backend := range backends() {
			b.Run(config.FormatSize(size)+"/"+backend, func(b *testing.B) {
				bench(b, backend, Shape{SegmentBytes: size, Segments: 1})
			})
		}
	}
}

// BenchmarkSegments is segments/s for batches of 256 scattered 4 KiB
// segments.
func BenchmarkSegments(b *testing.B) {
	for _, backend := range backends() {
		b.Run("4KiBx256/"+backend, func(b *testing.B) {
			bench(b, backend, Shape{SegmentBytes: 4 << 10, Segments: 256})
		})
	}
}

func TestMeasure(t *testing.T) {
	for _, backend := range backends() {
		res, err := Measure(backend, Shape{SegmentBytes: 64 << 10, Segments: 4}, Config{Rounds: 3, MinBytes: 4 << 20})
		if err != nil {
			t.Fatalf("%s: %v", backend, err)
		}
		if res.BytesPerSec <= 0 || res.CopyBytesPerSec <= 0 || res.Ratio <= 0 || res.Rounds != 3 || res.OpsPerSample != 16 {
			t.Errorf("%s: implausible result %+v", backend, res)
		}
	}
}

func TestNewRigRefuses(t *testing.T) {
	if _, err := NewRig("rdma-over-carrier-pigeon", Shape{SegmentBytes: 1, Segments: 1}); err == nil {
		t.Error("unknown backend accepted")
	}
	if _, err := NewRig(Copy, Shape{SegmentBytes: 0, Segments: 1}); err == nil {
		t.Error("empty shape accepted")
	}
}

func TestWindowFor(t *testing.T) {
	for _, c := range []struct {
		s    Shape
		want int
	}{
		{Shape{SegmentBytes: 4 << 10, Segments: 1}, MaxWindow},
		{Shape{SegmentBytes: 64 << 10, Segments: 1}, 1024},
		{Shape{SegmentBytes: 128 << 10, Segments: 1}, 512},
		{Shape{SegmentBytes: 64 << 10, Segments: 4}, 256},
		{Shape{SegmentBytes: 1 << 20, Segments: 1}, MinWindow},
		{Shape{SegmentBytes: 16 << 20, Segments: 1}, MinWindow},
	} {
		if got := WindowFor(c.s); got != c.want {
			t.Errorf("WindowFor(%d x %d B) = %d, want %d", c.s.Segments, c.s.SegmentBytes, got, c.want)
		}
	}
	r, err := NewRig(Copy, Shape{SegmentBytes: 64 << 10, Segments: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Window() != 1024 {
		t.Errorf("a 64 KiB rig keeps %d in flight, want 1024", r.Window())
	}
}

func TestMedian(t *testing.T) {
	if m := Median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("Median(3,1,2) = %v", m)
	}
	if m := Median(nil); m != 0 {
		t.Errorf("Median(none) = %v", m)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("Median(4,1,3,2) = %v", m)
	}
}

func TestLayoutWritesEachSlotOnce(t *testing.T) {
	for _, k := range []int{1, 2, 7, 14, 256} {
		seen := make(map[uint64]bool)
		for _, s := range layout(Shape{SegmentBytes: 8, Segments: k}) {
			if seen[s.Dst] || s.Dst >= uint64(8*k) {
				t.Fatalf("k=%d: destination %d repeated or out of range", k, s.Dst)
			}
			seen[s.Dst] = true
		}
	}
}

// TestRigUnmapsItsRegion: a rig on the loopback backend allocates its
// destination as a host region (a mapping outside the Go heap) and Close
// unmaps it. Before, nothing closed it: every rig of a bench run left its
// destination mapped for the process's life.
func TestRigUnmapsItsRegion(t *testing.T) {
	r, err := NewRig(loopback.Backend, Shape{SegmentBytes: 64 << 10, Segments: 1})
	if err != nil {
		t.Fatal(err)
	}
	region, ok := r.dstCloser.(*kvcache.Region)
	if !ok {
		t.Fatalf("the loopback rig's destination closer is %T, want its *kvcache.Region", r.dstCloser)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if region.Bytes() != nil {
		t.Fatal("the destination region is still open after the rig's Close")
	}
}

// TestCompletionWakesPosterOnlyAtItsLimit: while the poster waits in
// waitBelow(limit), a completion wakes it only once at most limit
// operations remain. Before, every completion at or below Window()/2 woke
// it, so draining a sample's last half window cost the backend's goroutine
// (which runs Done) a goroutine wake-up, a futex call, per operation, a
// cost the copy baseline does not pay.
func TestCompletionWakesPosterOnlyAtItsLimit(t *testing.T) {
	r, err := newRig(loopback.Backend, Shape{SegmentBytes: 1 << 20, Segments: 1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	for _, limit := range []int64{0, n / 2} {
		r.inflight.Store(n)
		r.waitLimit.Store(limit) // as waitBelow(limit) sets it before parking
		for left := int64(n - 1); left >= 0; left-- {
			r.complete(nil)
			woke := false
			select {
			case <-r.wake:
				woke = true
			default:
			}
			if want := left == limit; woke != want {
				t.Fatalf("waiting for %d in flight: completion leaving %d woke the poster: %v, want %v", limit, left, woke, want)
			}
			if woke {
				r.waitLimit.Store(-1) // as waitBelow does on waking
			}
		}
	}
	r.inflight.Store(1)
	r.complete(nil) // nobody waits
	select {
	case <-r.wake:
		t.Fatal("a completion woke a poster that is not waiting")
	default:
	}
}

// TestRigRotatesOverSlots: a rig of Slots slots on every backend sends
// operation i from slot i%Slots of its source to slot i%Slots of its
// destination, so after Slots operations each slot of the destination
// holds its own slot's source bytes (the source differs from slot to
// slot); and Verify checks every slot written. Checked to fail with every
// operation on slot 0, as a rig without slots posts them.
func TestRigRotatesOverSlots(t *testing.T) {
	const slots = 5
	s := Shape{SegmentBytes: 4 << 10, Segments: 3, Slots: slots}
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			r, err := NewRig(backend, s)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := r.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}()
			if err := r.Run(slots + 2); err != nil { // every slot, two twice
				t.Fatal(err)
			}
			dst := r.dstBytes
			if backend == Copy {
				dst = r.copyDst
			}
			if uint64(len(dst)) != s.SpanBytes() || uint64(len(r.copySrc)) != s.SpanBytes() {
				t.Fatalf("source %d and destination %d bytes, want %d each", len(r.copySrc), len(dst), s.SpanBytes())
			}
			for k := range uint64(slots) {
				off := k * s.Bytes()
				for i, g := range layout(s) {
					if !bytes.Equal(dst[off+g.Dst:off+g.Dst+g.Len], r.copySrc[off+g.Src:off+g.Src+g.Len]) {
						t.Fatalf("slot %d, segment %d: the destination does not hold the slot's source bytes", k, i)
					}
				}
			}
			if err := r.Verify(); err != nil {
				t.Fatal(err)
			}
			dst[3*s.Bytes()+7] ^= 0xff // slot 3's destination
			if err := r.Verify(); err == nil || !strings.Contains(err.Error(), "slot 3,") {
				t.Fatalf("Verify with slot 3 spoiled: %v, want an error naming slot 3", err)
			}
		})
	}
}

// TestRigCopyRotatesOverSlots: Go's copy baseline rotates like the
// backend, so both move the same distinct memory.
func TestRigCopyRotatesOverSlots(t *testing.T) {
	s := Shape{SegmentBytes: 4 << 10, Segments: 2, Slots: 4}
	r, err := NewRig(loopback.Backend, s)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Copy(4)
	for k := range uint64(4) {
		off := k * s.Bytes()
		for _, g := range layout(s) {
			if !bytes.Equal(r.copyDst[off+g.Dst:off+g.Dst+g.Len], r.copySrc[off+g.Src:off+g.Src+g.Len]) {
				t.Fatalf("slot %d: Go's copy did not write it", k)
			}
		}
	}
}

func TestSlotsFor(t *testing.T) {
	for _, c := range []struct {
		s    Shape
		span uint64
		want int
	}{
		{Shape{SegmentBytes: 1 << 20, Segments: 1}, 256 << 20, 256},
		{Shape{SegmentBytes: 16 << 20, Segments: 1}, 256 << 20, 16},
		{Shape{SegmentBytes: 3 << 20, Segments: 1}, 256 << 20, 86}, // rounded up: 258 MiB
		{Shape{SegmentBytes: 1 << 20, Segments: 4}, 1 << 20, 1},
		{Shape{SegmentBytes: 1 << 20, Segments: 1}, 0, 1},
	} {
		if got := SlotsFor(c.s, c.span); got != c.want {
			t.Errorf("SlotsFor(%d x %d B, %d) = %d, want %d", c.s.Segments, c.s.SegmentBytes, c.span, got, c.want)
		}
	}
}

// TestVerifyChecksWhatCameAfterScribble: every operation writes the same
// source bytes to its slot, and a warm-up writes every slot, so a Verify
// of the destination alone passed had later rounds moved nothing (found
// in a review). After Scribble, Verify fails until operations wrote again,
// and checks the slots they wrote, for each backend and the copy baseline.
func TestVerifyChecksWhatCameAfterScribble(t *testing.T) {
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			r, err := NewRig(backend, Shape{SegmentBytes: 4 << 10, Segments: 2, Slots: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			run := func(n int) {
				if backend == Copy {
					r.Copy(n)
				} else if err := r.Run(n); err != nil {
					t.Fatal(err)
				}
			}
			run(8) // every slot written
			if err := r.Verify(); err != nil {
				t.Fatalf("after the warm-up: %v", err)
			}
			r.Scribble()
			if err := r.Verify(); err == nil {
				t.Fatal("Verify passed with the destination scribbled and nothing written since")
			}
			run(1)
			if err := r.Verify(); err != nil {
				t.Fatalf("one operation after the scribble: %v", err)
			}
			run(5)
			if err := r.Verify(); err != nil {
				t.Fatalf("operations past every slot after the scribble: %v", err)
			}
		})
	}
}
