package zmq

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// pair makes two listening links that know each other, insecure or with
// CURVE keys that admit each other.
func pair(t *testing.T, secure bool, cfg Config) (a, b *node) {
	t.Helper()
	ca, cb := cfg, cfg
	ca.Insecure, cb.Insecure = !secure, !secure
	if secure {
		ka, kb := newKeys(t), newKeys(t)
		ca.Curve = Curve{Public: ka.public, Secret: ka.secret, AllowedPeers: []string{kb.public}}
		cb.Curve = Curve{Secret: kb.secret, AllowedPeers: []string{ka.public}}
	}
	a = listen(t, pid("ctx", 0), ca)
	b = listen(t, pid("gen", 0), cb)
	introduce(t, a, b)
	introduce(t, b, a)
	return a, b
}

func mode(secure bool) string {
	if secure {
		return "curve"
	}
	return "insecure"
}

func TestFramesArriveInOrder(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			a, b := pair(t, secure, Config{HeartbeatInterval: 50 * time.Millisecond, HeartbeatMisses: 100})
			const n = 1000
			conn, err := b.link.Dial(a.id)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			for i := range n {
				if err := conn.Send(result(b.id, i)); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			waitFor(t, patience, fmt.Sprintf("%d frames", n), func() bool { return a.in.len() >= n })
			got := a.in.snapshot()
			if len(got) != n {
				t.Fatalf("delivered %d frames, want %d", len(got), n)
			}
			for i, f := range got {
				r, ok := f.(*messages.Result)
				if !ok || r.RequestID != fmt.Sprintf("req-%d", i) || r.From != b.id {
					t.Fatalf("frame %d = %#v, want Result req-%d from %s", i, f, i, b.id)
				}
			}
			h, err := a.link.Hello(b.id)
			if err != nil {
				t.Fatalf("Hello(%s) after it dialled: %v", b.id, err)
			}
			if h.From != b.id || string(h.AgentAddr) != "agent-1" {
				t.Fatalf("Hello(%s) = %+v", b.id, h)
			}
			if r := a.link.Rejected(); r != 0 {
				t.Fatalf("%d frames rejected on an honest link", r)
			}
		})
	}
}

func TestHelloKnownOnlyAfterPeerDialled(t *testing.T) {
	a := listen(t, pid("ctx", 0), Config{Insecure: true})
	b := listen(t, pid("gen", 3), Config{Insecure: true})
	introduce(t, b, a)
	if _, err := a.link.Hello(b.id); !errors.Is(err, control.ErrPeerGone) {
		t.Fatalf("Hello(%s) before any contact: %v, want ErrPeerGone", b.id, err)
	}
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, patience, "the dialler's Hello", func() bool {
		_, err := a.link.Hello(b.id)
		return err == nil
	})
	h, _ := a.link.Hello(b.id)
	if h.From != b.id {
		t.Fatalf("Hello(%s).From = %s", b.id, h.From)
	}
	if self, err := a.link.Hello(a.id); err != nil || self.From != a.id {
		t.Fatalf("Hello(self) = %v, %v", self, err)
	}
	if a.in.len() != 0 {
		t.Fatalf("Hello was delivered as a frame: %v", a.in.snapshot())
	}
}

