package actors

import (
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

var addrKeySink string

// TestAddrKeyReusesThePeersKey pins the worker's op path to no string
// conversion for an op to the address its peer's ops last went to: the
// key is the one peerKey holds. Another address (a restarted peer's new
// agent) still gets a key of its own, with its own bytes.
func TestAddrKeyReusesThePeersKey(t *testing.T) {
	peer := messages.PeerID{Instance: "gen", Rank: 3}
	const addr = "loopback-agent-0123456789abcdef0123456789abcdef"
	s := &workerSlot{peerKey: map[messages.PeerID]string{peer: addr}}
	r := &Route{Peer: peer, AgentAddr: []byte(addr)}
	if got := s.addrKey(r); got != addr {
		t.Fatalf("addrKey = %q, want %q", got, addr)
	}
	if n := testing.AllocsPerRun(100, func() { addrKeySink = s.addrKey(r) }); n != 0 {
		t.Fatalf("addrKey of the peer's known address allocates %v objects, want 0", n)
	}
	moved := &Route{Peer: peer, AgentAddr: []byte(addr + "-restarted")}
	if got := s.addrKey(moved); got != addr+"-restarted" {
		t.Fatalf("addrKey of a new address = %q, want %q", got, addr+"-restarted")
	}
	other := &Route{Peer: messages.PeerID{Instance: "gen", Rank: 4}, AgentAddr: []byte(addr)}
	if got := s.addrKey(other); got != addr {
		t.Fatalf("addrKey of another peer at the same address = %q, want %q", got, addr)
	}
}
