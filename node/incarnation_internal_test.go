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
