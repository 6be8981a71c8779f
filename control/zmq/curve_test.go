package zmq

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// A peer whose key the listener allows gets through; one with an unknown
// key is refused at the handshake: its frames never arrive and its Hello
// is never stored.
func TestCurveRefusesUnknownKey(t *testing.T) {
	ka, kb, kc := newKeys(t), newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret, Identities: []Identity{{PublicKey: kb.public, Instance: "gen"}}}})
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}})
	c := listen(t, pid("evil", 0), Config{Curve: Curve{Secret: kc.secret}})
	introduce(t, b, a)
	introduce(t, c, a)

	evil, err := c.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	for i := range 10 {
		if err := evil.Send(result(c.id, i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, patience, "the unknown key's handshake to be refused", func() bool { return a.link.Refused() > 0 })

	good, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	for i := range 10 {
		if err := good.Send(result(b.id, i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, patience, "the allowed peer's frames", func() bool { return len(a.in.from(b.id)) == 10 })
	if got := a.in.from(c.id); len(got) != 0 {
		t.Fatalf("frames from an unknown key were delivered: %v", got)
	}
	if n := a.in.len(); n != 10 {
		t.Fatalf("delivered %d frames, want only the allowed peer's 10", n)
	}
	if _, err := a.link.Hello(c.id); !errors.Is(err, control.ErrPeerGone) {
		t.Fatalf("Hello(%s) of a refused peer: %v, want ErrPeerGone", c.id, err)
	}
	if _, err := a.link.Hello(b.id); err != nil {
		t.Fatalf("Hello(%s) of the allowed peer: %v", b.id, err)
	}
}

// A key admitted later with AddIdentity gets through on a new Conn.
// (libzmq ends a session refused by ZAP for good: the refused Conn never
// retries.)
func TestCurveAllowKeyAdmitsLater(t *testing.T) {
	ka, kb := newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret}})
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}})
	introduce(t, b, a)
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Send(result(b.id, 0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "a refusal", func() bool { return a.link.Refused() > 0 })
	if err := a.link.AddIdentity(Identity{PublicKey: kb.public, Instance: b.id.Instance, Ranks: []int32{b.id.Rank}}); err != nil {
		t.Fatal(err)
	}
	again, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := again.Send(result(b.id, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the frame after AddIdentity", func() bool { return a.in.len() == 1 })
	if r := a.in.snapshot()[0].(*messages.Result); r.RequestID != "req-1" {
		t.Fatalf("delivered %+v, want the new Conn's frame", r)
	}
}

// A client that expects the wrong server key never completes the
// handshake (the server is not who it claims): nothing is delivered.
func TestCurveWrongServerKeyNeverConnects(t *testing.T) {
	ka, kb, wrong := newKeys(t), newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret, Identities: []Identity{{PublicKey: kb.public, Instance: "gen"}}}})
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}})
	if err := b.link.AddPeer(a.id, a.link.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.link.Dial(a.id); !errors.Is(err, ErrNoServerKey) {
		t.Fatalf("Dial without a server key: %v, want ErrNoServerKey", err)
	}
	if err := b.link.SetPeerServerKey(a.id, wrong.public); err != nil {
		t.Fatal(err)
	}
	bad, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if err := bad.Send(result(b.id, 0)); err != nil {
		t.Fatal(err)
	}
	// The same peer with the right key is admitted; the wrong-key Conn's
	// frame, sent first, never is.
	if err := b.link.SetPeerServerKey(a.id, ka.public); err != nil {
		t.Fatal(err)
	}
	good, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if err := good.Send(result(b.id, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the right-key frame", func() bool { return a.in.len() >= 1 })
	for _, f := range a.in.snapshot() {
		if f.(*messages.Result).RequestID != "req-1" {
			t.Fatalf("a frame sent to the wrong server key arrived: %+v", f)
		}
	}
}

// In CURVE mode a PeerID stays bound to the key of its first Hello while
// it is alive: a key that may speak for the same instance (both are bound
// to "gen", a key rotation) cannot say Hello as a live peer of another key.
func TestCurveHelloCannotClaimAnotherPeersID(t *testing.T) {
	ka, kb, km := newKeys(t), newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret,
		Identities: []Identity{{PublicKey: kb.public, Instance: "gen"}, {PublicKey: km.public, Instance: "gen"}}}})
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}})
	introduce(t, b, a)
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, patience, "b's Hello", func() bool { _, err := a.link.Hello(b.id); return err == nil })

	// m is allowed, but says Hello as b.
	mimic, err := New(Config{Bind: "tcp://127.0.0.1:0", HeartbeatInterval: -1, Curve: Curve{Secret: km.secret}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer mimic.Close()
	fake := helloOf(b.id, "forged")
	if _, err := mimic.Listen(fake, func(messages.Frame) {}); err != nil {
		t.Fatal(err)
	}
	if err := mimic.AddPeer(a.id, a.link.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := mimic.SetPeerServerKey(a.id, ka.public); err != nil {
		t.Fatal(err)
	}
	mc, err := mimic.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	if err := mc.Send(result(b.id, 666)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the forged Hello and its frame to be rejected", func() bool { return a.link.Rejected() == 2 })
	st := a.link.Stats()
	if st.Rejected[RejectTaken] != 1 || st.Rejected[RejectNoHello] != 1 {
		t.Fatalf("rejections %v, want one taken (the Hello) and one no_hello (its frame)", st.Rejected)
	}
	h, err := a.link.Hello(b.id)
	if err != nil || string(h.AgentAddr) != "agent-1" {
		t.Fatalf("Hello(%s) = %+v, %v; want the genuine one", b.id, h, err)
	}
	if n := a.in.len(); n != 0 {
		t.Fatalf("delivered %d frames from the mimic", n)
	}
}

// TestCurveKeySpeaksOnlyForItsIdentity: a CURVE key is an identity, not
// just a permission. Each frame (Hello included) must name a sender its
// key is bound to — by Curve.Identities, or by being that peer's server
// key (PeerServerKeys, the legacy form) — else it is rejected with reason
// identity; a key bound to nothing speaks for no one.
//
// Regression (issue 15 item 2): before, any allowed key could say Hello as
// any PeerID not yet taken and speak for it. Checked by making keyPermits
// always true: the mimic's Hello as gen/5 is stored and its Result
// delivered, and the test fails.
func TestCurveKeySpeaksOnlyForItsIdentity(t *testing.T) {
	ka, kb, km, kx := newKeys(t), newKeys(t), newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret,
		Identities:     []Identity{{PublicKey: kb.public, Instance: "gen", Ranks: []int32{0}}},
		AllowedPeers:   []string{km.public, kx.public},
		PeerServerKeys: map[messages.PeerID]string{pid("mimic", 0): km.public}}})
	// speak makes a link with key k that says Hello as id, and sends one
	// Result from each of from (its own id when none).
	speak := func(id messages.PeerID, k keypair, from ...messages.PeerID) {
		t.Helper()
		n := listen(t, id, Config{Curve: Curve{Secret: k.secret}})
		introduce(t, n, a)
		conn, err := n.link.Dial(a.id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if len(from) == 0 {
			from = []messages.PeerID{id}
		}
		for i, p := range from {
			if err := conn.Send(result(p, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	speak(pid("gen", 0), kb, pid("gen", 0), pid("gen", 1)) // its own rank, then one it is not bound to
	speak(pid("gen", 5), km)                               // a rank of another instance: mimicry
	speak(pid("x", 0), kx)                                 // allowed, bound to nothing
	speak(pid("mimic", 0), km)                             // bound by PeerServerKeys

	waitFor(t, patience, "the honest frames and 5 rejections", func() bool {
		return len(a.in.from(pid("gen", 0))) == 1 && len(a.in.from(pid("mimic", 0))) == 1 && a.link.Rejected() >= 5
	})
	st := a.link.Stats()
	if st.Rejected[RejectIdentity] != 5 || a.link.Rejected() != 5 {
		t.Fatalf("rejections %v, want 5 for identity: gen/1 from gen/0's key, Hello and Result as gen/5 "+
			"from mimic/0's key, Hello and Result from a key bound to nothing", st.Rejected)
	}
	if n := a.in.len(); n != 2 {
		t.Fatalf("delivered %d frames, want 2: %v", n, a.in.snapshot())
	}
	for _, p := range []messages.PeerID{pid("gen", 5), pid("x", 0)} {
		if _, err := a.link.Hello(p); !errors.Is(err, control.ErrPeerGone) {
			t.Fatalf("Hello(%s) from a key not bound to it: %v, want ErrPeerGone", p, err)
		}
	}
	if got := a.link.FramesRejected()["identity"]; got != 5 {
		t.Fatalf(`FramesRejected()["identity"] = %d, want 5`, got)
	}
}
