package zmq

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testlog"
	"github.com/kvxfer/kvxfer/messages"
)

// RemovePeer closes the heartbeat socket and monitor of each peer it
// forgets (they are dialled no more), and frees its name: a peer under the
// same name with another key is accepted at once, while the departed
// key's connection is still heard (its last Result is delivered).
func TestRemovePeerClosesItsSocketsAndFreesTheName(t *testing.T) {
	const beat = 20 * time.Millisecond
	ka, kb, kb2 := newKeys(t), newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret}, HeartbeatInterval: beat, HeartbeatMisses: 1000})
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}, HeartbeatInterval: beat, HeartbeatMisses: 1000})
	for _, k := range []string{kb.public, kb2.public} {
		if err := a.link.AllowKey(k); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.link.AllowKey(ka.public); err != nil {
		t.Fatal(err)
	}
	introduce(t, a, b)
	introduce(t, b, a)
	waitFor(t, patience, "b's Hello at a", func() bool { _, err := a.link.Hello(b.id); return err == nil })
	waitFor(t, patience, "a beating b", func() bool { return a.link.Beating() == 1 })

	// Peers that came and went: each costs a heartbeat socket and a
	// monitor while in the directory, nothing once removed.
	const ghosts = 30
	start := testlog.OpenFDs(t)
	for i := range ghosts {
		id := pid(fmt.Sprintf("ghost%d", i), 0)
		if err := a.link.AddPeer(id, "tcp://127.0.0.1:1"); err != nil {
			t.Fatal(err)
		}
		if err := a.link.SetPeerServerKey(id, newKeys(t).public); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, patience, "heartbeat sockets for the ghosts", func() bool { return a.link.Beating() == 1+ghosts })
	if n := testlog.OpenFDs(t); n < start+ghosts {
		t.Fatalf("%d ghosts in the directory: %d fds, %d before: the test counts nothing", ghosts, n, start)
	}
	for i := range ghosts {
		a.link.RemovePeer(pid(fmt.Sprintf("ghost%d", i), 0))
	}
	waitFor(t, patience, "the ghosts' sockets closed", func() bool { return a.link.Beating() == 1 && testlog.OpenFDs(t) <= start+2 })
	if _, err := a.link.PeerState(pid("ghost0", 0)); err == nil {
		t.Fatal("PeerState of a removed peer: no error")
	}

	// b leaves; its connection may still send its last frames.
	old, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Send(result(b.id, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "b's first Result", func() bool { return len(a.in.from(b.id)) == 1 })
	a.link.RemovePeer(b.id)
	waitFor(t, patience, "b's heartbeat socket closed", func() bool { return a.link.Beating() == 0 })
	if err := old.Send(result(b.id, 2)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the departed b's last Result", func() bool { return len(a.in.from(b.id)) == 2 })

	// A new incarnation under b's name with another key, while the old
	// one still lives, is accepted within a few beats.
	b2 := listen(t, b.id, Config{Curve: Curve{Secret: kb2.secret}, HeartbeatInterval: beat, HeartbeatMisses: 1000})
	if err := b2.link.AllowKey(ka.public); err != nil {
		t.Fatal(err)
	}
	introduce(t, a, b2)
	introduce(t, b2, a)
	waitFor(t, patience, "a beating the new b", func() bool { return a.link.Beating() == 1 })
	c, err := b2.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(result(b.id, 3)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*beat, "the new b's Result", func() bool { return len(a.in.from(b.id)) == 3 })
	if r := a.link.Stats().Rejected[RejectTaken]; r != 0 {
		t.Fatalf("%d Hellos of the new b refused as taken", r)
	}
	waitFor(t, patience, "a's connection to the new b up", func() bool {
		st, err := a.link.PeerState(b.id)
		return err == nil && st.Conn == ConnUp
	})
}

// A full directory makes room for a new peer's Hello by forgetting a peer
// that only a Hello put there and that is down (missed its heartbeats),
// never one that is alive or one the caller added (AddPeer): before, a
// link that had heard 4096 names refused every new peer for good.
func TestFullDirectoryForgetsADownPeerKnownOnlyFromItsHello(t *testing.T) {
	old := maxPeers
	maxPeers = 2
	t.Cleanup(func() { maxPeers = old }) // after the links' cleanups: they read it
	// Silence is judged by a clock the test moves: nobody goes down
	// unless it does.
	clock := &fakeClock{}
	clock.advance(time.Hour)
	ka, ks := newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret}, HeartbeatInterval: time.Hour, HeartbeatMisses: 3, Clock: clock.now})
	static := listen(t, pid("static", 0), Config{Curve: Curve{Secret: ks.secret}, HeartbeatInterval: -1})
	introduce(t, a, static) // the caller's own: never forgotten
	if err := static.link.AllowKey(ka.public); err != nil {
		t.Fatal(err)
	}
	// say has peer id say Hello to a on a connection of its own (b knows
	// a; a learns it from the Hello only), and returns its link.
	say := func(id messages.PeerID) *Link {
		kb := newKeys(t)
		if err := a.link.AddIdentity(Identity{PublicKey: kb.public, Instance: id.Instance}); err != nil {
			t.Fatal(err)
		}
		b := listen(t, id, Config{Curve: Curve{Secret: kb.secret}, HeartbeatInterval: -1})
		introduce(t, b, a)
		c, err := b.link.Dial(a.id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.Send(result(id, 1)); err != nil {
			t.Fatal(err)
		}
		return b.link
	}
	heard := func(id messages.PeerID) func() bool {
		return func() bool { _, err := a.link.Hello(id); return err == nil }
	}
	say(pid("gen", 1))
	waitFor(t, patience, "gen/1's Hello at a", heard(pid("gen", 1)))
	// The directory (static, gen/1) is full and gen/1 is alive: gen/2 is
	// refused.
	rejected := a.link.Rejected()
	say(pid("gen", 2))
	waitFor(t, patience, "gen/2's Hello refused, the directory full", func() bool { return a.link.Rejected() > rejected })
	if heard(pid("gen", 2))() {
		t.Fatal("gen/2 took the place of a live peer")
	}
	// gen/1 (and gen/2's connection) go silent for three hours and are
	// declared down at the listener's next poll, which gen/3's Hello
	// brings: gen/3 takes gen/1's place.
	clock.advance(4 * time.Hour)
	say(pid("gen", 3))
	waitFor(t, patience, "gen/3's Hello at a, in gen/1's place", heard(pid("gen", 3)))
	if _, err := a.link.PeerState(static.id); err != nil {
		t.Fatalf("the caller's peer was forgotten: %v", err)
	}
}
