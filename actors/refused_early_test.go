package actors

import (
	"fmt"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// TestRefusedBeforeSendIsBounded: the memory of RequestData refused before
// Send keeps one entry per request id, the last refusal's, and at most
// refusedBeforeSendN ids, the oldest going first; take forgets an id, and
// an id added again after take is not dropped early by its old slot.
func TestRefusedBeforeSendIsBounded(t *testing.T) {
	var u refusedBeforeSend
	peer := messages.PeerID{Instance: "gen", Rank: 0}
	for i := range 3 * refusedBeforeSendN {
		u.add(fmt.Sprint("r", i), TxRefused{From: peer, Why: "first"})
		u.add(fmt.Sprint("r", i), TxRefused{From: peer, Why: "last"})
	}
	if len(u.byID) != refusedBeforeSendN || len(u.order) != refusedBeforeSendN {
		t.Fatalf("%d ids, %d in order, want at most %d", len(u.byID), len(u.order), refusedBeforeSendN)
	}
	if _, ok := u.take("r0"); ok {
		t.Fatal("the oldest id was kept past the bound")
	}
	newest := fmt.Sprint("r", 3*refusedBeforeSendN-1)
	if r, ok := u.take(newest); !ok || r.Why != "last" {
		t.Fatalf("newest id: %+v %v, want the last refusal", r, ok)
	}
	if _, ok := u.take(newest); ok {
		t.Fatal("take did not forget the id")
	}
	u.add(newest, TxRefused{From: peer, Why: "again"})
	for i := range refusedBeforeSendN - 1 {
		u.add(fmt.Sprint("s", i), TxRefused{From: peer})
	}
	if r, ok := u.get(newest); !ok || r.Why != "again" || len(u.order) != refusedBeforeSendN {
		t.Fatalf("id added again after take: %+v %v (%d in order), want kept", r, ok, len(u.order))
	}
}
