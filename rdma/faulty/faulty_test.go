package faulty_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance: with no faults, a faulty agent is a conforming backend.
func TestConformance(t *testing.T) {
	rdmatest.Run(t, func(t *testing.T) rdmatest.Pair {
		n := loopback.NewNetwork()
		return rdmatest.Pair{
			Sender:   faulty.New(loopback.New(loopback.WithNetwork(n))),
			Receiver: faulty.New(loopback.New(loopback.WithNetwork(n))),
			NewDst:   kvcache.NewHostRegion,
		}
	})
}

const waitLimit = 30 * time.Second

// rig is a faulty sender, a plain loopback receiver, one endpoint, and a
// source and destination of n bytes; dst starts zeroed, src patterned.
type rig struct {
	t        *testing.T
	sender   *faulty.Agent
	receiver rdma.Agent
	ep       rdma.Endpoint
	src, dst rdma.Registration
	srcBytes []byte
	dstBytes []byte
}

func newRig(t *testing.T, n uint64, opts ...faulty.Option) *rig {
	t.Helper()
	net := loopback.NewNetwork()
	r := &rig{t: t, sender: faulty.New(loopback.New(loopback.WithNetwork(net)), opts...), receiver: loopback.New(loopback.WithNetwork(net))}
	t.Cleanup(func() {
		r.sender.Close()
		r.receiver.Close()
	})
	sr, _ := kvcache.NewHostRegion(n)
	dr, _ := kvcache.NewHostRegion(n)
	var err error
	if r.src, err = r.sender.Register(sr); err != nil {
		t.Fatal(err)
	}
	if r.dst, err = r.receiver.Register(dr); err != nil {
		t.Fatal(err)
	}
	r.srcBytes, r.dstBytes = sr.Bytes(), dr.Bytes()
	for i := range r.srcBytes {
		r.srcBytes[i] = byte(i%251) + 1
	}
	if r.ep, err = r.sender.Connect(r.receiver.Address()); err != nil {
		t.Fatal(err)
	}
	return r
}

// log records outcomes in delivery order.
type log struct {
	mu  sync.Mutex
	got []string
	ch  chan string
}

func newLog() *log { return &log{ch: make(chan string, 64)} }

func (l *log) done(name string) func(error) {
	return func(err error) {
		s := name + ":" + outcome(err)
		l.mu.Lock()
		l.got = append(l.got, s)
		l.mu.Unlock()
		l.ch <- s
	}
}

func (l *log) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-l.ch:
		return s
	case <-time.After(waitLimit):
		t.Fatalf("no completion within %v", waitLimit)
		return ""
	}
}

// none fails t if a completion is already waiting.
func (l *log) none(t *testing.T, when string) {
	t.Helper()
	select {
	case s := <-l.ch:
		t.Fatalf("%s: unexpected completion %s", when, s)
	default:
	}
}

func (l *log) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, rdma.ErrInjected):
		return "injected"
	case errors.Is(err, rdma.ErrEndpointClosed):
		return "closed"
	case errors.Is(err, rdma.ErrPeerGone):
		return "peer-gone"
	}
	return err.Error()
}

// seg is segment i: 1 KiB at offset i KiB on both sides.
func seg(i int) kvcache.Segment {
	return kvcache.Segment{Src: uint64(i) << 10, Dst: uint64(i) << 10, Len: 1 << 10}
}

func (r *rig) post(name string, l *log, segs ...kvcache.Segment) error {
	return r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: segs, Done: l.done(name)})
}

func (r *rig) landed(s kvcache.Segment) bool {
	return bytes.Equal(r.dstBytes[s.Dst:s.Dst+s.Len], r.srcBytes[s.Src:s.Src+s.Len])
}

func (r *rig) untouched(s kvcache.Segment) bool {
	return bytes.Equal(r.dstBytes[s.Dst:s.Dst+s.Len], make([]byte, s.Len))
}

