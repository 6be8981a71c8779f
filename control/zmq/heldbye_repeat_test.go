package zmq

import (
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// TestGoodbyesWaitingBehindHeldFramesAreBounded: while a goodbye waits
// behind its incarnation's held frames (up to ghostKeep), the peer's
// connection is still bound and may say goodbye again and again: each
// repeat must not add a pending goodbye (s.byes grew by one per frame,
// for a minute, each scanned against every ghost at every wait), and the
// goodbye is still acted on once, drained, after the held Result.
func TestGoodbyesWaitingBehindHeldFramesAreBounded(t *testing.T) {
	f := heldFixture(t)
	gen := pid("gen", 0)
	drained := 0
	f.s.l.cfg.OnPeerDrained = func(messages.PeerID, uint64) { drained++ }
	f.s.handle("c3", mustEncode(t, result(gen, 1)), "", 1) // held: no room for c3
	for i := range 1000 {
		bye := &messages.Heartbeat{From: gen, Seq: uint64(i + 1), Leaving: true, Drained: i == 0}
		for _, b := range f.s.conns {
			b.probedAt = time.Now() // still no room for c3, however slow this loop
		}
		f.s.handle("c1", mustEncode(t, bye), "", 1)
		f.s.afterWait()
	}
	if n := len(f.s.byes); n > 1 {
		t.Fatalf("%d goodbyes pending on one connection, want at most 1", n)
	}
	oldProbes(f)
	f.s.afterWait()
	if len(f.s.byes) != 0 || drained != 1 {
		t.Fatalf("after the held Result: %d goodbyes pending, OnPeerDrained told %d times; want 0 and 1 (the first goodbye said drained)", len(f.s.byes), drained)
	}
}
