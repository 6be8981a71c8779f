package rdmatest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// testExactlyOnce: hundreds of batches each complete exactly once, and
// nothing more arrives after Flush and Close.
func testExactlyOnce(t *testing.T, e *env) {
	const n, batches = 1 << 20, 300
	src, dst := e.src(n, 5), e.dst(n, 6)
	ep := e.connect()
	tl := newTally(batches)
	for i := range batches {
		seg := kvcache.Segment{Src: uint64(i) * 997 % (n - 4096), Dst: uint64(i) * 3001 % (n - 4096), Len: 1 + uint64(i)%4096}
		if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: []kvcache.Segment{seg}, Done: tl.done(i)}); err != nil {
			t.Fatalf("Post batch %d: %v", i, err)
		}
	}
	if err := e.flush(ep); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	tl.exactlyOnce(t)
	for i, err := range tl.errs {
		if err != nil {
			t.Errorf("batch %d: Done(%v), want nil", i, err)
		}
	}
	if err := ep.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	tl.exactlyOnce(t)
}

// testFlushOrder: a Flush callback runs after every earlier batch's Done and
// before any later one's; Flush on an idle endpoint reports nil, on a closed
// one ErrEndpointClosed.
func testFlushOrder(t *testing.T, e *env) {
	const n = 4 << 20
	src, dst := e.src(n, 7), e.dst(n, 8)
	ep := e.connect()
	if err := e.flush(ep); err != nil {
		t.Errorf("Flush of an idle endpoint: %v, want nil", err)
	}

	const per, rounds = 20, 3
	tl := newTally(per * rounds)
	seen := make(chan int, rounds)
	for r := range rounds {
		for i := range per {
			seg := kvcache.Segment{Src: uint64(i) << 16, Dst: uint64(r*per+i) << 16, Len: 64 << 10}
			if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: []kvcache.Segment{seg}, Done: tl.done(r*per + i)}); err != nil {
				t.Fatalf("Post: %v", err)
			}
		}
		ep.Flush(func(err error) {
			if err != nil {
				t.Errorf("Flush %d: %v", r, err)
			}
			seen <- tl.count()
		})
	}
	for r := range rounds {
		if got := Recv(t, seen, "Flush callback"); got != (r+1)*per {
			t.Errorf("Flush %d ran after %d batches completed, want exactly %d (every earlier batch, no later one)", r, got, (r+1)*per)
		}
	}
	tl.exactlyOnce(t)

	if err := ep.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	mustFail(t, "Flush after Close", e.flush(ep), rdma.ErrEndpointClosed)
}

// testCloseStopsWrites: Close with many large batches queued completes each
// exactly once (nil or ErrEndpointClosed) before it returns, and no write
// lands after it: a sentinel written into the destination then stays intact.
func testCloseStopsWrites(t *testing.T, e *env) {
	const n, batches = 4 << 20, 48
	src, dst := e.src(n, 9), e.dst(n, 10)
	ep := e.connect()
	segs := []kvcache.Segment{
		{Src: 0, Dst: 3 << 20, Len: 1 << 20}, {Src: 1 << 20, Dst: 2 << 20, Len: 1 << 20},
		{Src: 2 << 20, Dst: 1 << 20, Len: 1 << 20}, {Src: 3 << 20, Dst: 0, Len: 1 << 20},
	}
	tl := newTally(batches)
	for i := range batches {
		if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs, Done: tl.done(i)}); err != nil {
			t.Fatalf("Post batch %d: %v", i, err)
		}
	}
	if err := ep.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := tl.count(); got != batches {
		t.Fatalf("after Close returned, %d of %d batches had completed; want all", got, batches)
	}
	tl.exactlyOnce(t)
	closed := 0
	for i, err := range tl.errs {
		if err == nil {
			continue
		}
		closed++
		if !errors.Is(err, rdma.ErrEndpointClosed) {
			t.Errorf("batch %d: Done(%v), want nil or ErrEndpointClosed", i, err)
		}
		var se *rdma.SegmentError
		if errors.As(err, &se) && (se.Index < 0 || se.Index >= len(segs) || se.Segment != segs[se.Index]) {
			t.Errorf("batch %d: %v names segment %d %+v, not one of the batch's", i, err, se.Index, se.Segment)
		}
	}
	t.Logf("%d of %d batches ended with ErrEndpointClosed", closed, batches)

	// The sentinel: any write still running would overwrite it.
	for i := range dst.bytes {
		dst.bytes[i] = 0xA5
	}
	// Let time pass doing real work on another endpoint, and yield.
	other := e.connect()
	src2, dst2 := e.src(n, 11), e.dst(n, 12)
	for range 4 {
		if err := e.post(other, src2, dst2, []kvcache.Segment{{Src: 0, Dst: 0, Len: n}}); err != nil {
			t.Fatalf("transfer on a second endpoint: %v", err)
		}
		runtime.Gosched()
	}
	for i, b := range dst.bytes {
		if b != 0xA5 {
			t.Fatalf("byte %d of the destination changed to %#02x after Close returned: a write landed late", i, b)
		}
	}

	if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs, Done: e.refused("post after Close")}); !errors.Is(err, rdma.ErrEndpointClosed) {
		t.Errorf("Post after Close: %v, want ErrEndpointClosed", err)
	}
	if err := ep.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	e.noStray(other)
}

// testCompletionsDeliver: a backend that claims its completions prove
// delivery (rdma.Delivering) has every byte of a batch in the destination
// when its Done(nil) runs, with no Flush: each Done compares its own
// segments, which no other batch touches, there and then.
func testCompletionsDeliver(t *testing.T, e *env) {
	if !rdma.CompletionsDeliver(e.p.Sender) {
		t.Skipf("%s does not claim that its completions prove delivery", e.p.Sender.Backend())
	}
	const seg, batches = 64 << 10, 64
	const n = seg * batches
	src, dst := e.src(n, 11), e.dst(n, 12)
	ep := e.connect()
	tl := newTally(batches)
	bad := make(chan string, batches)
	for i := range batches {
		// Batch i copies source slot i to destination slot batches-1-i.
		s := kvcache.Segment{Src: uint64(i) * seg, Dst: uint64(batches-1-i) * seg, Len: seg}
		record := tl.done(i)
		done := func(err error) {
			if err == nil {
				if at := FirstDiff(dst.bytes[s.Dst:s.Dst+s.Len], src.bytes[s.Src:s.Src+s.Len]); at >= 0 {
					bad <- fmt.Sprintf("batch %d: Done(nil) ran with destination byte %d of its segment not yet written", i, at)
				}
			}
			record(err)
		}
		if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: []kvcache.Segment{s}, Done: done}); err != nil {
			t.Fatalf("Post batch %d: %v", i, err)
		}
	}
	Recv(t, tl.all, "every batch's Done")
	close(bad)
	for msg := range bad {
		t.Error(msg)
	}
	for i, err := range tl.errs {
		if err != nil {
			t.Errorf("batch %d: Done(%v), want nil", i, err)
		}
	}
}
