package zmq

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/internal/testlog"
	"github.com/kvxfer/kvxfer/messages"
)

// TestTwoProcessesOfOnePeerNamed: two live processes that say Hello as one
// peer (an instance started twice with one name) are named by the link
// they both heartbeat to, once; a process that restarts (the old one gone
// before the new one says Hello) is not. Nothing named the twins before:
// each Hello replaced the other's, and the one the link does not dial
// waited for a peer that never answered it. Each sign is tried alone: the
// older one's heartbeats (its Hello repeated only every 1000 beats, past
// the test's patience), and its Hello said again after the newer one's
// (every 2 beats: the heartbeats are then never two beats past the latest
// Hello).
func TestTwoProcessesOfOnePeerNamed(t *testing.T) {
	for _, misses := range []int{1000, 2} {
		t.Run(fmt.Sprintf("hello-every-%d-beats", misses), func(t *testing.T) { twoProcessesOfOnePeer(t, misses) })
	}
}

func twoProcessesOfOnePeer(t *testing.T, misses int) {
	const beat = 20 * time.Millisecond
	var logs testlog.Buffer
	var beats atomic.Int64 // heartbeats and frames from ctx/0, at most one a beat
	genID, ctxID := pid("gen", 0), pid("ctx", 0)
	gen, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: beat, HeartbeatMisses: 50,
		Logger: zerolog.New(&logs).Level(zerolog.WarnLevel),
		OnPeerAlive: func(p messages.PeerID) {
			if p == ctxID {
				beats.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	if _, err := gen.Listen(helloOf(genID, "g"), (&inbox{}).deliver); err != nil {
		t.Fatal(err)
	}
	start := func(inc uint64) *Link {
		t.Helper()
		l, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: beat, HeartbeatMisses: misses,
			Peers: map[messages.PeerID]string{genID: gen.Endpoint()}, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		h := helloOf(ctxID, fmt.Sprint(inc))
		h.Incarnation, h.Process = inc, messages.ProcessID{Pid: uint32(1000 + inc), StartTime: inc, Host: "test-host"}
		if _, err := l.Listen(h, (&inbox{}).deliver); err != nil {
			l.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		waitFor(t, patience, fmt.Sprintf("incarnation %d's Hello", inc), func() bool {
			h, err := gen.Hello(ctxID)
			return err == nil && h.Incarnation == inc
		})
		return l
	}
	const twins = "two processes speak as ctx/0"

	// A restart: incarnation 1 closes, 2 starts; ten beats of 2 name nothing.
	start(1).Close()
	start(2)
	n := beats.Load()
	waitFor(t, patience, "ten beats of incarnation 2", func() bool { return beats.Load() >= n+10 })
	if logs.Has(twins) {
		t.Fatalf("a restart named as two processes:\n%s", logs.String())
	}

	// Twins: incarnation 3 starts while 2 lives.
	start(3)
	waitFor(t, patience, "the twins named", func() bool { return logs.Has(twins) })
	n = beats.Load()
	waitFor(t, patience, "ten more beats", func() bool { return beats.Load() >= n+10 })
	if c := logs.Count(twins); c != 1 {
		t.Errorf("the twins named %d times, want once:\n%s", c, logs.String())
	}
	if !logs.Has("incarnation 3 (pid 1003) and incarnation 2 (pid 1002)") && !logs.Has("incarnation 2 (pid 1002) and incarnation 3 (pid 1003)") {
		t.Errorf("the twins not named by incarnation and pid:\n%s", logs.String())
	}
}