func (r *rig) flush(l *log) { r.ep.Flush(l.done("flush")) }

func TestFailNth(t *testing.T) {
	r := newRig(t, 64<<10, faulty.Fail(faulty.Nth(1, 3)))
	l := newLog()
	for i := range 5 {
		if err := r.post(fmt.Sprint(i), l, seg(i)); err != nil {
			t.Fatalf("Post %d: %v", i, err)
		}
	}
	r.flush(l)
	for range 6 {
		l.next(t)
	}
	want := []string{"0:ok", "1:injected", "2:ok", "3:injected", "4:ok", "flush:ok"}
	if got := l.all(); !slices.Equal(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	for i := range 5 {
		if failed := i == 1 || i == 3; failed != r.untouched(seg(i)) || !failed != r.landed(seg(i)) {
			t.Errorf("batch %d: landed %v, want %v", i, r.landed(seg(i)), !failed)
		}
	}
}

func TestFailNamesTheSegment(t *testing.T) {
	r := newRig(t, 64<<10, faulty.Fail(faulty.Always()))
	errs := make(chan error, 1)
	if err := r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: []kvcache.Segment{seg(4), seg(5)}, Done: func(err error) { errs <- err }}); err != nil {
		t.Fatal(err)
	}
	err := <-errs
	var se *rdma.SegmentError
	if !errors.As(err, &se) || se.Index != 0 || se.Segment != seg(4) || !errors.Is(err, rdma.ErrInjected) {
		t.Errorf("Done(%v), want a *SegmentError naming segment 0 %+v wrapping ErrInjected", err, seg(4))
	}
}

// TestRateIsDeterministic: one seed gives one sequence of failures; another
// seed another.
func TestRateIsDeterministic(t *testing.T) {
	run := func(seed uint64) []string {
		r := newRig(t, 64<<10, faulty.WithSeed(seed), faulty.Fail(faulty.Rate(0.3)))
		l := newLog()
		for i := range 40 {
			if err := r.post(fmt.Sprint(i), l, seg(i%64)); err != nil {
				t.Fatal(err)
			}
			l.next(t)
		}
		return l.all()
	}
	a, b, c := run(1), run(1), run(2)
	if !slices.Equal(a, b) {
		t.Errorf("seed 1 twice gave different failures:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 1 and 2 gave the same failures: %v", a)
	}
	if n := countOf(a, "injected"); n < 4 || n > 24 {
		t.Errorf("rate 0.3 failed %d of 40 batches", n)
	}
}

func countOf(outcomes []string, what string) int {
	n := 0
	for _, s := range outcomes {
		if bytes.HasSuffix([]byte(s), []byte(":"+what)) {
			n++
		}
	}
	return n
}

// TestPartial: the prefix lands, the rest does not, and the error names the
// first segment that did not.
func TestPartial(t *testing.T) {
	r := newRig(t, 64<<10, faulty.Partial(faulty.Nth(0), 2))
	segs := []kvcache.Segment{seg(0), seg(1), seg(2), seg(3)}
	errs := make(chan error, 1)
	if err := r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: segs, Done: func(err error) { errs <- err }}); err != nil {
		t.Fatal(err)
	}
	err := <-errs
	var se *rdma.SegmentError
	if !errors.As(err, &se) || se.Index != 2 || se.Segment != seg(2) || !errors.Is(err, rdma.ErrInjected) {
		t.Fatalf("Done(%v), want a *SegmentError naming segment 2 wrapping ErrInjected", err)
	}
	for i, s := range segs {
		if want := i < 2; r.landed(s) != want || r.untouched(s) == want {
			t.Errorf("segment %d: landed %v, want %v", i, r.landed(s), want)
		}
	}
}

