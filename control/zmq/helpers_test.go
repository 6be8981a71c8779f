package zmq

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/messages"
)

func pid(instance string, rank int32) messages.PeerID {
	return messages.PeerID{Instance: instance, Rank: rank}
}

// helloOf is a valid Hello for id; agent tags its agent address so a test
// can tell incarnations apart.
func helloOf(id messages.PeerID, agent string) *messages.Hello {
	return &messages.Hello{
		From:       id,
		Backend:    "shm",
		AgentAddr:  []byte("agent-" + agent),
		Region:     messages.RemoteRegion{Key: []byte("key-" + id.String()), Len: 1 << 20},
		LayoutHash: 42,
		Parallel:   messages.Parallel{TP: 1, PP: 1},
		Pools:      []messages.PoolGeometry{{Offset: 0, BlockBytes: 4096, Blocks: 16}},
	}
}

func result(from messages.PeerID, i int) *messages.Result {
	return &messages.Result{
		RequestID: fmt.Sprintf("req-%d", i),
		Epoch:     uint64(i),
		From:      from,
		Status:    messages.StatusSuccess,
		Bytes:     uint64(i),
	}
}

// requestData is a valid RequestData (not a terminal frame).
func requestData(from messages.PeerID, i int) *messages.RequestData {
	return &messages.RequestData{RequestID: fmt.Sprintf("req-%d", i), Epoch: uint64(i), From: from,
		GenParallel: messages.Parallel{TP: 1, PP: 1}, PromptLen: 32, Groups: []messages.GroupDest{{Blocks: []int32{5}}}}
}

// frameOf is the i-th frame of a mixed sequence from from: RequestData,
// a Result, a Cancel and a CancelAck in turn, each naming request req-i.
func frameOf(from messages.PeerID, i int) messages.Frame {
	id := fmt.Sprintf("req-%d", i)
	switch i % 4 {
	case 0:
		return requestData(from, i)
	case 1:
		return result(from, i)
	case 2:
		return &messages.Cancel{RequestID: id, Epoch: uint64(i), From: from, Reason: "test"}
	}
	return &messages.CancelAck{RequestID: id, Epoch: uint64(i), From: from}
}

// terminalOf is the i-th terminal frame from from: a FAILED Result, a
// Cancel and a CancelAck in turn, each naming request req-i.
func terminalOf(from messages.PeerID, i int) messages.Frame {
	id := fmt.Sprintf("req-%d", i)
	switch i % 3 {
	case 0:
		return &messages.Result{RequestID: id, Epoch: uint64(i), From: from, Status: messages.StatusFailed, Error: "peer unreachable"}
	case 1:
		return &messages.Cancel{RequestID: id, Epoch: uint64(i), From: from, Reason: "test"}
	}
	return &messages.CancelAck{RequestID: id, Epoch: uint64(i), From: from}
}

// inbox collects delivered frames; deliver never blocks for long.
type inbox struct {
	mu     sync.Mutex
	frames []messages.Frame
}

func (in *inbox) deliver(f messages.Frame) {
	in.mu.Lock()
	in.frames = append(in.frames, f)
	in.mu.Unlock()
}

func (in *inbox) snapshot() []messages.Frame {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]messages.Frame(nil), in.frames...)
}

func (in *inbox) len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.frames)
}

// from returns the delivered frames whose sender is p.
func (in *inbox) from(p messages.PeerID) []messages.Frame {
	var out []messages.Frame
	for _, f := range in.snapshot() {
		if f.Sender() == p {
			out = append(out, f)
		}
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes (integration
// tests only; never a bare sleep).
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

const patience = 10 * time.Second

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}

// node is a listening test link.
type node struct {
	id   messages.PeerID
	link *Link
	in   *inbox
}

// listen makes a link for id from cfg (Bind defaults to a free loopback
// port, heartbeats default to off), listens and closes it at cleanup.
func listen(t testing.TB, id messages.PeerID, cfg Config) *node {
	t.Helper()
	in := &inbox{}
	return &node{id: id, link: listenWith(t, id, cfg, in.deliver), in: in}
}

// listenWith is listen with a deliver func of the caller's.
func listenWith(t testing.TB, id messages.PeerID, cfg Config, deliver func(messages.Frame)) *Link {
	t.Helper()
	if cfg.Bind == "" {
		cfg.Bind = "tcp://127.0.0.1:0"
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = -1
	}
	cfg.Logger = testLogger(t)
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	if _, err := l.Listen(helloOf(id, "1"), deliver); err != nil {
		l.Close()
		t.Fatalf("Listen(%s): %v", id, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// keypair is a CURVE keypair.
type keypair struct{ public, secret string }

func newKeys(t testing.TB) keypair {
	t.Helper()
	pub, sec, err := GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	return keypair{pub, sec}
}

// introduce puts b in a's directory (endpoint and, if secure, server key).
func introduce(t testing.TB, a, b *node) {
	t.Helper()
	// The key first, as the node does: a heartbeat refresh between the
	// two calls would otherwise find the endpoint without a key (and, with
	// a long heartbeat interval, keep that error).
	if k := b.link.PublicKey(); k != "" {
		if err := a.link.SetPeerServerKey(b.id, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.link.AddPeer(b.id, b.link.Endpoint()); err != nil {
		t.Fatal(err)
	}
}
