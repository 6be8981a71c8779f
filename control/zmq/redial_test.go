package zmq

import (
	"testing"
	"time"
)

// A heartbeat socket refused at authentication stays refused (libzmq does
// not retry); once the peer admits the key, Redial makes it dial again and
// the Hello gets through. PeerState says connecting from the Redial until
// the new connection reports. (Checked to fail: without the Redial call
// the Hello never arrives; without Redial's reset of the state, PeerState
// still says what the old connection said.)
func TestRedialAfterRefusal(t *testing.T) {
	ka, kb := newKeys(t), newKeys(t)
	beat := Config{HeartbeatInterval: 50 * time.Millisecond}
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret}, HeartbeatInterval: beat.HeartbeatInterval})
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}, HeartbeatInterval: beat.HeartbeatInterval})
	introduce(t, b, a) // b beats a, which does not admit b's key yet
	waitFor(t, patience, "b's heartbeat to be refused", func() bool {
		st, err := b.link.PeerState(a.id)
		return err == nil && st.Conn == ConnHandshakeFailed
	})
	if err := a.link.AddIdentity(Identity{PublicKey: kb.public, Instance: b.id.Instance}); err != nil {
		t.Fatal(err)
	}
	if err := b.link.Redial(a.id); err != nil {
		t.Fatal(err)
	}
	// What the refused connection said is no longer news.
	if st, err := b.link.PeerState(a.id); err != nil || st.Conn != ConnConnecting {
		t.Fatalf("PeerState right after Redial: %v %v, want connecting", st.Conn, err)
	}
	waitFor(t, patience, "b's Hello at a after Redial", func() bool {
		_, err := a.link.Hello(b.id)
		return err == nil
	})
	waitFor(t, patience, "b's new connection to a up", func() bool {
		st, err := b.link.PeerState(a.id)
		return err == nil && st.Conn == ConnUp
	})
	// A connection that is up is dialled again too, and says connecting
	// until the new one is up: its state was the old connection's.
	if err := b.link.Redial(a.id); err != nil {
		t.Fatal(err)
	}
	if st, err := b.link.PeerState(a.id); err != nil || st.Conn != ConnConnecting {
		t.Fatalf("PeerState right after a Redial of an up connection: %v %v, want connecting", st.Conn, err)
	}
	waitFor(t, patience, "b's connection to a up again", func() bool {
		st, err := b.link.PeerState(a.id)
		return err == nil && st.Conn == ConnUp
	})
	if err := b.link.Redial(pid("nobody", 0)); err == nil {
		t.Fatal("Redial of a peer not in the directory: nil error")
	}
}

// A heartbeat socket the peer refused at authentication because it did
// not know this link's key yet (a registry told it of this link a moment
// after this link dialed it) is dialed again on its own once the peer,
// having learned the key, says Hello on a connection of its own: no
// Redial is called, and the peer hears our Hello. The order is driven:
// the refusal is seen before the peer learns the key. (Checked to fail:
// without beatSock.readmitted, b never hears a's Hello, and a's
// PeerState stays "the peer refused our key".)
func TestRefusedHeartbeatDialsAgainOnThePeersHello(t *testing.T) {
	ka, kb := newKeys(t), newKeys(t)
	const hb = 50 * time.Millisecond
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret}, HeartbeatInterval: hb})
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}, HeartbeatInterval: hb})
	// a knows b from the start (a static peer: endpoint, key, admitted);
	// b knows nothing of a.
	if err := a.link.AddIdentity(Identity{PublicKey: kb.public, Instance: b.id.Instance}); err != nil {
		t.Fatal(err)
	}
	introduce(t, a, b)
	waitFor(t, patience, "a's heartbeat refused by b", func() bool {
		st, err := a.link.PeerState(b.id)
		return err == nil && st.Conn == ConnHandshakeFailed && st.Cause == CauseKeyRefused
	})
	// b learns a's record: admits its key and dials it.
	if err := b.link.AddIdentity(Identity{PublicKey: ka.public, Instance: a.id.Instance}); err != nil {
		t.Fatal(err)
	}
	introduce(t, b, a)
	waitFor(t, patience, "b's Hello at a", func() bool {
		_, err := a.link.Hello(b.id)
		return err == nil
	})
	waitFor(t, patience, "a's Hello at b, a's refused heartbeat dialed again", func() bool {
		_, err := b.link.Hello(a.id)
		return err == nil
	})
	waitFor(t, patience, "a's connection to b up", func() bool {
		st, err := a.link.PeerState(b.id)
		return err == nil && st.Conn == ConnUp
	})
	// The socket was made again once, after b admitted the key.
	if n := b.link.Refused(); n != 1 {
		t.Fatalf("b refused %d handshakes, want the 1 before it learned a's key", n)
	}
}

// readmitted: only a socket refused at authentication (ZAP) is made
// again, and only after the peer said Hello on a new connection since the
// socket was made; a peer that keeps refusing without connecting anew is
// not redialed.
func TestReadmitted(t *testing.T) {
	info := &peerInfo{}
	info.incarnation.Store(3)
	sock := func(conn ConnState, cause Cause) *beatSock {
		return &beatSock{info: info, peerConns: 3, watch: connWatch{state: PeerState{Conn: conn, Cause: cause}}}
	}
	refused := sock(ConnHandshakeFailed, CauseKeyRefused)
	if refused.readmitted() {
		t.Fatal("readmitted: a refused socket the peer has not connected to us since")
	}
	hungUp, up := sock(ConnHandshakeFailed, CauseHungUp), sock(ConnUp, CauseNone)
	info.incarnation.Add(1) // the peer said Hello on a new connection
	if !refused.readmitted() {
		t.Fatal("not readmitted: a refused socket the peer said Hello to us since")
	}
	if hungUp.readmitted() || up.readmitted() {
		t.Fatal("readmitted: a socket not refused at authentication")
	}
}
