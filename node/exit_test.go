package node

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/messages"
)

func TestUCXSharedMemory(t *testing.T) {
	for tls, want := range map[string]bool{
		"": true, "all": true, "sm": true, "posix,cma": true, "tcp,sysv": true, "^tcp": true,
		"tcp": false, "rc,ud": false, "^sm": false, "^shm,tcp": false,
	} {
		if got := ucxSharedMemory(tls); got != want {
			t.Errorf("UCX_TLS=%q: shared memory %v, want %v", tls, got, want)
		}
	}
}

// Issue 17: a peer's Hello gets a pidfd only when it names a process of
// this host and pid namespace whose start time matches, on a backend
// whose exit is proof, once per incarnation; otherwise no proof of death
// will come from its process.
func TestWatchExitTrustsOnlyThisHostsProcess(t *testing.T) {
	self, err := pidwatch.Self()
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	n := &Node{backend: "shm", pids: pidwatch.New(), watched: map[messages.PeerID]uint64{}, log: zerolog.Nop()}
	defer n.closePids()
	noEngine := func() *kvxfer.Engine { return nil }
	inc := uint64(0)
	hello := func(p messages.ProcessID, backend string) *messages.Hello {
		inc++
		return &messages.Hello{From: messages.PeerID{Instance: "ctx", Rank: 0}, Backend: backend, Incarnation: inc, Process: p}
	}
	other := self
	other.Host = "00000000-0000-0000-0000-000000000000/pid:[1]"
	reused := self
	reused.StartTime++
	for name, h := range map[string]*messages.Hello{
		"another host":       hello(other, "shm"),
		"another start time": hello(reused, "shm"),
		"no process":         hello(messages.ProcessID{}, "shm"),
		"another backend":    hello(self, "ucx"),
		"no incarnation":     {From: messages.PeerID{Instance: "ctx", Rank: 1}, Backend: "shm", Process: self},
	} {
		n.watchExit(h, noEngine)
		if w := n.pids.Watching(); w != 0 {
			t.Fatalf("%s: %d pidfds open, want none", name, w)
		}
	}
	h := hello(self, "shm")
	n.watchExit(h, noEngine)
	n.watchExit(h, noEngine) // the same incarnation again
	if w := n.pids.Watching(); w != 1 {
		t.Fatalf("this host's process: %d pidfds open, want 1", w)
	}
}
