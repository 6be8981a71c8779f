package zmq

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// rawDealer is a bare zmq4 DEALER in its own context, speaking whatever
// bytes a test gives it. Only the goroutine that made it may use it.
type rawDealer struct {
	ctx  *zmq4.Context
	sock *zmq4.Socket
}

// dialRaw connects a bare DEALER to endpoint, after setup (socket
// options) if given.
func dialRaw(t testing.TB, endpoint string, setup ...func(*zmq4.Socket) error) *rawDealer {
	t.Helper()
	ctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(zmq4.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawDealer{ctx, s}
	for _, set := range append([]func(*zmq4.Socket) error{func(s *zmq4.Socket) error { return s.SetLinger(0) }}, setup...) {
		if err := set(s); err != nil {
			r.close()
			t.Fatal(err)
		}
	}
	if err := s.Connect(endpoint); err != nil {
		r.close()
		t.Fatal(err)
	}
	return r
}

func (r *rawDealer) send(t testing.TB, parts ...[]byte) {
	t.Helper()
	if _, err := r.sock.SendMessage(parts); err != nil {
		t.Errorf("raw send: %v", err)
	}
}

func (r *rawDealer) close() {
	r.sock.Close()
	r.ctx.Term()
}

// sendRaw sends each message, in order, from a bare DEALER of its own on
// a goroutine that keeps the socket open until the returned stop is
// called: closing it (linger 0) would drop what is still queued, so stop
// once the test has seen the outcome.
func sendRaw(t testing.TB, endpoint string, msgs ...[][]byte) (stop func()) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		raw := dialRaw(t, endpoint)
		defer raw.close()
		for _, m := range msgs {
			raw.send(t, m...)
		}
		<-done
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

func mustEncode(t testing.TB, f messages.Frame) []byte {
	t.Helper()
	b, err := encode(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Hostile bytes on one connection are each rejected and counted, while an
// honest Conn's frames keep arriving, in order.
func TestHostileInputRejectedHonestServed(t *testing.T) {
	const maxFrame = 4096
	a := listen(t, pid("ctx", 0), Config{Insecure: true, MaxFrameBytes: maxFrame})
	b := listen(t, pid("gen", 0), Config{Insecure: true})
	introduce(t, b, a)
	evil := pid("evil", 7)

	// The hostile messages, each of which must be rejected exactly once.
	rng := rand.New(rand.NewPCG(1, 2))
	var hostile [][][]byte
	for range 50 { // random bytes
		junk := make([]byte, 1+rng.IntN(300))
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		hostile = append(hostile, [][]byte{junk})
	}
	valid := mustEncode(t, result(evil, 1))
	for cut := 1; cut < len(valid); cut += 3 { // truncated frames
		hostile = append(hostile, [][]byte{valid[:cut]})
	}
	hostile = append(hostile,
		[][]byte{{}},                                // empty
		[][]byte{make([]byte, maxFrame+1)},          // oversize
		[][]byte{valid, valid},                      // two payload parts
		[][]byte{valid},                             // a valid frame before Hello
		[][]byte{mustEncode(t, helloOf(a.id, "x"))}, // Hello claiming the listener's own id
	)
	// Past MaxFrameBytes+64KiB libzmq drops the connection before reading:
	// not counted, and it must not disturb anyone else.
	huge := make([]byte, maxFrame+oversizeSlack+1)

	defer sendRaw(t, a.link.Endpoint(), append(hostile, [][]byte{huge})...)()

	const n = 300
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range n {
		if err := conn.Send(result(b.id, i)); err != nil {
			t.Fatalf("honest send %d: %v", i, err)
		}
	}

	waitFor(t, patience, "the honest frames", func() bool { return a.in.len() >= n })
	waitFor(t, patience, "every hostile message rejected", func() bool { return a.link.Rejected() >= int64(len(hostile)) })
	if got, want := a.link.Rejected(), int64(len(hostile)); got != want {
		t.Fatalf("Rejected() = %d, want %d", got, want)
	}
	got := a.in.snapshot()
	if len(got) != n {
		t.Fatalf("delivered %d frames, want the %d honest ones", len(got), n)
	}
	for i, f := range got {
		if r, ok := f.(*messages.Result); !ok || r.From != b.id || r.Epoch != uint64(i) {
			t.Fatalf("frame %d = %+v, want honest Result %d", i, f, i)
		}
	}
	if _, err := a.link.Hello(evil); err == nil {
		t.Fatal("a hostile connection's sender got into the directory")
	}

	// The listener still serves: a new honest frame after all that.
	if err := conn.Send(result(b.id, n)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "a frame after the attack", func() bool { return a.in.len() == n+1 })
}

// A connection speaks only for the PeerID of its Hello.
func TestSpoofedSenderRejected(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			a, b := pair(t, secure, Config{})
			victim := pid("gen", 1)
			conn, err := b.link.Dial(a.id)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// The Conn queues only on a connection that is up: wait until
			// its Hello has arrived.
			waitFor(t, patience, "b's Hello", func() bool { _, err := a.link.Hello(b.id); return err == nil })
			// b's own Conn sends frames naming another sender.
			if err := conn.Send(result(victim, 1)); err != nil {
				t.Fatal(err)
			}
			if err := conn.Send(&messages.Cancel{RequestID: "r", Epoch: 1, From: victim}); err != nil {
				t.Fatal(err)
			}
			if err := conn.Send(&messages.Heartbeat{From: victim, Seq: 1}); err != nil {
				t.Fatal(err)
			}
			// A second Hello on the same connection may not change its PeerID.
			if err := conn.Send(helloOf(victim, "forged")); err != nil {
				t.Fatal(err)
			}
			if err := conn.Send(result(victim, 2)); err != nil {
				t.Fatal(err)
			}
			if err := conn.Send(result(b.id, 3)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, patience, "b's genuine frame", func() bool { return a.in.len() == 1 })
			if got := a.link.Rejected(); got != 5 {
				t.Fatalf("Rejected() = %d, want 5", got)
			}
			if f := a.in.snapshot()[0]; f.Sender() != b.id {
				t.Fatalf("delivered %+v, want only b's genuine frame", f)
			}
			if _, err := a.link.Hello(victim); err == nil {
				t.Fatal("the forged Hello was stored")
			}
		})
	}
}

