package node

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/messages"
)

// TestOtherIncarnationOnlyOfADepartedRecord: a peer's Hello is taken for
// another incarnation's than the record etcd holds only when its
// incarnation is one whose record left etcd. A node of an earlier version
// registered another incarnation than its Hello's: that Hello ties to no
// record and is taken as before, so a cluster upgrades without its new
// nodes waiting out the old ones' Hellos. A Hello without an incarnation,
// or of the record's, is the record's. The memory of departed
// incarnations is bounded per peer.
func TestOtherIncarnationOnlyOfADepartedRecord(t *testing.T) {
	n := &Node{pastIncs: map[messages.PeerID][]uint64{}}
	id := messages.PeerID{Instance: "ctx"}
	rec := discovery.Record{Instance: "ctx", Incarnation: 20}
	hello := func(inc uint64) *messages.Hello { return &messages.Hello{From: id, Incarnation: inc} }
	for _, inc := range []uint64{0, 20, 10, 30} {
		if err := n.otherIncarnation(id, hello(inc), rec); err != nil {
			t.Fatalf("Hello of incarnation %d, no departed record: %v, want it taken", inc, err)
		}
	}
	n.notePastLocked(id, 10)
	var oi *otherIncarnationError
	if err := n.otherIncarnation(id, hello(10), rec); !errors.As(err, &oi) || oi.Hello != 10 || oi.Record != 20 {
		t.Fatalf("Hello of departed incarnation 10: %v, want an otherIncarnationError of 10 against 20", err)
	}
	if err := n.otherIncarnation(messages.PeerID{Instance: "ctx", Rank: 1}, hello(10), rec); err != nil {
		t.Fatalf("another rank's Hello of incarnation 10: %v, want it taken (10 departed as ctx/0's)", err)
	}
	for inc := uint64(100); inc < 100+2*maxPastIncs; inc++ {
		n.notePastLocked(id, inc)
	}
	if got := len(n.pastIncs[id]); got != maxPastIncs {
		t.Fatalf("%d departed incarnations remembered, want at most %d", got, maxPastIncs)
	}
	if err := n.otherIncarnation(id, hello(100+2*maxPastIncs-1), rec); err == nil {
		t.Fatalf("the latest departed incarnation's Hello taken for the record's")
	}
}

// TestDepartedPeersAreBounded: the node remembers the departures (and the
// departed incarnations) of at most maxDepartedPeers peers, the ones that
// left last: a long-lived node whose peers come and go under new names
// (an autoscaled instance per pod) does not grow without bound. A peer
// that leaves again is the latest to have left. (Checked to fail: every
// peer that ever left stayed in pastIncs and departed.)
func TestDepartedPeersAreBounded(t *testing.T) {
	old := maxDepartedPeers
	maxDepartedPeers = 4
	t.Cleanup(func() { maxDepartedPeers = old })
	n := &Node{pastIncs: map[messages.PeerID][]uint64{}, departed: map[messages.PeerID]departure{},
		found: map[messages.PeerID]*found{}, agents: map[messages.PeerID]helloAgent{}}
	leave := func(r int32, inc uint64) {
		id := messages.PeerID{Instance: "ctx", Rank: r}
		n.departed[id] = departure{reason: "left"}
		n.agents[id] = helloAgent{inc: inc, addr: []byte("agent")}
		n.notePastLocked(id, inc)
	}
	// ctx/2 left and came back (found again): its agent address stays
	// when its departure is forgotten.
	n.found[messages.PeerID{Instance: "ctx", Rank: 2}] = &found{}
	for r := int32(0); r < 4; r++ {
		leave(r, 10)
	}
	leave(0, 11) // ctx/0 again: now the latest to leave, ctx/1 the oldest
	for r := int32(4); r < 7; r++ {
		leave(r, 10)
	}
	if len(n.pastIncs) != 4 || len(n.departed) != 4 {
		t.Fatalf("%d peers' departed incarnations and %d departures remembered, want %d each", len(n.pastIncs), len(n.departed), 4)
	}
	for _, r := range []int32{0, 4, 5, 6} {
		id := messages.PeerID{Instance: "ctx", Rank: r}
		if _, ok := n.pastIncs[id]; !ok {
			t.Errorf("%s, among the 4 that left last, forgotten", id)
		}
		if _, ok := n.departed[id]; !ok {
			t.Errorf("%s's departure, among the 4 latest, forgotten", id)
		}
	}
	for _, r := range []int32{1, 3} {
		if _, ok := n.agents[messages.PeerID{Instance: "ctx", Rank: r}]; ok {
			t.Errorf("ctx/%d's agent address kept after its departure was forgotten", r)
		}
	}
	if len(n.agents) != 5 {
		t.Errorf("%d agent addresses kept, want 5 (the 4 latest to leave, and ctx/2, found again)", len(n.agents))
	}
	if got := n.pastIncs[messages.PeerID{Instance: "ctx"}]; len(got) != 2 {
		t.Errorf("ctx/0's departed incarnations %v, want 10 and 11", got)
	}
}
