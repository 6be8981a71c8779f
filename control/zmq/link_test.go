package zmq

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
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

// TestFramesArriveInOrder: frames of every kind sent on one Conn arrive
// in the order they were sent. The sender respects the send queue's bound:
// it waits for credit (at most window frames sent and not yet delivered),
// so no frame can meet a full queue, however slowly a loaded machine
// drains it; should a send still find the queue full, it waits and sends
// that frame again. The window is a quarter of SendHWM because libzmq's writer
// learns of the reader's progress only every SendHWM/2 messages (its
// low-water mark): it may count up to SendHWM/2-1 frames already taken as
// still queued.
//
// Regression (issue 14 item 6): it used to send 1000 Results at once on a
// queue of 1000 frames (plus the Hello), and failed 2 of 3 runs under load
// with ErrQueueFull; the old version fails that way in about a third of
// `go test -race -count=20 -run TestFramesArriveInOrder` runs with a second
// copy running beside it.
func TestFramesArriveInOrder(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			const hwm, window, n = 64, 16, 1000
			a, b := pair(t, secure, Config{HeartbeatInterval: 50 * time.Millisecond, HeartbeatMisses: 100, SendHWM: hwm})
			conn, err := b.link.Dial(a.id)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			for i := range n {
				if i >= window {
					waitFor(t, patience, fmt.Sprintf("credit for frame %d", i), func() bool { return a.in.len() > i-window })
				}
				// ErrQueueFull is backpressure: the frame was not queued
				// and the Conn stays usable, so waiting and sending it
				// again keeps the order. (With the window it should not
				// happen; the retry keeps the test about order only.)
				var err error
				waitFor(t, patience, fmt.Sprintf("frame %d accepted", i), func() bool {
					err = conn.Send(frameOf(b.id, i))
					return !errors.Is(err, ErrQueueFull)
				})
				if err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			waitFor(t, patience, fmt.Sprintf("%d frames", n), func() bool { return a.in.len() >= n })
			got := a.in.snapshot()
			if len(got) != n {
				t.Fatalf("delivered %d frames, want %d", len(got), n)
			}
			for i, f := range got {
				want := frameOf(b.id, i)
				if fmt.Sprintf("%T", f) != fmt.Sprintf("%T", want) || f.Request() != want.Request() || f.Sender() != b.id {
					t.Fatalf("frame %d = %#v, want %T of %s from %s", i, f, want, want.Request(), b.id)
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
				t.Fatalf("%d frames rejected on an honest link: %v", r, a.link.Stats().Rejected)
			}
			if st := b.link.Stats(); st.QueueFull != 0 {
				t.Logf("%d sends met a full queue and were retried", st.QueueFull)
			}
		})
	}
}

