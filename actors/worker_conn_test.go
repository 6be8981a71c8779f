package actors

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/messages"
)

// syncBuf is a log sink safe for a closer goroutine and the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// zmqWorker is a worker slot (no actor) sending over a zmq link that
// listens as ctx/0 and knows peer at an ipc endpoint nobody binds yet;
// its warnings go to the returned buffer.
func zmqWorker(t *testing.T, cfg zmq.Config) (*workerSlot, messages.PeerID, string, *syncBuf) {
	t.Helper()
	cfg.Insecure = true
	cfg.Bind = "tcp://127.0.0.1:0"
	cfg.HeartbeatInterval = -1
	l, err := zmq.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	self := messages.PeerID{Instance: "ctx"}
	if _, err := l.Listen(testHello(self), func(messages.Frame) {}); err != nil {
		t.Fatal(err)
	}
	peer := messages.PeerID{Instance: "gen"}
	endpoint := "ipc://" + filepath.Join(t.TempDir(), "gen.sock")
	if err := l.AddPeer(peer, endpoint); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	log := zerolog.New(logs).Level(zerolog.WarnLevel)
	env := &shellEnv{clock: SystemClock{}, log: log, throttle: control.NewThrottle(0, 0, 0)}
	return newWorkerSlot(0, nil, nil, l, log, &Counters{}, env), peer, endpoint, logs
}

func testHello(id messages.PeerID) *messages.Hello {
	return &messages.Hello{From: id, Backend: "shm", AgentAddr: []byte("agent"),
		Region: messages.RemoteRegion{Key: []byte("key"), Len: 1 << 20}, LayoutHash: 42,
		Parallel: messages.Parallel{TP: 1, PP: 1}, Pools: []messages.PoolGeometry{{Offset: 0, BlockBytes: 4096, Blocks: 16}}}
}

