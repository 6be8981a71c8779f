package kvcache

import (
	"errors"
	"strings"
	"testing"
)

// Blocks a live receive owns (BlockReceiving) leave that state only by the
// receive's own calls: its caller's Free, Quarantine, Pin and Lend refuse
// them, naming the block and that a live request owns it, and change
// nothing.
func TestPoolReceivingRefusesTheCaller(t *testing.T) {
	setup := func(t *testing.T) (*Pool, []BlockID) {
		p := newTestPool(t, 6)
		if _, err := p.Alloc(2); err != nil { // 0, 1: the caller's
			t.Fatal(err)
		}
		rx, err := p.AllocReceiving(2) // 2, 3: a live receive's
		if err != nil {
			t.Fatal(err)
		}
		return p, rx
	}
	tests := []struct {
		name string
		call func(p *Pool) error
		want error
		msg  string
	}{
		{"free", func(p *Pool) error { return p.Free(0, 2) }, ErrBlockReceiving, "Free: block 2 is receiving: a live request owns it"},
		{"quarantine", func(p *Pool) error { return p.Quarantine(1, 3) }, ErrBlockReceiving, "Quarantine: block 3 is receiving"},
		{"pin", func(p *Pool) error { return p.Pin(0, 2) }, ErrBlockReceiving, "Pin: block 2 is receiving"},
		{"lend", func(p *Pool) error { return p.Lend(0, 3) }, ErrBlockReceiving, "Lend: block 3 is receiving"},
		{"lend free", func(p *Pool) error { return p.Lend(4) }, ErrBlockFree, "Lend: block 4 is free"},
		{"unpin", func(p *Pool) error { return p.Unpin(2) }, ErrNotPinned, "Unpin: block 2 is receiving"},
		{"release", func(p *Pool) error { return p.ReleaseQuarantine(2) }, ErrNotQuarantined, "block 2 is receiving"},
		{"hand over allocated", func(p *Pool) error { return p.HandOver(2, 0) }, ErrNotReceiving, "HandOver: block 0 is allocated"},
		{"hand over twice", func(p *Pool) error { return p.HandOver(2, 2) }, ErrDoubleFree, "block 2 listed twice"},
		{"free receiving free", func(p *Pool) error { return p.FreeReceiving(3, 5) }, ErrDoubleFree, "FreeReceiving: block 5 is free"},
		{"free receiving allocated", func(p *Pool) error { return p.FreeReceiving(1) }, ErrNotReceiving, "block 1 is allocated"},
		{"quarantine receiving allocated", func(p *Pool) error { return p.QuarantineReceiving(2, 0) }, ErrNotReceiving, "block 0 is allocated"},
		{"check", func(p *Pool) error { return p.Check("Free", BlockAllocated, 1, 3) }, ErrBlockReceiving, "Free: block 3 is receiving"},
		{"check twice", func(p *Pool) error { return p.Check("Free", BlockAllocated, 1, 0, 1) }, ErrDoubleFree, "Free: block 1 listed twice"},
		{"check unknown", func(p *Pool) error { return p.Check("Free", BlockReceiving, 2, 6) }, ErrUnknownBlock, "Free: block 6 out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := setup(t)
			before := snapshot(p)
			err := tt.call(p)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tt.want, tt.msg)
			}
			if after := snapshot(p); after != before {
				t.Fatalf("failed call changed the pool:\nbefore %s\nafter  %s", before, after)
			}
			if err := p.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The receive's own ways out of BlockReceiving, and the caller's lending:
// each transition of the documented table, with the counters.
func TestPoolReceivingLifecycle(t *testing.T) {
	p := newTestPool(t, 6)
	rx, err := p.AllocReceiving(3)
	if err != nil {
		t.Fatal(err)
	}
	own, err := p.Alloc(2)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
		want PoolStats
	}{
		{"check changes nothing", func() error { return p.Check("FreeReceiving", BlockReceiving, rx...) }, PoolStats{Total: 6, Free: 1, Used: 5, Receiving: 3}},
		{"hand over", func() error { return p.HandOver(rx[0]) }, PoolStats{Total: 6, Free: 1, Used: 5, Receiving: 2}},
		{"the caller frees it", func() error { return p.Free(rx[0]) }, PoolStats{Total: 6, Free: 2, Used: 4, Receiving: 2}},
		{"the receive frees one", func() error { return p.FreeReceiving(rx[1]) }, PoolStats{Total: 6, Free: 3, Used: 3, Receiving: 1}},
		{"the receive quarantines one", func() error { return p.QuarantineReceiving(rx[2]) }, PoolStats{Total: 6, Free: 3, Used: 2, Quarantined: 1}},
		{"the caller lends", func() error { return p.Lend(own...) }, PoolStats{Total: 6, Free: 3, Used: 2, Quarantined: 1, Receiving: 2}},
		{"the lend ends", func() error { return p.HandOver(own...) }, PoolStats{Total: 6, Free: 3, Used: 2, Quarantined: 1}},
		{"the caller pins its own again", func() error { return p.Pin(own[0]) }, PoolStats{Total: 6, Free: 3, Used: 2, Pinned: 1, Quarantined: 1}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := p.Stats(); got != s.want {
			t.Fatalf("%s: stats %+v, want %+v", s.name, got, s.want)
		}
		if err := p.CheckInvariants(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	for _, id := range own {
		if st, _ := p.State(id); st != BlockAllocated && st != BlockPinned {
			t.Fatalf("lent block %d is %v after the lend ended, want the caller's", id, st)
		}
	}
	if got := BlockReceiving.String(); got != "receiving" {
		t.Fatalf("BlockReceiving.String() = %q", got)
	}
}