// TestPartialEmptyBatch: Partial on a batch with no segment fails it as
// Fail does, with no segment named. (Checked to fail without the guard:
// Post panicked slicing the segments at -1.)
func TestPartialEmptyBatch(t *testing.T) {
	r := newRig(t, 4096, faulty.Partial(faulty.Always(), 1))
	errs := make(chan error, 1)
	if err := r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Done: func(err error) { errs <- err }}); err != nil {
		t.Fatal(err)
	}
	var se *rdma.SegmentError
	if err := <-errs; !errors.Is(err, rdma.ErrInjected) || errors.As(err, &se) {
		t.Fatalf("Done(%v), want ErrInjected naming no segment", err)
	}
}

// TestHang: the hung batch holds back every later completion and Flush until
// Close, which completes it with ErrEndpointClosed; meanwhile its regions
// are busy.
func TestHang(t *testing.T) {
	r := newRig(t, 64<<10, faulty.Hang(faulty.Nth(1)))
	l := newLog()
	for i := range 3 {
		if err := r.post(fmt.Sprint(i), l, seg(i)); err != nil {
			t.Fatal(err)
		}
	}
	r.flush(l)
	if got := l.next(t); got != "0:ok" {
		t.Fatalf("first completion %s, want 0:ok", got)
	}
	if err := r.sender.Deregister(r.src); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Errorf("Deregister of a hung batch's source: %v, want ErrRegionBusy", err)
	}
	if err := r.sender.Deregister(r.dst); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Errorf("Deregister (through a faulty agent) of a hung batch's destination: %v, want ErrRegionBusy", err)
	}
	l.none(t, "before Close")
	if err := r.ep.Close(); err != nil {
		t.Fatal(err)
	}
	// Batch 2 is delivered after the hung batch 1, with the outcome the
	// wrapped endpoint gave it (ok, or closed if Close caught it first); the
	// Flush, queued behind both, only at Close.
	got := l.all()
	if !slices.Equal(got, []string{"0:ok", "1:closed", "2:ok", "flush:closed"}) &&
		!slices.Equal(got, []string{"0:ok", "1:closed", "2:closed", "flush:closed"}) {
		t.Errorf("outcomes %v, want [0:ok 1:closed 2:ok|closed flush:closed]", got)
	}
	if err := r.sender.Deregister(r.src); err != nil {
		t.Errorf("Deregister after Close: %v", err)
	}
}

