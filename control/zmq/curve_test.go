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
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret, AllowedPeers: []string{kb.public}}})
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

// A key admitted later with AllowKey gets through on a new Conn. (libzmq
// ends a session refused by ZAP for good: the refused Conn never retries.)
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
	if err := a.link.AllowKey(kb.public); err != nil {
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
	waitFor(t, patience, "the frame after AllowKey", func() bool { return a.in.len() == 1 })
	if r := a.in.snapshot()[0].(*messages.Result); r.RequestID != "req-1" {
		t.Fatalf("delivered %+v, want the new Conn's frame", r)
	}
}

// A client that expects the wrong server key never completes the
// handshake (the server is not who it claims): nothing is delivered.
func TestCurveWrongServerKeyNeverConnects(t *testing.T) {
	ka, kb, wrong := newKeys(t), newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret, AllowedPeers: []string{kb.public}}})
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
// it is alive: an allowed peer cannot say Hello as another.
func TestCurveHelloCannotClaimAnotherPeersID(t *testing.T) {
	ka, kb, km := newKeys(t), newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret, AllowedPeers: []string{kb.public, km.public}}})
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
	h, err := a.link.Hello(b.id)
	if err != nil || string(h.AgentAddr) != "agent-1" {
		t.Fatalf("Hello(%s) = %+v, %v; want the genuine one", b.id, h, err)
	}
	if n := a.in.len(); n != 0 {
		t.Fatalf("delivered %d frames from the mimic", n)
	}
}
