package kvxfer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// heldLink is a MemLink whose Hello waits until the gate opens, and which
// hands the test each engine's deliver function, so that the test plays a
// peer sending frames as fast as it can while the tx parent is busy.
type heldLink struct {
	*control.MemLink
	mu       sync.Mutex
	delivers map[string]func(messages.Frame)
	once     sync.Once
	entered  chan struct{} // closed when a Hello starts waiting
	gate     chan struct{}
}

func (l *heldLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	l.mu.Lock()
	l.delivers[self.From.Instance] = deliver
	l.mu.Unlock()
	return l.MemLink.Listen(self, deliver)
}

func (l *heldLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	l.once.Do(func() { close(l.entered) })
	<-l.gate
	return l.MemLink.Hello(peer)
}

// TestFrameCredits_FloodIsBoundedTerminalFramesPass: while the tx parent
// is held (inside the control plane's Hello for the first RequestData), a
// peer sends 5,000 more. The engine holds at most DefaultFrameCredits of
// that peer's frames: exactly the rest are refused at once (FramesShed),
// not queued. A terminal frame of the same peer (a Result) still passes
// and is handled, and another peer's frames are not refused. Once the
// parent is free it handles what it holds, the credits come back and the
// peer's next frame is taken again.
func TestFrameCredits_FloodIsBoundedTerminalFramesPass(t *testing.T) {
	l := smallLayout()
	link := &heldLink{MemLink: control.NewMemLink(), delivers: map[string]func(messages.Frame){},
		entered: make(chan struct{}), gate: make(chan struct{})}
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 1 << 20,
		Workers: 1, Link: link, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(link.gate)
		}
	}
	defer func() {
		release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	link.mu.Lock()
	deliver := link.delivers["ctx"]
	link.mu.Unlock()
	rogue := messages.PeerID{Instance: "rogue", Rank: 0}
	blocks := [][]int32{{0, 1, 2, 3}, {0, 1, 2, 3}}
	deliver(requestData(rogue, "r-held", 64, blocks))
	select {
	case <-link.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the tx parent never asked for the peer's Hello")
	}
	const flood = 5000
	for i := range flood {
		deliver(requestData(rogue, fmt.Sprintf("r-%d", i), 64, blocks))
	}
	want := int64(flood + 1 - actors.DefaultFrameCredits)
	if got := e.Stats().FramesShed; got != want {
		t.Fatalf("%d frames refused of %d sent while the parent was held, want %d (credits %d)",
			got, flood+1, want, actors.DefaultFrameCredits)
	}
	// An operator sees them: kvxfer_frames_rejected_total{reason="shed"}.
	m := scrape(t, e, "ctx/0")
	if got := m["kvxfer_frames_rejected_total{reason=shed}"]; got != float64(want) {
		t.Fatalf("kvxfer_frames_rejected_total{reason=shed} = %v, want %d", got, want)
	}
	if _, ok := m["kvxfer_writer_leases_lapsed_total{}"]; !ok {
		t.Fatal("no kvxfer_writer_leases_lapsed_total series")
	}
	// A terminal frame of the flooding peer is never refused: it reaches
	// the rx parent (stale there: no such request).
	deliver(&messages.Result{RequestID: "r-terminal", Epoch: 1, From: rogue, Status: messages.StatusSuccess})
	// Another peer still gets in.
	deliver(&messages.Cancel{RequestID: "r-other", Epoch: 1, From: messages.PeerID{Instance: "gen", Rank: 0}})
	if got := e.Stats().FramesShed; got != want {
		t.Fatalf("a terminal frame or another peer's frame was refused: %d refused, want %d", got, want)
	}
	waitFor(t, "the terminal frame handled", func() bool { return e.Stats().FramesStale == 1 })
	release()
	// Every RequestData the engine took is refused by the parent (the
	// control plane does not know the peer): all credits come back.
	held := int64(actors.DefaultFrameCredits)
	waitFor(t, "the held frames handled", func() bool { return e.Stats().FramesRejected == held })
	deliver(requestData(rogue, "r-after", 64, blocks))
	if got := e.Stats().FramesShed; got != want {
		t.Fatalf("a frame after the flood drained was refused (%d refused, want %d)", got, want)
	}
	waitFor(t, "the frame after the flood handled", func() bool { return e.Stats().FramesRejected == held+1 })
}

// waitFor polls cond for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}
