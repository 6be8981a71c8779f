package rdmatest

import (
	"bytes"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// testDeregisterBusy: while an accepted batch has not completed, Deregister
// of its source or its destination fails with ErrRegionBusy and changes
// nothing; once it completed, both deregister.
//
// The batch is kept pending deterministically: the batch posted before it
// blocks in its Done, and completions of one endpoint are delivered one at
// a time in post order (package rdma's contract).
func testDeregisterBusy(t *testing.T, e *env) {
	const n = 1 << 20
	srcA, dstA := e.src(n, 20), e.dst(n, 21)
	srcB, dstB := e.src(n, 22), e.dst(n, 23)
	ep := e.connect()

	entered, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(unblock) }) }
	defer release()
	whole := []kvcache.Segment{{Src: 0, Dst: 0, Len: n}}
	if err := ep.Post(rdma.Batch{Src: srcA.reg, Dst: dstA.reg.Remote(), Segments: whole, Done: func(error) {
		close(entered)
		<-unblock
	}}); err != nil {
		t.Fatalf("Post A: %v", err)
	}
	Recv(t, entered, "Done of batch A")

	// Inside its Done, batch B is no longer in flight: both its regions
	// deregister there already.
	doneB := make(chan [3]error, 1)
	if err := ep.Post(rdma.Batch{Src: srcB.reg, Dst: dstB.reg.Remote(), Segments: whole, Done: func(err error) {
		doneB <- [3]error{err, e.p.Sender.Deregister(srcB.reg), e.p.Receiver.Deregister(dstB.reg)}
	}}); err != nil {
		t.Fatalf("Post B: %v", err)
	}
	mustFail(t, "Deregister of pending batch B's source", e.p.Sender.Deregister(srcB.reg), rdma.ErrRegionBusy)
	mustFail(t, "Deregister of pending batch B's destination", e.p.Receiver.Deregister(dstB.reg), rdma.ErrRegionBusy)
	select {
	case errs := <-doneB:
		t.Fatalf("batch B completed (%v) while batch A's Done was still running: completions out of order", errs[0])
	default:
	}

	release()
	errs := Recv(t, doneB, "Done of batch B")
	if errs[0] != nil {
		t.Fatalf("batch B after the refused Deregisters: %v", errs[0])
	}
	if !bytes.Equal(dstB.bytes, srcB.bytes) {
		t.Errorf("batch B's data did not land intact after the refused Deregisters")
	}
	for what, err := range map[string]error{
		"source B, inside its Done": errs[1], "destination B, inside its Done": errs[2],
		"source A": e.p.Sender.Deregister(srcA.reg), "destination A": e.p.Receiver.Deregister(dstA.reg),
	} {
		if err != nil {
			t.Errorf("Deregister %s after completion: %v", what, err)
		}
	}
}