// TestTerminalFramesNeverDroppedForQueueSpace: a peer that is not there
// yet (as one that is unreachable, or whose key is wrong) lets the send
// queue fill. RequestData is then refused (ErrQueueFull), but a burst of
// terminal frames — FAILED Results, Cancels, CancelAcks, many more than
// SendHWM — is each accepted, waits in the Conn's terminal backlog, and
// arrives, in order, once the peer listens.
//
// Regression (issue 14 item 5): without the backlog (checked by making
// messages.Terminal return false) the first terminal frame past the queue's 8
// fails with "send queue full … 8 frames queued" and the test stops there.
func TestTerminalFramesNeverDroppedForQueueSpace(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			const hwm, burst = 8, 500
			dir := t.TempDir()
			endpoint := "ipc://" + filepath.Join(dir, "late.sock")
			ka, kb := newKeys(t), newKeys(t)
			cfgB := Config{Insecure: !secure, SendHWM: hwm}
			cfgA := Config{Insecure: !secure, Bind: endpoint}
			if secure {
				cfgB.Curve = Curve{Secret: kb.secret, AllowedPeers: []string{ka.public}}
				cfgA.Curve = Curve{Secret: ka.secret, Identities: []Identity{{PublicKey: kb.public, Instance: "gen", Ranks: []int32{0}}}}
			}
			b := listen(t, pid("gen", 0), cfgB)
			aID := pid("ctx", 0)
			if err := b.link.AddPeer(aID, endpoint); err != nil {
				t.Fatal(err)
			}
			if secure {
				if err := b.link.SetPeerServerKey(aID, ka.public); err != nil {
					t.Fatal(err)
				}
			}
			conn, err := b.link.Dial(aID)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()

			// Fill the queue with RequestData until it says no.
			var sent []messages.Frame
			var full error
			for i := 0; i < 10*hwm && full == nil; i++ {
				f := requestData(b.id, i)
				if full = conn.Send(f); full == nil {
					sent = append(sent, f)
				}
			}
			if !errors.Is(full, ErrQueueFull) {
				t.Fatalf("RequestData to a peer nobody serves: %v, want ErrQueueFull", full)
			}
			// Terminal frames are never refused for queue space.
			for i := range burst {
				f := terminalOf(b.id, 1000+i)
				if err := conn.Send(f); err != nil {
					t.Fatalf("terminal frame %d (%T) of %d: %v", i, f, burst, err)
				}
				sent = append(sent, f)
			}
			// While they wait, a RequestData may not overtake them.
			if err := conn.Send(requestData(b.id, 9999)); !errors.Is(err, ErrQueueFull) {
				t.Fatalf("RequestData behind a terminal backlog: %v, want ErrQueueFull", err)
			}
			if st := b.link.Stats(); st.Backlogged < burst-hwm {
				t.Fatalf("Stats().Backlogged = %d, want at least %d", st.Backlogged, burst-hwm)
			}

			// The peer comes up: everything accepted arrives, in order.
			a := listen(t, aID, cfgA)
			waitFor(t, patience, fmt.Sprintf("%d frames", len(sent)), func() bool { return a.in.len() >= len(sent) })
			got := a.in.snapshot()
			if len(got) != len(sent) {
				t.Fatalf("delivered %d frames, want %d", len(got), len(sent))
			}
			for i, f := range got {
				if fmt.Sprintf("%T", f) != fmt.Sprintf("%T", sent[i]) || f.Request() != sent[i].Request() {
					t.Fatalf("frame %d = %T of %s, want %T of %s", i, f, f.Request(), sent[i], sent[i].Request())
				}
			}
			if r := a.link.Rejected(); r != 0 {
				t.Fatalf("%d frames rejected: %v", r, a.link.Stats().Rejected)
			}
			// The backlog drained: RequestData goes again.
			waitFor(t, patience, "a RequestData accepted again", func() bool {
				return conn.Send(requestData(b.id, 10000)) == nil
			})
		})
	}
}

