package shm_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// benchBlock is a KV block of the benchmarks: 2 MiB.
const benchBlock = 2 << 20

// BenchmarkRevoke measures what revocation costs per request: Revoke of the
// request's blocks (remap of spare file blocks over them), Translate of one
// destination segment per block (the offsets the next writer is sent), and
// ReleaseRevoked once proof came. A request is 1, 8 or 128 blocks of 2 MiB.
//
//   - cold: the view's pages of the range were never touched since the last
//     remap (no page-table entries to tear down);
//   - touched: every page of the range was written (faulted in) before the
//     revoke, as a block that received a transfer is; the new pages are
//     faulted in by their first touch later, not here;
//   - touched-populate: as touched, with RevocableOptions.Populate: the
//     revoke faults the new pages in, so it includes what the first touch
//     would cost;
//   - memcpy: for scale, one copy of the request's bytes between two
//     faulted-in buffers (what one transfer of the request costs the CPU).
//
// µs/request is the timed cost per iteration; the touching is not timed.
func BenchmarkRevoke(b *testing.B) {
	page := os.Getpagesize()
	for _, blocks := range []int{1, 8, 128} {
		n := uint64(blocks) * benchBlock
		segs := make([]kvcache.Segment, blocks)
		for i := range segs {
			segs[i] = kvcache.Segment{Src: uint64(i) * benchBlock, Dst: uint64(i) * benchBlock, Len: benchBlock}
		}
		for _, mode := range []string{"cold", "touched", "touched-populate"} {
			b.Run(fmt.Sprintf("blocks=%d/%s", blocks, mode), func(b *testing.B) {
				r, err := shm.NewRevocableRegion(n, shm.RevocableOptions{Block: benchBlock, Spare: n, Populate: mode == "touched-populate"})
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close()
				view := r.Region().Bytes()
				touch := mode != "cold"
				// The file was mapped populated: one revoke first, so
				// that cold starts with no page of the range faulted in.
				v, err := r.Revoke(0, n)
				if err != nil {
					b.Fatal(err)
				}
				if err := r.ReleaseRevoked(v); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(n))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if touch {
						b.StopTimer()
						for p := 0; p < len(view); p += page {
							view[p] = byte(i)
						}
						b.StartTimer()
					}
					v, err := r.Revoke(0, n)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := r.Translate(segs); err != nil {
						b.Fatal(err)
					}
					if err := r.ReleaseRevoked(v); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "µs/request")
			})
		}
		b.Run(fmt.Sprintf("blocks=%d/memcpy", blocks), func(b *testing.B) {
			src, dst := make([]byte, n), make([]byte, n)
			for p := 0; p < len(src); p += page {
				src[p], dst[p] = 1, 1
			}
			b.SetBytes(int64(n))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "µs/request")
		})
	}
}

// BenchmarkRevokerRemap: what a generation engine on a revocable pool pays
// per request to name its moved runs (RequestData.Remap): Remap over a
// 256 MiB request (65,536 pages) of a 1 GiB pool, with nothing revoked and
// with 16 scattered 2 MiB blocks revoked.
func BenchmarkRevokerRemap(b *testing.B) {
	page := uint64(os.Getpagesize())
	const pool, req = 1 << 30, 256 << 20
	for _, revoked := range []int{0, 16} {
		b.Run(fmt.Sprintf("revoked=%d", revoked), func(b *testing.B) {
			rr, err := shm.NewRevocableRegion(pool, shm.RevocableOptions{Block: page, Spare: 64 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer rr.Close()
			rv := rr.Revoker()
			for i := range revoked {
				if _, err := rv.Revoke(uint64(i)*(pool/16), 2<<20); err != nil {
					b.Fatal(err)
				}
			}
			var xs []kvcache.Extent
			for b.Loop() {
				xs = rv.Remap(xs[:0], 0, req)
			}
			b.ReportMetric(float64(len(xs)), "extents")
		})
	}
}