// TestDelay: Done arrives only when the manual clock reaches the delay.
func TestDelay(t *testing.T) {
	clk := faulty.NewManualClock()
	r := newRig(t, 64<<10, faulty.WithClock(clk), faulty.Delay(faulty.Nth(0), 5*time.Second))
	l := newLog()
	if err := r.post("0", l, seg(0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the delay's timer to start", func() bool { return clk.Pending() == 1 })
	clk.Advance(4 * time.Second)
	l.none(t, "4s into a 5s delay")
	if !r.landed(seg(0)) {
		t.Errorf("the delayed batch's data has not landed: delay holds the completion, not the write")
	}
	clk.Advance(time.Second)
	if got := l.next(t); got != "0:ok" {
		t.Errorf("completion %s, want 0:ok", got)
	}
}

// TestSlow: Done waits for the gate; later batches wait behind it.
func TestSlow(t *testing.T) {
	g := faulty.NewGate()
	r := newRig(t, 64<<10, faulty.Slow(faulty.Nth(0), g))
	l := newLog()
	for i := range 2 {
		if err := r.post(fmt.Sprint(i), l, seg(i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "batch 0 to reach the gate", func() bool { return g.Held() == 1 })
	l.none(t, "before the gate opened")
	g.Open()
	if a, b := l.next(t), l.next(t); a != "0:ok" || b != "1:ok" {
		t.Errorf("completions %s, %s; want 0:ok, 1:ok", a, b)
	}
}

// TestSlowThenClose: a batch held at a closed gate completes with
// ErrEndpointClosed at Close, exactly once, even if the gate opens later.
func TestSlowThenClose(t *testing.T) {
	g := faulty.NewGate()
	r := newRig(t, 64<<10, faulty.Slow(faulty.Always(), g))
	l := newLog()
	if err := r.post("0", l, seg(0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "batch 0 to reach the gate", func() bool { return g.Held() == 1 })
	if err := r.ep.Close(); err != nil {
		t.Fatal(err)
	}
	g.Open()
	if got := l.all(); !slices.Equal(got, []string{"0:closed"}) {
		t.Errorf("outcomes %v, want [0:closed]", got)
	}
}

// TestPeerGone: from the matched batch on, Post fails with ErrPeerGone (Done
// not called); a Flush reports it.
func TestPeerGone(t *testing.T) {
	r := newRig(t, 64<<10, faulty.PeerGone(faulty.From(2)))
	l := newLog()
	for i := range 4 {
		err := r.post(fmt.Sprint(i), l, seg(i))
		if gone := i >= 2; gone != errors.Is(err, rdma.ErrPeerGone) || (!gone && err != nil) {
			t.Errorf("Post %d: %v", i, err)
		}
	}
	r.flush(l)
	for range 3 {
		l.next(t)
	}
	want := []string{"0:ok", "1:ok", "flush:peer-gone"}
	if got := l.all(); !slices.Equal(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
}

// TestCut: the matched batch is posted (its data lands) and fails as
// UCX's endpoint error fails a batch on the wire, with ErrPeerGone and
// ErrCloseUnproven (never ErrSourcesReleased: only Close says that);
// later posts fail with ErrPeerGone, a flush reports it, and Close proves
// nothing: ErrCloseUnproven, with ErrSourcesReleased beside it only under
// WithSourcesReleased.
func TestCut(t *testing.T) {
	for _, released := range []bool{false, true} {
		t.Run(fmt.Sprintf("sources released %v", released), func(t *testing.T) {
			opts := []faulty.Option{faulty.Cut(faulty.Nth(1))}
			if released {
				opts = append(opts, faulty.WithSourcesReleased())
			}
			r := newRig(t, 64<<10, opts...)
			var cut error
			done := make(chan struct{})
			l := newLog()
			if err := r.post("0", l, seg(0)); err != nil {
				t.Fatal(err)
			}
			if err := r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: []kvcache.Segment{seg(1)},
				Done: func(err error) { cut = err; close(done) }}); err != nil {
				t.Fatal(err)
			}
			if got := l.next(t); got != "0:ok" {
				t.Fatalf("first completion %s, want 0:ok", got)
			}
			select {
			case <-done:
			case <-time.After(waitLimit):
				t.Fatalf("no completion of the cut batch within %v", waitLimit)
			}
			if !errors.Is(cut, rdma.ErrPeerGone) || !errors.Is(cut, rdma.ErrCloseUnproven) || errors.Is(cut, rdma.ErrSourcesReleased) {
				t.Errorf("cut batch: Done(%v), want ErrPeerGone and ErrCloseUnproven, not ErrSourcesReleased", cut)
			}
			if !r.landed(seg(1)) {
				t.Errorf("the cut batch's data has not landed: Cut stands for writes that may land")
			}
			if err := r.post("2", l, seg(2)); !errors.Is(err, rdma.ErrPeerGone) {
				t.Errorf("Post after the cut: %v, want ErrPeerGone", err)
			}
			r.flush(l)
			if got := l.next(t); got != "flush:peer-gone" {
				t.Errorf("flush after the cut: %s, want flush:peer-gone", got)
			}
			err := r.ep.Close()
			if !errors.Is(err, rdma.ErrCloseUnproven) || errors.Is(err, rdma.ErrSourcesReleased) != released {
				t.Errorf("Close after the cut: %v, want ErrCloseUnproven, and ErrSourcesReleased %v", err, released)
			}
		})
	}
}

// TestUnprovenCloseSourcesReleased: a Close that cuts a hung batch wraps
// ErrSourcesReleased beside ErrCloseUnproven under WithSourcesReleased,
// and only then; without WithUnprovenClose the Close is a proof (nil).
func TestUnprovenCloseSourcesReleased(t *testing.T) {
	for _, tc := range []struct {
		unproven, released bool
	}{{false, true}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("unproven %v released %v", tc.unproven, tc.released), func(t *testing.T) {
			opts := []faulty.Option{faulty.Hang(faulty.Always())}
			if tc.unproven {
				opts = append(opts, faulty.WithUnprovenClose())
			}
			if tc.released {
				opts = append(opts, faulty.WithSourcesReleased())
			}
			r := newRig(t, 64<<10, opts...)
			l := newLog()
			if err := r.post("0", l, seg(0)); err != nil {
				t.Fatal(err)
			}
			err := r.ep.Close()
			switch {
			case !tc.unproven && err != nil:
				t.Errorf("Close: %v, want nil", err)
			case tc.unproven && (!errors.Is(err, rdma.ErrCloseUnproven) || errors.Is(err, rdma.ErrSourcesReleased) != tc.released):
				t.Errorf("Close: %v, want ErrCloseUnproven, and ErrSourcesReleased %v", err, tc.released)
			}
			if got := l.next(t); got != "0:closed" {
				t.Errorf("hung batch: %s, want 0:closed", got)
			}
		})
	}
}

// TestRefusalPassesThrough: the wrapped backend's synchronous refusals come
// back from Post unchanged.
func TestRefusalPassesThrough(t *testing.T) {
	r := newRig(t, 4096)
	err := r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: []kvcache.Segment{{Dst: 4000, Len: 200}}, Done: func(error) {}})
	var se *rdma.SegmentError
	if !errors.As(err, &se) || !errors.Is(err, rdma.ErrOutOfRange) {
		t.Errorf("Post out of range: %v, want *SegmentError wrapping ErrOutOfRange", err)
	}
}

func TestMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		name string
		m    faulty.Match
		want []uint64
	}{
		{"Nth(1,4)", faulty.Nth(1, 4), []uint64{1, 4}},
		{"From(3)", faulty.From(3), []uint64{3, 4, 5}},
		{"Always", faulty.Always(), []uint64{0, 1, 2, 3, 4, 5}},
		{"Rate(0)", faulty.Rate(0), nil},
		{"Rate(1)", faulty.Rate(1), []uint64{0, 1, 2, 3, 4, 5}},
	} {
		var got []uint64
		for seq := range uint64(6) {
			if c.m(seq, rng) {
				got = append(got, seq)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s matched %v, want %v", c.name, got, c.want)
		}
	}
}

