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