func TestIPCEndpoint(t *testing.T) {
	dir := t.TempDir()
	a := listen(t, pid("ctx", 0), Config{Insecure: true, Bind: "ipc://" + filepath.Join(dir, "a.sock")})
	b := listen(t, pid("gen", 0), Config{Insecure: true, Bind: "ipc://" + filepath.Join(dir, "b.sock")})
	introduce(t, b, a)
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Send(&messages.Cancel{RequestID: "r", Epoch: 1, From: b.id, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the Cancel", func() bool { return a.in.len() == 1 })
}

// A Conn says Hello again when its peer comes back as a new incarnation
// (a restart that forgot the Conn's Hello), so its frames get through.
func TestConnSaysHelloAgainAfterPeerRestart(t *testing.T) {
	dir := t.TempDir()
	endpoint := "ipc://" + filepath.Join(dir, "a.sock")
	b := listen(t, pid("gen", 0), Config{Insecure: true})
	cfgA := Config{Insecure: true, Bind: endpoint, HeartbeatInterval: 20 * time.Millisecond, HeartbeatMisses: 50,
		Peers: map[messages.PeerID]string{b.id: b.link.Endpoint()}}
	a1 := listen(t, pid("ctx", 0), cfgA)
	if err := b.link.AddPeer(a1.id, endpoint); err != nil {
		t.Fatal(err)
	}
	conn, err := b.link.Dial(a1.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Send(result(b.id, 0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the first incarnation's frame", func() bool { return a1.in.len() == 1 })
	a1.link.Close()

	// The second incarnation binds the same endpoint with a new Hello.
	l, err := New(Config{Insecure: true, Bind: endpoint, HeartbeatInterval: 20 * time.Millisecond, HeartbeatMisses: 50,
		Peers: map[messages.PeerID]string{b.id: b.link.Endpoint()}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a2 := &inbox{}
	if _, err := l.Listen(helloOf(a1.id, "2"), a2.deliver); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the second incarnation's Hello", func() bool {
		h, err := b.link.Hello(a1.id)
		return err == nil && string(h.AgentAddr) == "agent-2"
	})
	if err := conn.Send(result(b.id, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the frame to the second incarnation", func() bool { return a2.len() == 1 })
	if r := a2.snapshot()[0].(*messages.Result); r.RequestID != "req-1" {
		t.Fatalf("second incarnation got %+v", r)
	}
}

func TestSendQueueFullDoesNotBlock(t *testing.T) {
	dir := t.TempDir()
	b := listen(t, pid("gen", 0), Config{Insecure: true, SendHWM: 8})
	ghost := pid("ctx", 9)
	if err := b.link.AddPeer(ghost, "ipc://"+filepath.Join(dir, "nobody.sock")); err != nil {
		t.Fatal(err)
	}
	conn, err := b.link.Dial(ghost)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var full error
	for i := range 1000 {
		if err := conn.Send(result(b.id, i)); err != nil {
			full = err
			break
		}
	}
	if !errors.Is(full, ErrQueueFull) {
		t.Fatalf("sending to a peer nobody serves: %v, want ErrQueueFull", full)
	}
}

func TestLinkErrors(t *testing.T) {
	a := listen(t, pid("ctx", 0), Config{Insecure: true})
	if _, err := a.link.Listen(helloOf(a.id, "x"), a.in.deliver); !errors.Is(err, control.ErrDuplicate) {
		t.Errorf("second Listen: %v, want ErrDuplicate", err)
	}
	if _, err := a.link.Dial(pid("nobody", 1)); !errors.Is(err, control.ErrPeerGone) {
		t.Errorf("Dial of a peer without endpoint: %v, want ErrPeerGone", err)
	}

	idle, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.AddPeer(a.id, a.link.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if _, err := idle.Dial(a.id); !errors.Is(err, ErrNotListening) {
		t.Errorf("Dial before Listen: %v, want ErrNotListening", err)
	}
	bad := helloOf(pid("gen", 0), "x")
	bad.Backend = ""
	if _, err := idle.Listen(bad, func(messages.Frame) {}); !errors.Is(err, messages.ErrInvalid) {
		t.Errorf("Listen with an invalid Hello: %v, want messages.ErrInvalid", err)
	}
	idle.Close()
	if _, err := idle.Listen(helloOf(pid("gen", 0), "x"), func(messages.Frame) {}); !errors.Is(err, control.ErrClosed) {
		t.Errorf("Listen after Close: %v, want ErrClosed", err)
	}

	b := listen(t, pid("gen", 0), Config{Insecure: true})
	introduce(t, b, a)
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	bad2 := result(b.id, 1)
	bad2.Status = messages.StatusUnknown
	if err := conn.Send(bad2); !errors.Is(err, messages.ErrInvalid) {
		t.Errorf("Send of an invalid frame: %v, want messages.ErrInvalid", err)
	}
	conn.Close()
	if err := conn.Send(result(b.id, 1)); !errors.Is(err, control.ErrClosed) {
		t.Errorf("Send after Conn.Close: %v, want ErrClosed", err)
	}
	// A Conn outliving its Link fails cleanly and still releases the context.
	conn2, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	b.link.Close()
	if err := conn2.Send(result(b.id, 2)); !errors.Is(err, control.ErrClosed) {
		t.Errorf("Send after Link.Close: %v, want ErrClosed", err)
	}
	conn2.Close()
	if _, err := b.link.Dial(a.id); !errors.Is(err, control.ErrClosed) {
		t.Errorf("Dial after Close: %v, want ErrClosed", err)
	}
}

func TestConfigErrors(t *testing.T) {
	k := newKeys(t)
	other := newKeys(t)
	cases := map[string]Config{
		"no bind":           {Insecure: true},
		"no secret":         {Bind: "tcp://127.0.0.1:0"},
		"short secret":      {Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: "abc"}},
		"non-Z85 secret":    {Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: k.secret[:39] + "~"}},
		"mismatched public": {Bind: "tcp://127.0.0.1:0", Curve: Curve{Public: other.public, Secret: k.secret}},
		"bad allowed key":   {Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: k.secret, AllowedPeers: []string{"nope"}}},
		"bad server key": {Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: k.secret,
			PeerServerKeys: map[messages.PeerID]string{pid("x", 0): "short"}}},
		"huge frames":    {Insecure: true, Bind: "tcp://127.0.0.1:0", MaxFrameBytes: messages.MaxFrameBytes + 1},
		"empty endpoint": {Insecure: true, Bind: "tcp://127.0.0.1:0", Peers: map[messages.PeerID]string{pid("x", 0): ""}},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			l, err := New(cfg)
			if err == nil {
				l.Close()
				t.Fatal("New accepted a bad config")
			}
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("New: %v, want ErrConfig", err)
			}
		})
	}
	l, err := New(Config{Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: k.secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.PublicKey() != k.public {
		t.Fatalf("derived public key %q, want %q", l.PublicKey(), k.public)
	}
	if err := l.SetPeerServerKey(pid("x", 0), "short"); !errors.Is(err, ErrConfig) {
		t.Fatalf("SetPeerServerKey(bad): %v", err)
	}
	if err := l.AddPeer(pid("x", 0), ""); !errors.Is(err, ErrConfig) {
		t.Fatalf("AddPeer(empty): %v", err)
	}
}
