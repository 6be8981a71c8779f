package node

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/messages"
)

// A configured peer's "parallel" is not checked against the layout when
// the config is read (only tp and pp ≥ 1, and the rank inside them): one
// with "stages" and a PP that splits no layers reaches checkPeerPlace at
// the peer's Hello, which must name the mismatch, not panic (Normal sized
// a slice by the PP: a PP of 2^62 was a panic of the node's goroutine
// that took the Hello, a PP of 10^10 an attempt at 80 GB).
func TestCheckPeerPlaceOfAPipelineSplitOfNoLayers(t *testing.T) {
	p := Peer{Instance: "ctx", Parallel: Parallel{TP: 1, PP: 1 << 62, Stages: "32"}}
	h := &messages.Hello{From: messages.PeerID{Instance: "ctx"}, Parallel: messages.Parallel{TP: 1, PP: 1}}
	err := checkPeerPlace(p, h, 32)
	if !errors.Is(err, kvxfer.ErrMismatch) || !strings.Contains(err.Error(), "PP4611686018427387904") {
		t.Fatalf("checkPeerPlace: %v, want ErrMismatch naming the configured PP", err)
	}
}

// A peer whose Hello spells out the default split of its pipeline stages
// ("16,16" for 32 layers at PP2) runs as one that leaves it to the
// default, as its config gives it: no mismatch. (Checked to fail: the
// Hello's Stages were compared as they came, and checkPeerPlace named
// TP1/PP2(16,16) against TP1/PP2.)
func TestCheckPeerPlaceOfTheDefaultSplitSpelledOut(t *testing.T) {
	h := &messages.Hello{From: messages.PeerID{Instance: "ctx", Rank: 1}, Parallel: messages.Parallel{TP: 1, PP: 2, Stages: "16,16"}, PP: 1}
	for _, stages := range []string{"", "16,16"} {
		p := Peer{Instance: "ctx", Parallel: Parallel{TP: 1, PP: 2, Stages: stages}, Rank: Rank{PP: 1}}
		if err := checkPeerPlace(p, h, 32); err != nil {
			t.Errorf("checkPeerPlace of a Hello of TP1/PP2(16,16), configured %v: %v, want nil", p.Parallel, err)
		}
	}
	// Another split is still one.
	h.Parallel.Stages = "15,17"
	p := Peer{Instance: "ctx", Parallel: Parallel{TP: 1, PP: 2}, Rank: Rank{PP: 1}}
	if err := checkPeerPlace(p, h, 32); !errors.Is(err, kvxfer.ErrMismatch) || !strings.Contains(err.Error(), "15,17") {
		t.Errorf("checkPeerPlace of a Hello of TP1/PP2(15,17), configured TP1/PP2: %v, want ErrMismatch naming 15,17", err)
	}
}
