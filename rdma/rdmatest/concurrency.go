package rdmatest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// testConcurrentEndpoints: several endpoints, each owned by its own
// goroutine, post into disjoint parts of one destination at once; every part
// lands intact (and the run is race-clean).
func testConcurrentEndpoints(t *testing.T, e *env) {
	const workers, part, batches = 4, 1 << 20, 16
	dst := e.dst(workers*part, 30)
	model := bytes.Clone(dst.bytes)
	srcs := make([]side, workers)
	eps := make([]rdma.Endpoint, workers)
	for w := range workers {
		srcs[w] = e.src(part, uint64(31+w))
		eps[w] = e.connect()
	}

	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			errs[w] = worker(eps[w], srcs[w], dst, model, uint64(w*part), part, batches, uint64(w))
		})
	}
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Errorf("worker %d: %v", w, err)
		}
	}
	if d := diff(dst.bytes, model, nil); d != "" {
		t.Errorf("%s", d)
	}
}

// worker posts batches of random segments into dst[base, base+n) on its own
// endpoint, then flushes; it updates model's part. It must not call t.Fatal.
func worker(ep rdma.Endpoint, src, dst side, model []byte, base, n uint64, batches int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 99))
	var mu sync.Mutex
	var failed []error
	for b := range batches {
		segs := randomSegments(r, uint64(len(src.bytes)), n)
		if len(segs) > 8 {
			segs = segs[:8]
		}
		for i := range segs {
			segs[i].Dst += base
		}
		apply(model, src.bytes, segs)
		err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs, Done: func(err error) {
			if err != nil {
				mu.Lock()
				failed = append(failed, fmt.Errorf("batch %d: %w", b, err))
				mu.Unlock()
			}
		}})
		if err != nil {
			return fmt.Errorf("post batch %d: %w", b, err)
		}
	}
	ch := make(chan error, 1)
	ep.Flush(func(err error) { ch <- err })
	if err := <-ch; err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		return failed[0]
	}
	return nil
}