// TestWorkerKeepsConnOnFrameError: a Send error about one frame (too
// large for the link, or invalid) says nothing of the connection, which
// still queues other requests' terminal frames in its backlog: the
// worker keeps the Conn, and those frames arrive once the peer comes.
// (Before the fix the worker closed the Conn on any error but
// ErrQueueFull, dropping the backlog: checked to fail without it.)
func TestWorkerKeepsConnOnFrameError(t *testing.T) {
	s, peer, endpoint, _ := zmqWorker(t, zmq.Config{MaxFrameBytes: messages.MinFrameLimit})
	self := messages.PeerID{Instance: "ctx"}
	// The peer is not there: the CancelAck waits in the Conn's backlog.
	if err := s.send(peer, &messages.CancelAck{RequestID: "queued", Epoch: 1, From: self}); err != nil {
		t.Fatalf("CancelAck: %v, want it queued", err)
	}
	c := s.conns[peer]
	big := &messages.Result{RequestID: "big", Epoch: 1, From: self, Status: messages.StatusSuccess, Payload: make([]byte, 2*messages.MinFrameLimit)}
	if err := s.send(peer, big); !errors.Is(err, zmq.ErrFrameTooLarge) {
		t.Fatalf("a frame past MaxFrameBytes: %v, want ErrFrameTooLarge", err)
	}
	bad := &messages.Result{RequestID: "bad", Epoch: 1, From: self, Status: messages.StatusFailed, Error: strings.Repeat("e", messages.MaxErrorLen+1)}
	if err := s.send(peer, bad); !errors.Is(err, messages.ErrInvalid) {
		t.Fatalf("an invalid frame: %v, want messages.ErrInvalid", err)
	}
	if s.conns[peer] != c {
		t.Fatal("the worker dropped its connection over one frame's error: the terminal frames it queued are lost")
	}
	if err := s.send(peer, &messages.Cancel{RequestID: "after", Epoch: 1, From: self, Reason: "test"}); err != nil {
		t.Fatalf("Cancel after: %v", err)
	}

	// The peer comes: what the Conn queued arrives, in order.
	got := make(chan string, 16)
	pl, err := zmq.New(zmq.Config{Insecure: true, Bind: endpoint, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	if _, err := pl.Listen(testHello(peer), func(f messages.Frame) {
		switch f.(type) {
		case *messages.CancelAck, *messages.Cancel, *messages.Result:
			got <- f.Request()
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"queued", "after"} {
		select {
		case id := <-got:
			if id != want {
				t.Fatalf("peer got request %q, want %q", id, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("request %q's frame never arrived", want)
		}
	}
}

// TestWorkerNamesTerminalFramesLost: a terminal frame refused because its
// Conn's terminal backlog is full (zmq.ErrTerminalBacklogFull) is never
// sent by anyone: the worker warns naming the peer, the frame and its
// request, and keeps the Conn. The frames that backlog held and the
// Conn's Close dropped (zmq.ErrTerminalDropped) are warned about and
// counted unsent. (Before the fix the refusal was a debug line "will
// retry" and Close's error was discarded: checked to fail without each
// part.)
func TestWorkerNamesTerminalFramesLost(t *testing.T) {
	const backlog = 4
	s, peer, _, logs := zmqWorker(t, zmq.Config{SendHWM: 2, TerminalBacklog: backlog})
	self := messages.PeerID{Instance: "ctx"}
	accepted := 0
	var refused error
	for i := range 100 {
		f := &messages.CancelAck{RequestID: fmt.Sprintf("ack-%d", i), Epoch: 1, From: self}
		if refused = s.send(peer, f); refused != nil {
			break
		}
		accepted++
	}
	if !errors.Is(refused, zmq.ErrTerminalBacklogFull) {
		t.Fatalf("past the backlog: %v, want ErrTerminalBacklogFull", refused)
	}
	lost := fmt.Sprintf("ack-%d", accepted)
	if s.conns[peer] == nil {
		t.Fatal("the worker dropped the connection: its backlog is lost")
	}
	line := logs.String()
	for _, want := range []string{"NOT sent", lost, peer.String(), "CancelAck"} {
		if !strings.Contains(line, want) {
			t.Fatalf("no warning naming %q for the lost terminal frame; logs:\n%s", want, line)
		}
	}
	// The link closes (the peer never came): the backlog is dropped, the
	// next send finds the Conn closed, and the worker closes it.
	unsent := s.stats.FramesUnsent.Load()
	s.link.(*zmq.Link).Close()
	if err := s.send(peer, &messages.CancelAck{RequestID: "late", Epoch: 1, From: self}); !errors.Is(err, control.ErrClosed) {
		t.Fatalf("send on a closed link: %v, want control.ErrClosed", err)
	}
	if s.conns[peer] != nil {
		t.Fatal("the worker kept a closed connection")
	}
	if got := s.stats.FramesUnsent.Load() - unsent; got != int64(accepted)+1 {
		t.Fatalf("Close dropped %d accepted terminal frames and 1 was refused, FramesUnsent grew by %d", accepted, got)
	}
	if line := logs.String(); !strings.Contains(line, "dropped unsent") || !strings.Contains(line, fmt.Sprintf(`"dropped":%d`, accepted)) {
		t.Fatalf("no warning naming the %d dropped frames; logs:\n%s", accepted, line)
	}
}

// TestZmqErrorsClassified checks that the worker tells control/zmq's
// errors apart by the control package's sentinels, which they wrap.
func TestZmqErrorsClassified(t *testing.T) {
	if !frameError(fmt.Errorf("%w: x", zmq.ErrFrameTooLarge)) || frameError(zmq.ErrTerminalDropped) ||
		frameError(control.ErrClosed) || !frameError(fmt.Errorf("send: %w", messages.ErrInvalid)) {
		t.Fatal("frameError misreads an error")
	}
	if n, ok := terminalDropped(&control.FramesDropped{N: 7, Err: fmt.Errorf("%w: 7 terminal frames to x", zmq.ErrTerminalDropped)}); !ok || n != 7 {
		t.Fatalf("terminalDropped = %d, %v, want 7, true", n, ok)
	}
	if n, ok := terminalDropped(fmt.Errorf("%w: some", zmq.ErrTerminalDropped)); !ok || n != 1 {
		t.Fatalf("terminalDropped of an uncounted drop = %d, %v, want 1, true", n, ok)
	}
	if _, ok := terminalDropped(fmt.Errorf("%w: x", zmq.ErrTerminalBacklogFull)); ok {
		t.Fatal("terminalDropped reads a refusal as a drop")
	}
}