func TestManualClock(t *testing.T) {
	clk := faulty.NewManualClock()
	var ran []string
	clk.AfterFunc(2*time.Second, func() { ran = append(ran, "b") })
	clk.AfterFunc(time.Second, func() { ran = append(ran, "a") })
	stop := clk.AfterFunc(time.Second, func() { ran = append(ran, "stopped") })
	clk.AfterFunc(3*time.Second, func() { ran = append(ran, "c") })
	if !stop() || stop() {
		t.Errorf("stop: want true once, then false")
	}
	clk.Advance(2 * time.Second)
	if !slices.Equal(ran, []string{"a", "b"}) || clk.Pending() != 1 {
		t.Errorf("after 2s ran %v with %d pending, want [a b] and 1", ran, clk.Pending())
	}
	clk.Advance(time.Second)
	if !slices.Equal(ran, []string{"a", "b", "c"}) || clk.Pending() != 0 {
		t.Errorf("after 3s ran %v, want [a b c]", ran)
	}
}

// eventually polls cond under a deadline (the integration-test pattern of
// CONVENTIONS.md §7): for a state another goroutine reaches.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestFlushWhileClosingKeepsItsPlace: a Flush made while the agent closes
// the endpoint (its Close has begun, batches posted before the Flush not
// yet delivered) calls done after their Done, in its place (package
// rdma: a flush's done proves every batch posted before it completed),
// not at once on the caller's goroutine. Batch 0's Done waits for the
// test — against the rule that Done must not block — to hold the
// delivery goroutine with batch 1 behind it.
func TestFlushWhileClosingKeepsItsPlace(t *testing.T) {
	r := newRig(t, 64<<10)
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	entered, hold := make(chan struct{}), make(chan struct{})
	if err := r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: []kvcache.Segment{seg(0)},
		Done: func(error) { close(entered); <-hold; note("0") }}); err != nil {
		t.Fatal(err)
	}
	if err := r.ep.Post(rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: []kvcache.Segment{seg(1)},
		Done: func(error) { note("1") }}); err != nil {
		t.Fatal(err)
	}
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- r.sender.Close() }() // Agent.Close closes the endpoint from another goroutine
	// A batch out of range is refused whether or not Close has begun;
	// once it has, with ErrEndpointClosed.
	bad := rdma.Batch{Src: r.src, Dst: r.dst.Remote(), Segments: []kvcache.Segment{{Dst: 64 << 10, Len: 1}},
		Done: func(err error) { t.Errorf("Done(%v) of a refused batch", err) }}
	eventually(t, "the endpoint's Close to begin", func() bool { return errors.Is(r.ep.Post(bad), rdma.ErrEndpointClosed) })
	flushed := make(chan error, 1)
	r.ep.Flush(func(err error) { note("flush"); flushed <- err })
	close(hold)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-flushed; !errors.Is(err, rdma.ErrEndpointClosed) {
		t.Errorf("Flush during Close: %v, want ErrEndpointClosed", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, []string{"0", "1", "flush"}) {
		t.Fatalf("completion order %v, want [0 1 flush]: the flush's done ran before batches posted earlier completed", order)
	}
}

