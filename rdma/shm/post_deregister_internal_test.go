package shm

import (
	"errors"
	"fmt"
	"runtime/debug"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// TestPostRacingDeregisterOfSharedSource: a shared region (NewRegion)
// registered as a source keeps its lease in its file's header. Another
// goroutine may deregister it and close the region (unmapping the file)
// while a Post that names it runs: Post must then refuse the batch with
// rdma.ErrUnregistered, not touch the lease in the unmapped header (a
// fault that kills the process, or a write into whatever is mapped
// there since). The hook runs the deregistration and the close in the
// window between Post's check that the source is live and its acquire of
// the source's lease.
func TestPostRacingDeregisterOfSharedSource(t *testing.T) {
	const n = 1 << 16
	send, recv := New(), New()
	defer send.Close()
	defer recv.Close()
	dstRegion, dstCloser, err := NewRegion("", n)
	if err != nil {
		t.Fatal(err)
	}
	defer dstCloser.Close()
	dreg, err := recv.Register(dstRegion)
	if err != nil {
		t.Fatal(err)
	}
	srcRegion, srcCloser, err := NewRegion("", n)
	if err != nil {
		t.Fatal(err)
	}
	defer srcCloser.Close()
	sreg, err := send.Register(srcRegion)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := send.Connect(recv.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()

	ran := false
	testHookPostSourceChecked = func() {
		if ran {
			return
		}
		ran = true
		if err := send.Deregister(sreg); err != nil {
			t.Errorf("Deregister of the source with nothing in flight: %v", err)
			return
		}
		if err := srcCloser.Close(); err != nil {
			t.Errorf("close of the deregistered source region: %v", err)
		}
	}
	defer func() { testHookPostSourceChecked = nil }()

	done := make(chan error, 1)
	err = func() (err error) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("post faulted: %v", r)
			}
		}()
		return ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(),
			Segments: []kvcache.Segment{{Src: 0, Dst: 0, Len: 4096}},
			Done:     func(err error) { done <- err }})
	}()
	if !ran {
		t.Fatal("the hook did not run")
	}
	if err == nil { // accepted: its copy reads whatever is mapped there now
		select {
		case err = <-done:
		case <-time.After(time.Minute):
		}
		t.Fatalf("Post accepted a batch whose shared source was deregistered and unmapped meanwhile (its Done: %v)", err)
	}
	if !errors.Is(err, rdma.ErrUnregistered) {
		t.Fatalf("Post of a batch whose shared source was deregistered and unmapped meanwhile: %v; want rdma.ErrUnregistered", err)
	}
	t.Logf("refused: %v", err)
}
