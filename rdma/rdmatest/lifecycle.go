package rdmatest

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// testAgentClose: closing the sender agent completes every accepted batch
// exactly once before it returns and closes its endpoints; afterwards it
// refuses Connect and Register (ErrAgentClosed); Close is idempotent.
func testAgentClose(t *testing.T, e *env) {
	const n, batches = 4 << 20, 16
	src, dst := e.src(n, 40), e.dst(n, 41)
	ep := e.connect()
	tl := newTally(batches)
	segs := []kvcache.Segment{{Src: 0, Dst: 0, Len: n}}
	for i := range batches {
		if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs, Done: tl.done(i)}); err != nil {
			t.Fatalf("Post %d: %v", i, err)
		}
	}
	if err := e.p.Sender.Close(); err != nil {
		t.Fatalf("agent Close: %v", err)
	}
	if got := tl.count(); got != batches {
		t.Fatalf("after agent Close returned, %d of %d batches had completed; want all", got, batches)
	}
	tl.exactlyOnce(t)
	for i, err := range tl.errs {
		if err != nil && !errors.Is(err, rdma.ErrEndpointClosed) {
			t.Errorf("batch %d: Done(%v), want nil or ErrEndpointClosed", i, err)
		}
	}
	err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs, Done: e.refused("post after agent Close")})
	mustFail(t, "Post on an endpoint of a closed agent", err, rdma.ErrEndpointClosed)
	if _, err := e.p.Sender.Connect(e.p.Receiver.Address()); !errors.Is(err, rdma.ErrAgentClosed) {
		t.Errorf("Connect after Close: %v, want ErrAgentClosed", err)
	}
	r, _ := kvcache.NewHostRegion(4096)
	if _, err := e.p.Sender.Register(r); !errors.Is(err, rdma.ErrAgentClosed) {
		t.Errorf("Register after Close: %v, want ErrAgentClosed", err)
	}
	if err := e.p.Sender.Close(); err != nil {
		t.Errorf("second agent Close: %v, want nil", err)
	}
	mustFail(t, "Flush on an endpoint of a closed agent", e.flush(ep), rdma.ErrEndpointClosed)
	e.strayMu.Lock()
	defer e.strayMu.Unlock()
	for _, s := range e.stray {
		t.Errorf("Done called for a batch Post refused: %s", s)
	}
}

// testPeerClosed: once the receiver agent closed, posts into its regions are
// refused with ErrPeerGone.
func testPeerClosed(t *testing.T, e *env) {
	const n = 64 << 10
	src, dst := e.src(n, 42), e.dst(n, 43)
	ep := e.connect()
	segs := []kvcache.Segment{{Src: 0, Dst: 0, Len: n}}
	if err := e.post(ep, src, dst, segs); err != nil {
		t.Fatalf("post before the peer closed: %v", err)
	}
	if err := e.p.Receiver.Close(); err != nil {
		t.Fatalf("receiver Close: %v", err)
	}
	err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs, Done: e.refused("post after the peer closed")})
	mustFail(t, "Post after the peer closed", err, rdma.ErrPeerGone)
	e.noStray(ep)
}