// TestHeldBatchKeepsUnprovenAtClose: a batch that a fault holds (Hang,
// Slow) and whose wrapped endpoint cut it on the wire (its outcome wraps
// rdma.ErrCloseUnproven: it may still land) keeps saying so when Close
// completes it: a Done without ErrCloseUnproven is the batch's proof of
// quiescence (rdma.Batch.Done). The wrapped endpoint here is a faulty one
// that Cuts the batch.
func TestHeldBatchKeepsUnprovenAtClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold func() faulty.Option
	}{
		{"hang", func() faulty.Option { return faulty.Hang(faulty.Nth(0)) }},
		{"slow", func() faulty.Option { return faulty.Slow(faulty.Nth(0), faulty.NewGate()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := loopback.NewNetwork()
			sender := faulty.New(faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.Cut(faulty.Nth(0))), tc.hold())
			receiver := loopback.New(loopback.WithNetwork(net))
			t.Cleanup(func() { sender.Close(); receiver.Close() })
			sr, _ := kvcache.NewHostRegion(4096)
			dr, _ := kvcache.NewHostRegion(4096)
			src, err := sender.Register(sr)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := receiver.Register(dr)
			if err != nil {
				t.Fatal(err)
			}
			ep, err := sender.Connect(receiver.Address())
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			if err := ep.Post(rdma.Batch{Src: src, Dst: dst.Remote(), Segments: []kvcache.Segment{{Len: 1024}},
				Done: func(err error) { done <- err }}); err != nil {
				t.Fatal(err)
			}
			if err := ep.Close(); !errors.Is(err, rdma.ErrCloseUnproven) {
				t.Errorf("Close: %v, want ErrCloseUnproven (the wrapped endpoint's)", err)
			}
			if err := <-done; !errors.Is(err, rdma.ErrEndpointClosed) || !errors.Is(err, rdma.ErrCloseUnproven) {
				t.Errorf("held batch cut by the wrapped endpoint: Done(%v), want ErrEndpointClosed and ErrCloseUnproven", err)
			}
		})
	}
}
