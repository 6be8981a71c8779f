package copier

import (
	"sync"
	"testing"
)

// ids of writers in tests: same namespaces, distinct pids.
func testID(pid uint32) ProcessID {
	return ProcessID{PID: pid, Start: 1000 + uint64(pid), PIDNS: 7, TimeNS: 8, NSDev: 9}
}

// deadSet proves dead exactly the writers it names.
func deadSet(dead ...ProcessID) func(ProcessID) bool {
	return func(id ProcessID) bool {
		for _, d := range dead {
			if id == d {
				return true
			}
		}
		return false
	}
}

func TestWriterSlotClaimCountFree(t *testing.T) {
	var l Lease
	slots := make([]WriterSlot, 2)
	a, b := ClaimSlot(slots, testID(10)), ClaimSlot(slots, testID(11))
	if a != &slots[0] || b != &slots[1] {
		t.Fatalf("claims got slots %p %p, want %p %p", a, b, &slots[0], &slots[1])
	}
	if c := ClaimSlot(slots, testID(12)); c != nil {
		t.Fatal("a claim of a full table got a slot")
	}
	if ClaimSlot(make([]WriterSlot, 1), ProcessID{}) != nil {
		t.Fatal("a writer without a pid got a slot")
	}
	if got := a.id(a.tag.Load()); got != testID(10) {
		t.Fatalf("slot identity %+v, want %+v", got, testID(10))
	}

	// Acquire counts in the lease and the slot; Release uncounts both.
	for _, s := range []*WriterSlot{a, a, b} {
		if s.Acquire(&l) != Live {
			t.Fatal("acquire of a live lease failed")
		}
	}
	if l.InFlight() != 3 || a.InFlight() != 2 || b.InFlight() != 1 {
		t.Fatalf("in flight: lease %d, a %d, b %d; want 3, 2, 1", l.InFlight(), a.InFlight(), b.InFlight())
	}
	// A slot with batches counted is not given back.
	if a.Free() {
		t.Fatal("Free of a slot with 2 batches counted")
	}
	a.Release(&l)
	a.Release(&l)
	if l.InFlight() != 1 || a.InFlight() != 0 {
		t.Fatalf("after release: lease %d, a %d; want 1, 0", l.InFlight(), a.InFlight())
	}
	if !a.Free() || slots[0].tag.Load() != 0 {
		t.Fatal("Free of an empty slot did not free it")
	}
	if a.Free() {
		t.Fatal("second Free succeeded")
	}
	// The freed slot is claimed again, by another writer.
	if c := ClaimSlot(slots, testID(12)); c != &slots[0] || c.id(c.tag.Load()) != testID(12) {
		t.Fatalf("claim after a free: %p, want %p with the new identity", c, &slots[0])
	}

	// A retired lease counts nothing anywhere.
	b.Release(&l)
	if !l.TryRetire() || b.Acquire(&l) != Retired || b.InFlight() != 0 || l.InFlight() != 0 {
		t.Fatalf("acquire of a retired lease: lease %d, b %d", l.InFlight(), b.InFlight())
	}

	// Without a slot, a writer counts in the lease only.
	var none *WriterSlot
	l.Renew()
	if none.Acquire(&l) != Live || l.InFlight() != 1 {
		t.Fatal("acquire without a slot")
	}
	none.Release(&l)
	if l.InFlight() != 0 || none.Free() {
		t.Fatal("release without a slot")
	}
}

// TestReclaimDead: the owner releases exactly a dead writer's batches and
// frees its slot; a live writer's slot and batches, and the batches of a
// writer without a slot, stay.
func TestReclaimDead(t *testing.T) {
	var l Lease
	slots := make([]WriterSlot, 4)
	dead, live := ClaimSlot(slots, testID(10)), ClaimSlot(slots, testID(11))
	idle := ClaimSlot(slots, testID(12)) // dead too, with nothing in flight
	for range 3 {
		dead.Acquire(&l)
	}
	live.Acquire(&l)
	var none *WriterSlot
	none.Acquire(&l) // no slot: never reclaimed
	if l.TryRetire() {
		t.Fatal("retired with 5 in flight")
	}

	got := ReclaimDead(slots, &l, deadSet(testID(10), testID(12)))
	if want := (Reclaimed{Slots: 2, Batches: 3, Held: 1}); got != want {
		t.Fatalf("ReclaimDead = %+v, want %+v", got, want)
	}
	if l.InFlight() != 2 || dead.tag.Load() != 0 || dead.InFlight() != 0 || idle.tag.Load() != 0 {
		t.Fatalf("after reclaim: lease %d, dead slot tag %#x count %d, idle slot tag %#x",
			l.InFlight(), dead.tag.Load(), dead.InFlight(), idle.tag.Load())
	}
	if live.tag.Load() != testID(11).tag(slotHeld) || live.InFlight() != 1 {
		t.Fatalf("the live writer's slot changed: tag %#x count %d", live.tag.Load(), live.InFlight())
	}
	if l.TryRetire() {
		t.Fatal("retired with the live writer's batch and the slotless one in flight")
	}
	// Nothing more to reclaim, however often asked.
	if got := ReclaimDead(slots, &l, deadSet(testID(10), testID(12))); got != (Reclaimed{Held: 1}) || l.InFlight() != 2 {
		t.Fatalf("second ReclaimDead = %+v, lease %d", got, l.InFlight())
	}
	live.Release(&l)
	none.Release(&l)
	if !l.TryRetire() {
		t.Fatal("not retired once every live batch ended")
	}
}

