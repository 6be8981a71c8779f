package core

import (
	"slices"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// Issue 17: a lease is held from a renewal for TTL, lapses at its end, is
// reported lapsed once, and a renewal (the peer heard again) holds it
// again; with TTL 0 leases are off and every peer is held.
func TestPeerLeases(t *testing.T) {
	g0, g1 := messages.PeerID{Instance: "gen", Rank: 0}, messages.PeerID{Instance: "gen", Rank: 1}
	l := NewPeerLeases(100 * time.Millisecond)
	t0 := testEpoch0
	if l.Held(g0, t0) {
		t.Fatal("a peer never heard holds a lease")
	}
	l.Renew(g0, t0)
	l.Renew(g1, t0.Add(50*time.Millisecond))
	l.Renew(g1, t0) // never shortens
	if !l.Held(g1, t0.Add(120*time.Millisecond)) {
		t.Fatal("a renewal at an earlier time shortened g1's lease")
	}
	if !l.Held(g0, t0.Add(99*time.Millisecond)) || l.Held(g0, t0.Add(100*time.Millisecond)) {
		t.Fatal("g0's lease: want held until t0+100ms, not at it")
	}
	if n := l.Next(t0); !n.Equal(t0.Add(100 * time.Millisecond)) {
		t.Fatalf("Next = %v", n)
	}
	if got := l.Expired(t0.Add(99 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("Expired before any lapse: %v", got)
	}
	if got := l.Expired(t0.Add(200 * time.Millisecond)); !slices.Equal(got, []messages.PeerID{g0, g1}) {
		t.Fatalf("Expired = %v, want [g0 g1]", got)
	}
	if got := l.Expired(t0.Add(300 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("a lapse reported twice: %v", got)
	}
	l.Renew(g0, t0.Add(300*time.Millisecond))
	if !l.Held(g0, t0.Add(350*time.Millisecond)) || l.Held(g1, t0.Add(350*time.Millisecond)) {
		t.Fatal("after g0's renewal: want g0 held, g1 not")
	}
	if got := l.Expired(t0.Add(400 * time.Millisecond)); !slices.Equal(got, []messages.PeerID{g0}) {
		t.Fatalf("Expired after the renewal lapsed = %v, want [g0]", got)
	}
	off := NewPeerLeases(0)
	off.Renew(g0, t0)
	if !off.Held(g1, t0) || len(off.Expired(t0.Add(time.Hour))) != 0 {
		t.Fatal("leases off: every peer must be held, none lapse")
	}
}
