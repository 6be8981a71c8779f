package zmq

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// A Conn dialled before its peer was removed (an etcd Down) says Hello
// again once the peer's next incarnation, at the same endpoint, says
// Hello: as after a restart the directory saw without a removal
// (TestConnSaysHelloAgainAfterPeerRestart). The name's entry is made
// anew by the registry's Up (AddPeer) or, first, by that incarnation's
// own Hello (the node's Down and the Hello racing). Before, the Conn kept
// watching the entry RemovePeer dropped, never said Hello again, and the
// next incarnation rejected each of its frames (no_hello) while Send
// returned nil: the worker's frames to it were lost for good.
func TestConnSaysHelloAgainAfterPeerRemovedAndBack(t *testing.T) {
	for _, readd := range []bool{true, false} {
		name := "readded"
		if !readd {
			name = "hello-first"
		}
		t.Run(name, func(t *testing.T) { connAfterRemoval(t, readd) })
	}
}

func connAfterRemoval(t *testing.T, readd bool) {
	endpoint := "ipc://" + filepath.Join(t.TempDir(), "a.sock")
	b := listen(t, pid("gen", 0), Config{Insecure: true})
	aID := pid("ctx", 0)
	start := func(inc uint64) (*Link, *inbox) {
		t.Helper()
		l, err := New(Config{Insecure: true, Bind: endpoint, HeartbeatInterval: 20 * time.Millisecond, HeartbeatMisses: 50,
			Peers: map[messages.PeerID]string{b.id: b.link.Endpoint()}, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		in := &inbox{}
		h := helloOf(aID, fmt.Sprint(inc))
		h.Incarnation = inc
		if _, err := l.Listen(h, in.deliver); err != nil {
			t.Fatal(err)
		}
		waitFor(t, patience, fmt.Sprintf("incarnation %d's Hello", inc), func() bool {
			h, err := b.link.Hello(aID)
			return err == nil && h.Incarnation == inc
		})
		return l, in
	}
	if err := b.link.AddPeer(aID, endpoint); err != nil {
		t.Fatal(err)
	}
	a1, in1 := start(1)
	conn, err := b.link.Dial(aID)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Send(result(b.id, 0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the first incarnation's frame", func() bool { return in1.len() == 1 })
	a1.Close()
	b.link.RemovePeerIncarnation(aID, 1)
	if readd {
		if err := b.link.AddPeer(aID, endpoint); err != nil {
			t.Fatal(err)
		}
	}

	a2, in2 := start(2)
	if err := conn.Send(result(b.id, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the frame delivered to the second incarnation, or rejected", func() bool {
		return in2.len() == 1 || a2.Stats().Rejected[RejectNoHello] > 0
	})
	if n := a2.Stats().Rejected[RejectNoHello]; n != 0 || in2.len() != 1 {
		t.Fatalf("the second incarnation got %d frames of the Conn and rejected %d as sent before the Conn's Hello, want 1 and 0",
			in2.len(), n)
	}
	if r := in2.snapshot()[0].(*messages.Result); r.RequestID != "req-1" {
		t.Fatalf("second incarnation got %+v", r)
	}
}
