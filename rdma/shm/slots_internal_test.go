package shm

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// slotsRig is a receiver's registered region and a writer (agent, endpoint,
// source) of this process.
type slotsRig struct {
	f        *sharedFile
	recv     *Agent
	reg      rdma.Registration
	dst      rdma.RemoteRegion
	send     *Agent
	ep       *endpoint
	src      rdma.Registration
	srcBytes uint64
}

func newSlotsRig(t *testing.T, before func(f *sharedFile)) *slotsRig {
	t.Helper()
	const n = 1 << 16
	r, c, err := NewRegion("", n)
	if err != nil {
		t.Fatal(err)
	}
	g := &slotsRig{f: lookupFile(r), recv: New(), send: New(), srcBytes: n}
	t.Cleanup(func() {
		g.send.Close()
		g.recv.Close()
		if err := c.Close(); err != nil {
			t.Errorf("region Close: %v", err)
		}
	})
	if before != nil {
		before(g.f)
	}
	if g.reg, err = g.recv.Register(r); err != nil {
		t.Fatal(err)
	}
	g.dst = g.reg.Remote()
	ep, err := g.send.Connect(g.recv.Address())
	if err != nil {
		t.Fatal(err)
	}
	g.ep = ep.(*endpoint)
	src, _ := kvcache.NewHostRegion(n)
	if g.src, err = g.send.Register(src); err != nil {
		t.Fatal(err)
	}
	return g
}

// hold posts batch A, whose Done blocks until the returned release, and
// batch B behind it: B stays in flight until then.
func (g *slotsRig) hold(t *testing.T) (release func()) {
	t.Helper()
	entered, unblock := make(chan struct{}), make(chan struct{})
	seg := []kvcache.Segment{{Len: g.srcBytes}}
	if err := g.ep.Post(rdma.Batch{Src: g.src, Dst: g.dst, Segments: seg, Done: func(error) {
		close(entered)
		<-unblock
	}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("batch A not done")
	}
	if err := g.ep.Post(rdma.Batch{Src: g.src, Dst: g.dst, Segments: seg}); err != nil {
		t.Fatal(err)
	}
	flushed := make(chan struct{})
	return func() {
		close(unblock)
		g.ep.Flush(func(error) { close(flushed) })
		<-flushed
	}
}

func (g *slotsRig) mapping(t *testing.T) *mapping {
	t.Helper()
	g.ep.mu.Lock()
	defer g.ep.mu.Unlock()
	for _, m := range g.ep.maps {
		return m
	}
	t.Fatal("the endpoint mapped no file")
	return nil
}

// selfSlots counts the slots of f held by this process.
func selfSlots(f *sharedFile) (n int) {
	self, _ := copier.Self()
	copier.ReclaimDead(f.hdr.writers[:], &f.hdr.lease, func(id copier.ProcessID) bool {
		if id == self {
			n++
		}
		return false
	})
	return n
}

// TestWriterCountsInItsSlot: a writer's mapping claims a slot in the
// region's header and counts its batches there; a live writer's batches
// keep the region busy (nothing reclaims them); the endpoint's Close gives
// the slot back.
func TestWriterCountsInItsSlot(t *testing.T) {
	if _, err := copier.Self(); err != nil {
		t.Skipf("no writer identity here: %v", err)
	}
	g := newSlotsRig(t, nil)
	release := g.hold(t)
	m := g.mapping(t)
	if m.slot == nil || m.slot.InFlight() != 1 || g.f.hdr.lease.InFlight() != 1 {
		t.Fatalf("slot %v: want one batch counted in it and in the lease (%d)", m.slot, g.f.hdr.lease.InFlight())
	}
	if n := selfSlots(g.f); n != 1 {
		t.Fatalf("%d slots held by this process, want 1", n)
	}
	if err := g.recv.Deregister(g.reg); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Fatalf("Deregister with a live writer's batch in flight: %v, want ErrRegionBusy", err)
	}
	release()
	if m.slot.InFlight() != 0 || g.f.hdr.lease.InFlight() != 0 {
		t.Fatalf("after the batches: slot %d, lease %d", m.slot.InFlight(), g.f.hdr.lease.InFlight())
	}
	if err := g.ep.Close(); err != nil {
		t.Fatal(err)
	}
	if n := selfSlots(g.f); n != 0 {
		t.Fatalf("%d slots held after the endpoint closed, want 0", n)
	}
	if err := g.recv.Deregister(g.reg); err != nil {
		t.Fatal(err)
	}
}

// TestNoFreeSlotCountsInTheLease: with every slot taken (by live writers),
// a writer still writes, counting in the lease only.
func TestNoFreeSlotCountsInTheLease(t *testing.T) {
	self, err := copier.Self()
	if err != nil {
		t.Skipf("no writer identity here: %v", err)
	}
	var taken []*copier.WriterSlot
	g := newSlotsRig(t, func(f *sharedFile) {
		for range writerSlots {
			taken = append(taken, copier.ClaimSlot(f.hdr.writers[:], self))
		}
	})
	release := g.hold(t)
	m := g.mapping(t)
	if m.slot != nil || g.f.hdr.lease.InFlight() != 1 {
		t.Fatalf("slot %v, lease %d: want no slot and one batch in the lease", m.slot, g.f.hdr.lease.InFlight())
	}
	release()
	if err := g.recv.Deregister(g.reg); err != nil {
		t.Fatal(err)
	}
	for _, s := range taken {
		if s == nil || !s.Free() {
			t.Fatal("a slot of the full table was not claimed, or not freed")
		}
	}
}

// TestOwnerReclaimsDeadWriters: batches counted in the slot of a writer
// proven dead (here: this process's pid with another start time, as after
// the pid's reuse) are released by Deregister; Register frees dead writers'
// slots for new writers.
func TestOwnerReclaimsDeadWriters(t *testing.T) {
	self, err := copier.Self()
	if err != nil {
		t.Skipf("no writer identity here: %v", err)
	}
	dead := self
	dead.Start++
	if !copier.ProvenDead(dead) {
		t.Skip("this process cannot prove deaths here")
	}
	var idle *copier.WriterSlot
	g := newSlotsRig(t, func(f *sharedFile) {
		idle = copier.ClaimSlot(f.hdr.writers[:], dead)
	})
	// Register freed it: the next claim gets it.
	s := copier.ClaimSlot(g.f.hdr.writers[:], dead)
	if idle == nil || s != idle {
		t.Fatal("Register left a dead writer's slot held")
	}
	for range 3 {
		if s.Acquire(&g.f.hdr.lease) != copier.Live {
			t.Fatal("acquire of a registered region failed")
		}
	}
	release := g.hold(t) // and a live writer's batch
	if err := g.recv.Deregister(g.reg); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Fatalf("Deregister with a live writer's batch in flight: %v, want ErrRegionBusy", err)
	}
	if g.f.hdr.lease.InFlight() != 1 || s.InFlight() != 0 {
		t.Fatalf("after the reclaim: lease %d, dead slot %d; want the live batch only", g.f.hdr.lease.InFlight(), s.InFlight())
	}
	release()
	if err := g.recv.Deregister(g.reg); err != nil {
		t.Fatal(err)
	}
}