// logLines is a concurrency-safe log sink that keeps each line.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.lines = append(l.lines, string(p))
	l.mu.Unlock()
	return len(p), nil
}

// count returns how many lines contain every one of subs.
func (l *logLines) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// TestRejectionsCountedByReasonAndThrottled: a flood of hostile frames is
// counted exactly, by reason (Stats, FramesRejected for
// kvxfer_frames_rejected_total{reason}), and logged a few lines per
// (sender, reason): the flood neither floods the log nor hides a
// rejection of another kind that follows it.
//
// Regression (issue 15 item 5): the listener's rejections went through
// one sampler for all peers and reasons (20 lines a second); checked by
// putting that sampler back in reject: the flood logs 20 decode lines, past
// the bound, and the no_hello rejection after it is not logged.
func TestRejectionsCountedByReasonAndThrottled(t *testing.T) {
	const flood = 3000
	logs := &logLines{}
	a, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: -1,
		Logger: zerolog.New(logs).Level(zerolog.WarnLevel)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	in := &inbox{}
	if _, err := a.Listen(helloOf(pid("ctx", 0), "1"), in.deliver); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		raw := dialRaw(t, a.Endpoint())
		defer raw.close()
		for range flood {
			raw.send(t, []byte{0xff, 0x01}) // undecodable
		}
		raw.send(t, mustEncode(t, result(pid("evil", 1), 1))) // valid, but before any Hello
		<-done
	}()
	defer wg.Wait()
	defer close(done)

	// The listener counts a rejection before it logs it: wait for the last
	// one's line too.
	waitFor(t, patience, "every hostile frame rejected", func() bool {
		return a.Rejected() >= flood+1 && logs.count("frame rejected", `"reason":"no_hello"`) >= 1
	})
	elapsed := time.Since(start)
	st := a.Stats()
	for _, r := range RejectReasons() {
		want := int64(0)
		switch r {
		case RejectDecode:
			want = flood
		case RejectNoHello:
			want = 1
		}
		if st.Rejected[r] != want {
			t.Errorf("Stats().Rejected[%s] = %d, want %d", r, st.Rejected[r], want)
		}
		if got := a.FramesRejected()[r.String()]; got != want {
			t.Errorf("FramesRejected()[%q] = %d, want %d", r, got, want)
		}
	}
	// A burst per (sender, reason), then one line per period: the bound
	// grows with the time the test took, not with the flood.
	maxLines := control.DefaultThrottleBurst + 1 + int(elapsed/control.DefaultThrottleEvery)
	if n := logs.count("frame rejected", `"reason":"decode"`); n < 1 || n > maxLines {
		t.Errorf("%d log lines for %d undecodable frames, want 1..%d", n, flood, maxLines)
	}
	if n := logs.count("frame rejected", `"reason":"no_hello"`); n != 1 {
		t.Errorf("%d log lines for the frame before Hello, want 1 (not hidden by the flood)", n)
	}
	if st.WarningsHeld < flood-int64(maxLines) {
		t.Errorf("Stats().WarningsHeld = %d, want at least %d", st.WarningsHeld, flood-maxLines)
	}
}
