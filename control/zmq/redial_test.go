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

// dialRefused makes a listening a and b, b refusing a's key, and a Conn
// from a to b whose handshake b's ZAP handler refused (a's heartbeats are
// off, so b's one refusal is the Conn's), with a Result queued in its
// backlog behind its Hello: terminal frames wait for the connection. a
// admits b's key from the start.
func dialRefused(t *testing.T, bBeats time.Duration) (a, b *node, ka keypair, c *Conn) {
	t.Helper()
	ka, kb := newKeys(t), newKeys(t)
	a = listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret}})
	b = listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}, HeartbeatInterval: bBeats})
	if err := a.link.AddIdentity(Identity{PublicKey: kb.public, Instance: b.id.Instance}); err != nil {
		t.Fatal(err)
	}
	introduce(t, a, b)
	cc, err := a.link.Dial(b.id)
	if err != nil {
		t.Fatal(err)
	}
	c = cc.(*Conn)
	t.Cleanup(func() { c.Close() })
	waitFor(t, patience, "b to refuse a's Conn", func() bool { return b.link.Refused() == 1 })
	if err := c.Send(result(a.id, 1)); err != nil {
		t.Fatalf("a Result on a Conn not up: %v, want it backlogged", err)
	}
	return a, b, ka, c
}

// A Conn that dialed a peer while the peer refused its key (a registry
// told the peer of this link a moment after this link dialed it) is
// dialed again once the peer, having learned the key, says Hello on a
// connection of its own: libzmq never retries a session refused at
// authentication, and the Conn's frames, its Hello and a Result queued
// behind it, reach the peer on the new connection, in order. (Checked to
// fail: without Conn.redialLocked the Result never reached b.)
func TestRefusedConnDialsAgainOnThePeersHello(t *testing.T) {
	a, b, ka, c := dialRefused(t, 50*time.Millisecond)
	// b learns a's record: admits its key and dials it (its heartbeat says
	// Hello to a on a new connection).
	if err := b.link.AllowKey(ka.public); err != nil {
		t.Fatal(err)
	}
	introduce(t, b, a)
	waitFor(t, patience, "b's Hello at a", func() bool {
		_, err := a.link.Hello(b.id)
		return err == nil
	})
	waitFor(t, patience, "the Result on a's refused Conn at b", func() bool {
		return len(b.in.from(a.id)) == 1
	})
	if err := c.Send(result(a.id, 2)); err != nil {
		t.Fatalf("Send on the Conn dialed again: %v", err)
	}
	waitFor(t, patience, "the second Result at b", func() bool {
		return len(b.in.from(a.id)) == 2
	})
	if got := b.in.from(a.id); got[0].Request() != "req-1" || got[1].Request() != "req-2" {
		t.Fatalf("b got %s then %s, want req-1 then req-2", got[0].Request(), got[1].Request())
	}
	if n := b.link.Refused(); n != 1 {
		t.Fatalf("b refused %d handshakes, want the Conn's 1 before it admitted a's key", n)
	}
}

// Redial dials a Conn refused at authentication again too: a peer that
// admitted this link's key without ever saying Hello to it (it does not
// dial this link) is reached again that way. (Checked to fail: without
// Redial reaching Conns, the Result never reached b.)
func TestRedialDialsARefusedConnAgain(t *testing.T) {
	a, b, ka, _ := dialRefused(t, -1)
	if err := b.link.AddIdentity(Identity{PublicKey: ka.public, Instance: a.id.Instance}); err != nil {
		t.Fatal(err)
	}
	if err := a.link.Redial(b.id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the Result on a's refused Conn at b after Redial", func() bool {
		return len(b.in.from(a.id)) == 1
	})
}
