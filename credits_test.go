package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	e, deliver, link, release := heldEngine(t)
	rogue := messages.PeerID{Instance: "rogue", Rank: 0}
	blocks := [][]int32{{0, 1, 2, 3}, {0, 1, 2, 3}}
	holdTxParent(t, link, deliver, rogue, blocks)
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

// TestFrameCredits_HeavyFramesAreBoundedByBytes: frame credits alone
// would let one peer's held RequestData keep 4096 × 4 MiB of block ids
// (a million blocks each, every one valid). While the tx parent is held,
// the engine takes that peer's heavy frames only up to
// DefaultFrameCreditBytes of them and refuses the rest at once, while the
// peer's light frames still fit; after the drain the weight comes back.
// (The frames share one block slice: the test allocates 4 MiB, the engine
// counts what each would keep.)
func TestFrameCredits_HeavyFramesAreBoundedByBytes(t *testing.T) {
	e, deliver, link, release := heldEngine(t)
	rogue := messages.PeerID{Instance: "rogue", Rank: 0}
	small := [][]int32{{0, 1, 2, 3}, {0, 1, 2, 3}}
	holdTxParent(t, link, deliver, rogue, small)
	big := [][]int32{make([]int32, 1<<20)}
	const flood = 100
	for i := range flood {
		deliver(requestData(rogue, fmt.Sprintf("r-%d", i), 64, big))
	}
	taken := (actors.DefaultFrameCreditBytes - 4*8) / (4 << 20) // 63 beside the held frame
	want := int64(flood - taken)
	if got := e.Stats().FramesShed; got != want {
		t.Fatalf("%d heavy frames refused of %d, want %d (%d fit in %d bytes)", got, flood, want, taken,
			actors.DefaultFrameCreditBytes)
	}
	deliver(requestData(rogue, "r-light", 64, small))
	if got := e.Stats().FramesShed; got != want {
		t.Fatalf("a light frame that fits the byte budget was refused (%d refused, want %d)", got, want)
	}
	release()
	held := int64(1 + taken + 1)
	waitFor(t, "the held frames handled", func() bool { return e.Stats().FramesRejected == held })
	deliver(requestData(rogue, "r-after", 64, big))
	if got := e.Stats().FramesShed; got != want {
		t.Fatalf("a heavy frame after the drain was refused (%d refused, want %d)", got, want)
	}
	waitFor(t, "the frame after the drain handled", func() bool { return e.Stats().FramesRejected == held+1 })
}