// TestReclaimNeverMoreThanAdded: a writer that dies between the shared
// word and its slot (acquire) left one batch in the word only; reclaim
// releases what the slot counted, and the lease stays busy: the safe side.
func TestReclaimNeverMoreThanAdded(t *testing.T) {
	var l Lease
	slots := make([]WriterSlot, 1)
	s := ClaimSlot(slots, testID(10))
	s.Acquire(&l)
	l.Acquire() // the next Acquire's shared word; it died before its slot
	got := ReclaimDead(slots, &l, deadSet(testID(10)))
	if got.Batches != 1 || l.InFlight() != 1 || l.TryRetire() {
		t.Fatalf("reclaim %+v, lease %d: want 1 released, 1 left busy", got, l.InFlight())
	}
	// A writer that dies inside Release, after its slot and before the
	// word, leaves the same: one batch in the word, none in its slot.
	var l2 Lease
	slots2 := make([]WriterSlot, 1)
	s2 := ClaimSlot(slots2, testID(10))
	s2.Acquire(&l2)
	s2.count.Add(^uint64(0)) // Release's first half
	if got := ReclaimDead(slots2, &l2, deadSet(testID(10))); got.Batches != 0 || l2.InFlight() != 1 {
		t.Fatalf("reclaim %+v, lease %d: want nothing released, 1 left busy", got, l2.InFlight())
	}
}

// TestFreeDuringTheOwnersCheck: a writer that gives its slot back while the
// owner is checking it never waits for the owner; the owner, finding it
// alive, frees the slot.
func TestFreeDuringTheOwnersCheck(t *testing.T) {
	var l Lease
	slots := make([]WriterSlot, 1)
	s := ClaimSlot(slots, testID(10))
	s.Acquire(&l)
	freed := false
	ReclaimDead(slots, &l, func(id ProcessID) bool {
		if s.Free() {
			t.Error("Free with a batch counted, during the check")
		}
		s.Release(&l)
		freed = s.Free()
		if ClaimSlot(slots, testID(11)) != nil {
			t.Error("a slot being checked was claimed")
		}
		return false
	})
	if !freed || s.tag.Load() != 0 || l.InFlight() != 0 {
		t.Fatalf("Free during the check: %v, tag %#x, lease %d", freed, s.tag.Load(), l.InFlight())
	}
	if ClaimSlot(slots, testID(11)) != s {
		t.Fatal("the abandoned slot was not freed for a new writer")
	}
}

// TestReclaimSeesTheIdentityItJudges: the owner judges the identity in the
// slot once it has locked it; a slot freed and claimed again by another
// writer meanwhile is judged as the new writer's.
func TestReclaimSeesTheIdentityItJudges(t *testing.T) {
	var l Lease
	slots := make([]WriterSlot, 1)
	s := ClaimSlot(slots, testID(10))
	s.Acquire(&l)
	var judged []ProcessID
	ReclaimDead(slots, &l, func(id ProcessID) bool { judged = append(judged, id); return false })
	if len(judged) != 1 || judged[0] != testID(10) || s.tag.Load() != testID(10).tag(slotHeld) {
		t.Fatalf("judged %+v, tag %#x", judged, s.tag.Load())
	}
	s.Release(&l)
	s.Free()
	n := ClaimSlot(slots, ProcessID{PID: 10, Start: 5, PIDNS: 70, TimeNS: 8, NSDev: 9}) // same pid, another namespace: same tag
	judged = judged[:0]
	ReclaimDead(slots, &l, func(id ProcessID) bool { judged = append(judged, id); return false })
	if len(judged) != 1 || judged[0].PIDNS != 70 || judged[0].Start != 5 || n.tag.Load()&slotHeld == 0 {
		t.Fatalf("judged %+v after the slot changed hands", judged)
	}
}

// TestWriterSlotsConcurrent: writers claim, count and free while the owner
// reclaims (every writer alive): the lease ends at 0 and every slot free.
// Run with -race.
func TestWriterSlotsConcurrent(t *testing.T) {
	var l Lease
	slots := make([]WriterSlot, 4)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				if r := ReclaimDead(slots, &l, deadSet()); r.Slots != 0 {
					t.Errorf("reclaimed live writers: %+v", r)
					return
				}
			}
		}
	}()
	var writers sync.WaitGroup
	for w := range 8 { // more writers than slots: some count in the lease only
		writers.Add(1)
		go func() {
			defer writers.Done()
			for range 200 {
				s := ClaimSlot(slots, testID(uint32(100+w)))
				for range 5 {
					if s.Acquire(&l) == Live {
						s.Release(&l)
					}
				}
				if s != nil && !s.Free() {
					t.Errorf("writer %d could not free its empty slot", w)
					return
				}
			}
		}()
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	ReclaimDead(slots, &l, deadSet()) // frees a slot abandoned during the last check
	if l.InFlight() != 0 {
		t.Fatalf("lease %d in flight at the end", l.InFlight())
	}
	for i := range slots {
		if tag := slots[i].tag.Load(); tag != 0 {
			t.Errorf("slot %d left with tag %#x", i, tag)
		}
	}
}
