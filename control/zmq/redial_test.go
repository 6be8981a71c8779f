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