// heldEngine starts a context engine on a heldLink (metrics served) and
// returns it, its deliver function, the link, and release, which opens the
// gate (once). The engine is closed at the test's end, gate opened.
func heldEngine(t *testing.T) (e *kvxfer.Engine, deliver func(messages.Frame), link *heldLink, release func()) {
	t.Helper()
	l := smallLayout()
	link = &heldLink{MemLink: control.NewMemLink(), delivers: map[string]func(messages.Frame){},
		entered: make(chan struct{}), gate: make(chan struct{})}
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 1 << 20,
		Workers: 1, Link: link, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { close(link.gate) }) }
	t.Cleanup(func() {
		release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	link.mu.Lock()
	deliver = link.delivers["ctx"]
	link.mu.Unlock()
	return e, deliver, link, release
}

// holdTxParent sends the first RequestData of rogue and waits until the tx
// parent is held inside the control plane's Hello for it.
func holdTxParent(t *testing.T, link *heldLink, deliver func(messages.Frame), rogue messages.PeerID, blocks [][]int32) {
	t.Helper()
	deliver(requestData(rogue, "r-held", 64, blocks))
	select {
	case <-link.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the tx parent never asked for the peer's Hello")
	}
}

// TestFrameCredits_ShedRequestDataAnswered: a RequestData refused for its
// peer's spent credits is answered FAILED, saying why, once the tx parent
// gets to it — so that its request fails at once, not at its deadline.
// A request with a live session here is failed by it only when bound to
// the sender's instance (r-bound: its session answers, and its Send ends
// FAILED); one not bound yet (r-live) is answered by the parent (no
// stream of anyone's) and its Send is not touched. At most ShedAnswers of
// one peer wait for their answer; past them they are dropped unanswered.
// (Checked to fail: with deliver not calling listener.shed no answer
// comes; with TxTable.Unread true for every live request, r-live's Send
// fails; with onUnread dropping what Unread hands to the session, r-bound
// waits.)
func TestFrameCredits_ShedRequestDataAnswered(t *testing.T) {
	e, deliver, link, release := heldEngine(t)
	rogue := messages.PeerID{Instance: "rogue", Rank: 0}
	var mu sync.Mutex
	answered := map[string]*messages.Result{}
	if _, err := link.MemLink.Listen(&messages.Hello{From: rogue}, func(f messages.Frame) {
		if r, ok := f.(*messages.Result); ok && strings.Contains(r.Error, "dropped the RequestData unread") {
			mu.Lock()
			answered[r.RequestID] = r
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	tx, err := e.Send(context.Background(), kvxfer.SendRequest{ID: "r-live", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Cancel()
	// Bound to rogue by Send: a refused RequestData of rogue's for it
	// fails it (no stream of rogue's was open, so the answer is a proof).
	bound, err := e.Send(context.Background(), kvxfer.SendRequest{ID: "r-bound", PromptLen: 64, Generation: "rogue"})
	if err != nil {
		t.Fatal(err)
	}
	blocks := [][]int32{{0, 1, 2, 3}, {0, 1, 2, 3}}
	holdTxParent(t, link, deliver, rogue, blocks)
	for i := range actors.DefaultFrameCredits - 1 {
		deliver(requestData(rogue, fmt.Sprintf("r-%d", i), 64, blocks))
	}
	// Every credit is spent: the rest are refused.
	deliver(requestData(rogue, "r-live", 64, blocks))
	deliver(requestData(rogue, "r-bound", 64, blocks))
	const extra = 10
	for i := range actors.ShedAnswers - 2 + extra {
		deliver(requestData(rogue, fmt.Sprintf("shed-%d", i), 64, blocks))
	}
	if got, want := e.Stats().FramesShed, int64(actors.ShedAnswers+extra); got != want {
		t.Fatalf("%d frames refused, want %d", got, want)
	}
	release()
	want := actors.ShedAnswers - 1 // the tx parent's answers; r-bound's comes from its session
	waitFor(t, fmt.Sprintf("%d refused RequestData answered", want+1), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(answered) >= want+1 && answered["r-bound"] != nil
	})
	select {
	case o := <-bound.Done():
		if o.Status != kvxfer.StatusFailed || !strings.Contains(fmt.Sprint(o.Err), "dropped the RequestData unread") {
			t.Fatalf("r-bound ended %s: %v, want FAILED with the reason", o.Status, o.Err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("r-bound did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	if r := answered["r-live"]; r == nil || r.Status != messages.StatusFailed || r.Epoch != 1 {
		t.Fatalf("answer to r-live: %+v, want FAILED for epoch 1", r)
	}
	if err := tx.Err(); err != nil {
		t.Fatalf("a live request not bound to rogue was failed by rogue's refused RequestData: %v", err)
	}
	if r := answered["r-bound"]; r.Status != messages.StatusFailed || r.Epoch != 1 {
		t.Fatalf("answer to r-bound: %+v, want FAILED for epoch 1", r)
	}
	for i := range actors.ShedAnswers - 2 + extra {
		id := fmt.Sprintf("shed-%d", i)
		r := answered[id]
		switch {
		case i < want-1 && (r == nil || r.Status != messages.StatusFailed || r.Epoch != 1 || r.From.Instance != "ctx" ||
			!strings.Contains(r.Error, "rogue/0 had 4096 control frames waiting here")):
			t.Fatalf("answer to %s: %+v, want FAILED for epoch 1 naming rogue/0 and the credits", id, r)
		case i >= want-1 && r != nil:
			t.Fatalf("%s, past the %d answer credits, was answered", id, actors.ShedAnswers)
		}
	}
	if len(answered) != want+1 {
		t.Fatalf("%d answers, want %d", len(answered), want+1)
	}
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

// TestShedRequestDataFailsTheGenerationRequest: a generation engine's
// RequestData refused for its spent credits (the test spends them with
// 4096 unreadable RequestData from gen/0 while the context's tx parent is
// held; Cancels spend credits of their own) fails
// its request with the context's reason as soon as the tx parent gets to
// it, not at its deadline, every block back in the pool. (Checked to
// fail: with deliver not calling listener.shed the request is still live
// after 10 s.)
func TestShedRequestDataFailsTheGenerationRequest(t *testing.T) {
	e, deliver, link, release := heldEngine(t)
	gen := startHeldGen(t, link, release, time.Minute)
	holdTxParent(t, link, deliver, messages.PeerID{Instance: "rogue", Rank: 0}, [][]int32{{0}, {0}})
	self := messages.PeerID{Instance: "gen", Rank: 0}
	for i := range actors.DefaultFrameCredits {
		deliver(&messages.RequestData{RequestID: fmt.Sprintf("c-%d", i), Epoch: 1, From: self})
	}
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "real", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	// The RequestData leaves on gen's own goroutines: released before it
	// arrived, it could find credits again.
	waitFor(t, "gen's RequestData refused", func() bool { return e.Stats().FramesShed == 1 })
	release()
	var o kvxfer.Outcome
	waitFor(t, "the request's outcome", func() bool {
		select {
		case o = <-rx.Done():
			return true
		default:
			return false
		}
	})
	if o.Status != kvxfer.StatusFailed || o.Err == nil || !strings.Contains(o.Err.Error(), "dropped the RequestData unread") {
		t.Fatalf("request whose RequestData was refused: %s: %v, want FAILED with the context's reason", o.Status, o.Err)
	}
	waitFor(t, "its blocks released", func() bool {
		select {
		case <-rx.Released():
			return gen.Pools().Used() == 0
		default:
			return false
		}
	})
}

// TestReusedIDWhileDrainingSaysWhy: a Receive that reuses the id of a
// request that ended (TIMED_OUT here: its writer, held, never answered)
// but still holds its blocks until the writer's proof is refused — the id
// is the session's until then — and the error says so. Before, it said
// "already receiving", which it was not, and a router retrying could not
// tell a duplicate from a drain.
func TestReusedIDWhileDrainingSaysWhy(t *testing.T) {
	_, deliver, link, release := heldEngine(t)
	gen := startHeldGen(t, link, release, 300*time.Millisecond)
	holdTxParent(t, link, deliver, messages.PeerID{Instance: "rogue", Rank: 0}, [][]int32{{0}, {0}})
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusTimedOut {
		t.Fatalf("first receive: %s %v, want TIMED_OUT", o.Status, o.Err)
	}
	_, err = gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "ctx"})
	if !errors.Is(err, kvxfer.ErrBadRequest) || !strings.Contains(err.Error(), "ended (TIMED_OUT) and still waits for its writers' proof") {
		t.Fatalf("a reused id whose request ended and drains: %v; want ErrBadRequest saying it ended and drains", err)
	}
}

// startHeldGen starts a generation engine "gen" on link, whose requests
// time out after timeout; at the test's end it opens the held link
// (release) and closes the engine.
func startHeldGen(t *testing.T, link *heldLink, release func(), timeout time.Duration) *kvxfer.Engine {
	t.Helper()
	l := smallLayout()
	gen, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, PoolBytes: 1 << 20,
		Workers: 1, Link: link.MemLink, TransferTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		release()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gen.Close(ctx); err != nil {
			t.Errorf("close gen: %v", err)
		}
	})
	return gen
}
