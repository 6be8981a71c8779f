package actors

import (
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// dialCountLink counts the Dials of each peer.
type dialCountLink struct {
	control.Link
	mu    sync.Mutex
	dials map[messages.PeerID]int
}

func (l *dialCountLink) Dial(peer messages.PeerID) (control.Conn, error) {
	l.mu.Lock()
	l.dials[peer]++
	l.mu.Unlock()
	return l.Link.Dial(peer)
}

func (l *dialCountLink) count(peer messages.PeerID) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dials[peer]
}

// TestPeerAliveWarmsEveryWorkersConn: a peer heard (PeerAlive, the link's
// report of its Hello and heartbeats) has every worker dial its control
// connection to it, once, and again after the peer's Down closed them.
// Before, the first frame to the peer dialled it, and over zmq found the
// connection not up yet: each worker's first RequestData was refused
// (FramesUnsent) and re-sent 20 ms later — every `kvxfer demo --processes
// 2` reported frames_unsent 4 for a clean run. (Checked to fail without
// the workerWarm: no dial within 10 s.)
func TestPeerAliveWarmsEveryWorkersConn(t *testing.T) {
	link := &dialCountLink{Link: control.NewMemLink(), dials: map[messages.PeerID]int{}}
	r := startTestRank(t, "gen-warm", link)
	workers := len(r.e.env.workers)
	peer := messages.PeerID{Instance: "ctx-warm"}
	dialled := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for link.count(peer) < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d dials of %s within 10s, want %d (one per worker)", link.count(peer), peer, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	r.e.PeerAlive(peer)
	r.e.PeerAlive(peer) // heard again: nothing more to dial
	dialled(workers)
	// Down closes each worker's connection; heard again, each dials anew.
	r.e.PeerDown(peer, "missed its heartbeats")
	r.e.PeerAlive(peer)
	dialled(2 * workers)
	if got := link.count(peer); got != 2*workers {
		t.Fatalf("%d dials of %s, want %d: each worker once a warm-up", got, peer, 2*workers)
	}
}
