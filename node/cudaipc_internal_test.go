package node

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// TestCUDAIPCConnectGonePeer: the node's cudaipc agent, asked to connect
// to the agent of a process that is gone (or a pid of another host's
// process, which this host does not have), fails at once with
// rdma.ErrPeerGone, saying the backend reaches this host's processes
// only; one whose Hello names another host is refused with ErrOtherHost
// before cudaipc is asked. (Checked to fail: with Connect passing
// cudaipc's error through unexplained, and with the host check removed.)
func TestCUDAIPCConnectGonePeer(t *testing.T) {
	a, err := newCUDAAgent(Config{Backend: cudaipc.Backend}, "ctx/0")
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("needs a CUDA device (TestFakeCUDA runs this on the fake driver): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	scheme, rest, _ := strings.Cut(string(a.Address()), ":")
	_, nonce, _ := strings.Cut(rest, ":")
	addr := []byte(scheme + ":" + strconv.Itoa(gone.Process.Pid) + ":" + nonce)
	ep, err := a.Connect(addr)
	if err == nil {
		ep.Close()
		t.Fatal("Connect to a process that is gone succeeded")
	}
	if !errors.Is(err, rdma.ErrPeerGone) || !strings.Contains(err.Error(), "this host only") {
		t.Fatalf("Connect to a process that is gone: %v, want rdma.ErrPeerGone saying the backend reaches this host only", err)
	}
	t.Log(err)

	peer := messages.PeerID{Instance: "far", Rank: 3}
	a.noteHello(&messages.Hello{From: peer, Backend: cudaipc.Backend, AgentAddr: addr,
		Process: messages.ProcessID{Pid: 1234, StartTime: 1, Host: "other-boot-id/pid:[1]"}})
	ep, err = a.Connect(addr)
	if err == nil {
		ep.Close()
		t.Fatal("Connect to a peer of another host succeeded")
	}
	if !errors.Is(err, ErrOtherHost) || !strings.Contains(err.Error(), "far/3") || !strings.Contains(err.Error(), "other-boot-id") {
		t.Fatalf("Connect to a peer of another host: %v, want ErrOtherHost naming the peer and its host", err)
	}
	t.Log(err)
}