// TestRefusedRequestDataNeverArrives: a Conn queues only on a connection
// that completed its handshake (ZMQ_IMMEDIATE), so a RequestData refused
// while the peer is not up never leaves this process: the generation side
// may free the request's pages at its deadline. A terminal frame sent after
// it waits in the backlog and arrives once the peer is up; frames of a
// Conn arrive in order, so once it has, the refused RequestData would have
// arrived before it had it been queued. (Without ZMQ_IMMEDIATE the first
// Send is accepted into the pipe of the pending connection and arrives when
// the peer starts: the test then fails at the first check.)
func TestRefusedRequestDataNeverArrives(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			endpoint := "ipc://" + filepath.Join(t.TempDir(), "late.sock")
			ka, kb := newKeys(t), newKeys(t)
			cfgB := Config{Insecure: !secure}
			cfgA := Config{Insecure: !secure, Bind: endpoint}
			if secure {
				cfgB.Curve = Curve{Secret: kb.secret, AllowedPeers: []string{ka.public}}
				cfgA.Curve = Curve{Secret: ka.secret, Identities: []Identity{{PublicKey: kb.public, Instance: "gen", Ranks: []int32{0}}}}
			}
			b := listen(t, pid("gen", 0), cfgB)
			aID := pid("ctx", 0)
			if err := b.link.AddPeer(aID, endpoint); err != nil {
				t.Fatal(err)
			}
			if secure {
				if err := b.link.SetPeerServerKey(aID, ka.public); err != nil {
					t.Fatal(err)
				}
			}
			conn, err := b.link.Dial(aID)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.Send(requestData(b.id, 1)); !errors.Is(err, ErrQueueFull) {
				t.Fatalf("RequestData to a peer that is not up: %v, want ErrQueueFull", err)
			}
			if err := conn.Send(terminalOf(b.id, 2)); err != nil {
				t.Fatalf("terminal frame behind it: %v", err)
			}
			a := listen(t, aID, cfgA)
			waitFor(t, patience, "the terminal frame", func() bool { return a.in.len() >= 1 })
			for _, f := range a.in.snapshot() {
				if _, ok := f.(*messages.RequestData); ok {
					t.Fatalf("a refused RequestData arrived: %+v", f)
				}
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

// TestSendQueueFullDoesNotBlock: sending to a peer nobody serves never
// blocks, and the queue is bounded: RequestData is refused past SendHWM,
// terminal frames past SendHWM plus TerminalBacklog, each with
// ErrQueueFull and an error that says which bound.
func TestSendQueueFullDoesNotBlock(t *testing.T) {
	dir := t.TempDir()
	const hwm, backlog = 8, 16
	b := listen(t, pid("gen", 0), Config{Insecure: true, SendHWM: hwm, TerminalBacklog: backlog})
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
		if err := conn.Send(requestData(b.id, i)); err != nil {
			full = err
			break
		}
	}
	if !errors.Is(full, ErrQueueFull) || !errors.Is(full, control.ErrQueueFull) {
		t.Fatalf("sending to a peer nobody serves: %v, want ErrQueueFull (and control.ErrQueueFull)", full)
	}
	accepted := 0
	for i := range 1000 {
		if err := conn.Send(terminalOf(b.id, i)); err != nil {
			full = err
			break
		}
		accepted++
	}
	if !errors.Is(full, ErrQueueFull) || !strings.Contains(full.Error(), "terminal backlog full") {
		t.Fatalf("terminal frames past the backlog: %v, want ErrQueueFull (terminal backlog full)", full)
	}
	// The Conn's Hello waits first in the backlog (the peer never came
	// up): one slot fewer for terminal frames.
	if accepted != backlog-1 {
		t.Fatalf("%d terminal frames accepted behind a full queue, want TerminalBacklog-1 = %d", accepted, backlog-1)
	}
	if st := b.link.Stats(); st.QueueFull != 2 || st.Backlogged != backlog-1 {
		t.Fatalf("Stats() = %+v, want QueueFull 2 and Backlogged %d", st, backlog-1)
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
		"bad identity key": {Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: k.secret,
			Identities: []Identity{{PublicKey: "short", Instance: "gen"}}}},
		"identity without instance": {Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: k.secret,
			Identities: []Identity{{PublicKey: other.public}}}},
		"identity rank out of range": {Bind: "tcp://127.0.0.1:0", Curve: Curve{Secret: k.secret,
			Identities: []Identity{{PublicKey: other.public, Instance: "gen", Ranks: []int32{messages.MaxRank}}}}},
		"huge frames":     {Insecure: true, Bind: "tcp://127.0.0.1:0", MaxFrameBytes: messages.MaxFrameBytes + 1},
		"tiny frames":     {Insecure: true, Bind: "tcp://127.0.0.1:0", MaxFrameBytes: messages.MinFrameLimit - 1},
		"negative frames": {Insecure: true, Bind: "tcp://127.0.0.1:0", MaxFrameBytes: -1},
		"empty endpoint":  {Insecure: true, Bind: "tcp://127.0.0.1:0", Peers: map[messages.PeerID]string{pid("x", 0): ""}},
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
	if err := l.AddIdentity(Identity{PublicKey: other.public, Instance: "gen", Ranks: []int32{-1}}); !errors.Is(err, ErrConfig) {
		t.Fatalf("AddIdentity(bad rank): %v", err)
	}
	if err := l.AddPeer(pid("x", 0), ""); !errors.Is(err, ErrConfig) {
		t.Fatalf("AddPeer(empty): %v", err)
	}
}

// TestCloseDeliversTerminalBacklog: a terminal frame sent on a Conn whose
// connection is still handshaking waits in its backlog; a Close right
// after it lets the backlog leave (within closeLinger) instead of dropping
// it. This is a process that closes right after its last request: its
// peer must learn that request's outcome. (Before: Close dropped the
// backlog at once and the frame never arrived; checked by removing the
// wait in Close.)
func TestCloseDeliversTerminalBacklog(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			ka, kb := newKeys(t), newKeys(t)
			cfgA, cfgB := Config{Insecure: !secure}, Config{Insecure: !secure}
			if secure {
				cfgA.Curve = Curve{Secret: ka.secret, Identities: []Identity{{PublicKey: kb.public, Instance: "gen", Ranks: []int32{0}}}}
				cfgB.Curve = Curve{Secret: kb.secret, AllowedPeers: []string{ka.public}}
			}
			a := listen(t, pid("ctx", 0), cfgA)
			b := listen(t, pid("gen", 0), cfgB)
			introduce(t, b, a)
			for i := range 20 {
				conn, err := b.link.Dial(a.id)
				if err != nil {
					t.Fatal(err)
				}
				if err := conn.Send(terminalOf(b.id, i)); err != nil {
					t.Fatalf("terminal frame %d: %v", i, err)
				}
				if err := conn.Close(); err != nil {
					t.Fatal(err)
				}
				waitFor(t, patience, fmt.Sprintf("terminal frame %d sent just before Close", i),
					func() bool { return len(a.in.from(b.id)) >= i+1 })
			}
		})
	}
}
