package zmq

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// FuzzListenerHandle feeds a bare listener (no sockets) arbitrary frames
// on a few connections, interleaved with silence, removals and goodbyes
// acted on, with small bounds: nothing a peer sends may panic, and the
// bindings stay within their bounds and in step with their index by
// identity.
func FuzzListenerHandle(f *testing.F) {
	peers := []messages.PeerID{pid("gen", 0), pid("gen", 1), pid("dec", 0)}
	for i, p := range peers {
		h := helloOf(p, "a")
		h.Incarnation = uint64(i + 1)
		for _, fr := range []messages.Frame{h, &messages.Heartbeat{From: p, Seq: 1},
			&messages.Heartbeat{From: p, Seq: 2, FromIncarnation: uint64(i + 1), Leaving: true}, frameOf(p, i), frameOf(p, i+1)} {
			b, err := encode(fr)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(byte(i), byte(0), b)
		}
	}
	f.Add(byte(0), byte(1), []byte{})
	f.Add(byte(1), byte(2), []byte{1})

	oldConns, oldPer, oldPeers, oldGhosts := maxConns, maxConnsPerIdentity, maxPeers, maxGhosts
	maxConns, maxConnsPerIdentity, maxPeers, maxGhosts = 6, 3, 4, 3
	f.Cleanup(func() { maxConns, maxConnsPerIdentity, maxPeers, maxGhosts = oldConns, oldPer, oldPeers, oldGhosts })
	clock := &fakeClock{}
	clock.advance(time.Hour)
	l, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: time.Second, HeartbeatMisses: 3,
		Clock: clock.now, OnPeerAlive: func(messages.PeerID) {}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { l.Close() })
	self := pid("ctx", 0)
	l.mu.Lock()
	l.self = helloOf(self, "self")
	l.mu.Unlock()
	s := &listener{l: l, self: self, deliver: func(messages.Frame) {}, conns: map[string]*binding{}, live: newLiveness(l.liveTimeout())}

	f.Fuzz(func(t *testing.T, conn, op byte, payload []byte) {
		switch op % 8 {
		case 1:
			clock.advance(time.Duration(1+int(conn)%8) * time.Second)
			s.afterWait()
		case 2:
			l.RemovePeerIncarnation(peers[int(conn)%len(peers)], uint64(len(payload)%4))
		case 3:
			_ = l.AddPeer(peers[int(conn)%len(peers)], "tcp://127.0.0.1:1")
		default:
			s.handle(fmt.Sprintf("c%d", conn%16), payload, "", 1)
			if op%8 == 4 {
				s.goodbyes()
			}
		}
		if len(s.conns) > maxConns {
			t.Fatalf("%d bindings, maxConns %d", len(s.conns), maxConns)
		}
		if len(s.ghosts) > maxGhosts+1 {
			t.Fatalf("%d ghosts, maxGhosts %d", len(s.ghosts), maxGhosts)
		}
		held := 0
		for id, g := range s.ghosts {
			if len(g.held) > 0 && s.conns[id] != nil {
				t.Fatalf("bound connection %x still holds %d frames", id, len(g.held))
			}
			if len(g.held) > maxHeldPerConn {
				t.Fatalf("connection %x holds %d frames, at most %d", id, len(g.held), maxHeldPerConn)
			}
			for _, p := range g.held {
				held += len(p)
			}
		}
		if held != s.heldBytes || held > maxHeldBytes {
			t.Fatalf("held frames of %d bytes, heldBytes %d (at most %d)", held, s.heldBytes, maxHeldBytes)
		}
		n := 0
		for o, m := range s.owned {
			if len(m) > maxConnsPerIdentity {
				t.Fatalf("%s holds %d bindings, at most %d", o, len(m), maxConnsPerIdentity)
			}
			for id, b := range m {
				if s.conns[id] != b {
					t.Fatalf("owned binding %x of %s not in conns", id, o)
				}
				n++
			}
		}
		if n != len(s.conns) {
			t.Fatalf("%d bindings by identity, %d in all", n, len(s.conns))
		}
	})
}
