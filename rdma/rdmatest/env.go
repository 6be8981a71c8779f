package rdmatest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// WaitLimit bounds every wait of the suite and of its helpers.
const WaitLimit = 60 * time.Second

// env is one subtest's pair of agents and helpers around it.
type env struct {
	t *testing.T
	p Pair

	strayMu sync.Mutex
	stray   []string // Done calls of refused batches
}

func newEnv(t *testing.T, f Factory) *env {
	t.Helper()
	p := f(t)
	if p.Sender == nil || p.Receiver == nil || p.NewDst == nil {
		t.Fatalf("factory returned an incomplete pair: %+v", p)
	}
	if p.NewSrc == nil {
		p.NewSrc = kvcache.NewHostRegion
	}
	e := &env{t: t, p: p}
	t.Cleanup(e.closeAgents)
	return e
}

func (e *env) closeAgents() {
	if err := e.p.Sender.Close(); err != nil {
		e.t.Errorf("sender Close: %v", err)
	}
	if err := e.p.Receiver.Close(); err != nil {
		e.t.Errorf("receiver Close: %v", err)
	}
}

// side is a registered region and its bytes.
type side struct {
	reg   rdma.Registration
	bytes []byte
}

// src allocates and registers an n-byte source region on the sender, filled
// with a random pattern.
func (e *env) src(n uint64, seed uint64) side {
	e.t.Helper()
	r, err := e.p.NewSrc(n)
	if err != nil {
		e.t.Fatalf("NewSrc(%d): %v", n, err)
	}
	e.t.Cleanup(e.closeAgents) // before the region's release; see dst
	reg, err := e.p.Sender.Register(r)
	if err != nil {
		e.t.Fatalf("sender Register(%d bytes): %v", n, err)
	}
	s := side{reg: reg, bytes: r.Bytes()}
	Pattern(s.bytes, seed)
	return s
}

// dst allocates and registers an n-byte destination region on the
// receiver, filled with a random pattern.
func (e *env) dst(n uint64, seed uint64) side {
	e.t.Helper()
	r, err := e.p.NewDst(n)
	if err != nil {
		e.t.Fatalf("NewDst(%d): %v", n, err)
	}
	// Cleanups run last-in first-out: closing the agents here, after the
	// factory registered the region's release, revokes the registration
	// before the region goes.
	e.t.Cleanup(e.closeAgents)
	reg, err := e.p.Receiver.Register(r)
	if err != nil {
		e.t.Fatalf("receiver Register(%d bytes): %v", n, err)
	}
	s := side{reg: reg, bytes: r.Bytes()}
	Pattern(s.bytes, seed)
	return s
}

// connect opens an endpoint from sender to receiver, closed at cleanup.
func (e *env) connect() rdma.Endpoint {
	e.t.Helper()
	ep, err := e.p.Sender.Connect(e.p.Receiver.Address())
	if err != nil {
		e.t.Fatalf("Connect(%q): %v", e.p.Receiver.Address(), err)
	}
	e.t.Cleanup(func() {
		if err := ep.Close(); err != nil {
			e.t.Errorf("endpoint Close: %v", err)
		}
	})
	return ep
}

// flush flushes ep and waits for its callback's error.
func (e *env) flush(ep rdma.Endpoint) error {
	e.t.Helper()
	ch := make(chan error, 1)
	ep.Flush(func(err error) { ch <- err })
	return Recv(e.t, ch, "Flush callback")
}

// post posts one batch and waits for its outcome.
func (e *env) post(ep rdma.Endpoint, src, dst side, segs []kvcache.Segment) error {
	e.t.Helper()
	ch := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs, Done: func(err error) { ch <- err }}); err != nil {
		e.t.Fatalf("Post(%d segments): %v", len(segs), err)
	}
	return Recv(e.t, ch, "Done")
}

// Recv waits for one value from ch under the suite's deadline, and fails
// t without one.
func Recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(WaitLimit)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("no %s within %v", what, WaitLimit)
		panic("unreachable")
	}
}

// apply copies segs from src into model, as a backend must into dst.
func apply(model, src []byte, segs []kvcache.Segment) {
	for _, s := range segs {
		copy(model[s.Dst:s.Dst+s.Len], src[s.Src:s.Src+s.Len])
	}
}

// diff describes the first difference between got and want, naming the
// segment that covers it.
func diff(got, want []byte, segs []kvcache.Segment) string {
	if bytes.Equal(got, want) {
		return ""
	}
	i := 0
	for i < len(got) && got[i] == want[i] {
		i++
	}
	where := "outside every segment"
	for k, s := range segs {
		if uint64(i) >= s.Dst && uint64(i) < s.Dst+s.Len {
			where = fmt.Sprintf("in segment %d %+v", k, s)
			break
		}
	}
	return fmt.Sprintf("destination differs at byte %d (%s): got %#02x, want %#02x", i, where, got[i], want[i])
}

// tally counts Done calls per batch and keeps their errors.
type tally struct {
	mu    sync.Mutex
	calls []int
	errs  []error
	total int
	all   chan struct{} // closed when every batch completed once
}

func newTally(n int) *tally {
	return &tally{calls: make([]int, n), errs: make([]error, n), all: make(chan struct{})}
}

func (tl *tally) done(i int) func(error) {
	return func(err error) {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		tl.calls[i]++
		tl.errs[i] = err
		if tl.calls[i] == 1 {
			tl.total++
			if tl.total == len(tl.calls) {
				close(tl.all)
			}
		}
	}
}

// exactlyOnce fails t unless every batch completed exactly once.
func (tl *tally) exactlyOnce(t *testing.T) {
	t.Helper()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for i, n := range tl.calls {
		if n != 1 {
			t.Errorf("batch %d: Done called %d times, want exactly once", i, n)
		}
	}
}

func (tl *tally) count() int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.total
}

// mustFail fails t unless err matches target.
func mustFail(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got error %v, want %v", what, err, target)
	}
}

// refused is a Done for batches that Post must refuse: it records the call,
// for noStray to report once the endpoint has been flushed.
func (e *env) refused(what string) func(error) {
	return func(err error) {
		e.strayMu.Lock()
		defer e.strayMu.Unlock()
		e.stray = append(e.stray, fmt.Sprintf("%s: Done(%v)", what, err))
	}
}

// noStray flushes ep (so that any completion posted before has run) and
// fails t if a refused batch's Done was called.
func (e *env) noStray(ep rdma.Endpoint) {
	e.t.Helper()
	if err := e.flush(ep); err != nil {
		e.t.Errorf("Flush: %v", err)
	}
	e.strayMu.Lock()
	defer e.strayMu.Unlock()
	for _, s := range e.stray {
		e.t.Errorf("Done called for a batch Post refused: %s", s)
	}
	e.stray = nil
}
