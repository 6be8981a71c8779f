package zmq

import (
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// benchPair makes two links that know each other, delivering to da and dg.
func benchPair(b *testing.B, secure bool, da, dg func(messages.Frame)) (a, g *Link, aID, gID messages.PeerID) {
	b.Helper()
	ca, cg := Config{Insecure: !secure}, Config{Insecure: !secure}
	if secure {
		ka, kg := newKeys(b), newKeys(b)
		ca.Curve = Curve{Secret: ka.secret, AllowedPeers: []string{kg.public}}
		cg.Curve = Curve{Secret: kg.secret, AllowedPeers: []string{ka.public}}
	}
	aID, gID = pid("ctx", 0), pid("gen", 0)
	a = listenWith(b, aID, ca, da)
	g = listenWith(b, gID, cg, dg)
	for _, x := range []struct {
		l    *Link
		id   messages.PeerID
		peer *Link
	}{{a, gID, g}, {g, aID, a}} {
		if err := x.l.AddPeer(x.id, x.peer.Endpoint()); err != nil {
			b.Fatal(err)
		}
		if k := x.peer.PublicKey(); k != "" {
			if err := x.l.SetPeerServerKey(x.id, k); err != nil {
				b.Fatal(err)
			}
		}
	}
	return a, g, aID, gID
}

// mailbox is a deliver func into a buffered channel that never blocks: a
// full channel counts a drop, which fails the benchmark.
func mailbox(b *testing.B, ch chan messages.Frame) func(messages.Frame) {
	var dropped atomic.Int64
	b.Cleanup(func() {
		if n := dropped.Load(); n != 0 {
			b.Errorf("%d frames dropped by a full test mailbox", n)
		}
	})
	return func(f messages.Frame) {
		select {
		case ch <- f:
		default:
			dropped.Add(1)
		}
	}
}

// sendRetry sends f, yielding while the queue is full.
func sendRetry(b *testing.B, c control.Conn, f messages.Frame) {
	for {
		err := c.Send(f)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrQueueFull) {
			b.Fatal(err)
		}
		runtime.Gosched()
	}
}

// BenchmarkPingPong: a small Result from ctx to gen and back, one in
// flight; ns/op is the mean round trip, p50-µs/p99-µs its percentiles.
func BenchmarkPingPong(b *testing.B) {
	for _, secure := range []bool{false, true} {
		b.Run(mode(secure), func(b *testing.B) {
			toA, toG := make(chan messages.Frame, 16), make(chan messages.Frame, 16)
			a, g, aID, gID := benchPair(b, secure, mailbox(b, toA), mailbox(b, toG))
			ab, err := a.Dial(gID)
			if err != nil {
				b.Fatal(err)
			}
			defer ab.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // gen's worker: owns the Conn back to ctx
				defer wg.Done()
				ga, err := g.Dial(aID)
				if err != nil {
					b.Error(err)
					return
				}
				defer ga.Close()
				pong := result(gID, 0)
				for f := range toG {
					pong.Epoch = f.(*messages.Result).Epoch
					if err := ga.Send(pong); err != nil {
						b.Error(err)
						return
					}
				}
			}()
			defer wg.Wait()
			defer close(toG)

			ping := result(aID, 0)
			enc, _ := encode(ping)
			b.SetBytes(int64(2 * len(enc)))
			// Warm up: both connections up and introduced.
			sendRetry(b, ab, ping)
			<-toA
			rtts := make([]time.Duration, b.N)
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				ping.Epoch = uint64(i + 1)
				if err := ab.Send(ping); err != nil {
					b.Fatal(err)
				}
				pong := <-toA
				rtts[i] = time.Since(t0)
				if pong.(*messages.Result).Epoch != ping.Epoch {
					b.Fatalf("pong for epoch %d, want %d", pong.(*messages.Result).Epoch, ping.Epoch)
				}
			}
			b.StopTimer()
			reportRTT(b, rtts)
		})
	}
}

// BenchmarkOneWay: small Results streamed from ctx to gen on one Conn;
// frames/s counts delivered frames.
func BenchmarkOneWay(b *testing.B) {
	for _, secure := range []bool{false, true} {
		b.Run(mode(secure), func(b *testing.B) {
			// gen's deliver counts; the last expected frame closes done.
			var got, want atomic.Int64
			want.Store(1)
			done := make(chan struct{}, 1)
			count := func(messages.Frame) {
				if got.Add(1) == want.Load() {
					done <- struct{}{}
				}
			}
			a, _, aID, gID := benchPair(b, secure, func(messages.Frame) {}, count)
			ab, err := a.Dial(gID)
			if err != nil {
				b.Fatal(err)
			}
			defer ab.Close()
			f := result(aID, 0)
			sendRetry(b, ab, f) // warm up: the connection is up
			<-done
			enc, _ := encode(f)
			b.SetBytes(int64(len(enc)))
			want.Store(1 + int64(b.N))
			b.ResetTimer()
			t0 := time.Now()
			for i := range b.N {
				f.Epoch = uint64(i)
				sendRetry(b, ab, f)
			}
			<-done
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "frames/s")
		})
	}
}

// The bare baseline: the Link's topology without the Link. Each end has
// its own zmq context, a ROUTER it binds and a DEALER it connects to the
// other end's ROUTER (one connection per direction, as Conns and
// listeners have), with CURVE keys but no ZAP handler when secure. The
// frame is bareFrameBytes long. How an end waits for a frame:
//
//   - block: RecvBytes in the goroutine that answers (a thread parked in
//     libzmq's own poll);
//   - netpoll: the listener's way: sockWait (Go's netpoller on a dup of
//     ZMQ_FD, ZMQ_EVENTS read in the callback), then non-blocking reads
//     until EAGAIN, in the goroutine that answers;
//   - handoff: netpoll in a receiving goroutine that hands each frame
//     over a channel to the goroutine that answers, as the listener hands
//     frames to the engine (deliver) and the benchmark's mailboxes do.
//
// So block→netpoll is the price of the netpoller wait, netpoll→handoff
// that of one more goroutine per hop, and handoff→PingPong what the Link
// adds (framing, checks, its socket options, ZAP).

const bareFrameBytes = 128

var bareWaits = []string{"block", "netpoll", "handoff"}

// bareEnd is one side of the bare baseline.
type bareEnd struct {
	b      testing.TB
	ctx    *zmq4.Context
	router *zmq4.Socket
	dealer *zmq4.Socket
	w      *sockWait
	queued [][]byte // frames read by the last drain, not yet returned
	keys   keypair
}

func newBareEnd(b testing.TB, secure bool) *bareEnd {
	b.Helper()
	ctx, err := zmq4.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	e := &bareEnd{b: b, ctx: ctx}
	b.Cleanup(func() { _ = ctx.Term() })
	if e.router, err = ctx.NewSocket(zmq4.ROUTER); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { closeSocket(e.router) })
	must(b, e.router.SetLinger(0))
	if secure {
		e.keys = newKeys(b)
		must(b, e.router.SetCurveServer(1))
		must(b, e.router.SetCurveSecretkey(e.keys.secret))
	}
	must(b, e.router.Bind("tcp://127.0.0.1:0"))
	if e.w, err = newSockWait(e.router); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.w.close)
	return e
}

// connect makes e's DEALER to peer's ROUTER.
func (e *bareEnd) connect(peer *bareEnd) {
	b := e.b
	var err error
	if e.dealer, err = e.ctx.NewSocket(zmq4.DEALER); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { closeSocket(e.dealer) })
	must(b, e.dealer.SetLinger(0))
	if peer.keys.public != "" {
		must(b, e.dealer.SetCurveServerkey(peer.keys.public))
		must(b, e.dealer.SetCurvePublickey(e.keys.public))
		must(b, e.dealer.SetCurveSecretkey(e.keys.secret))
	}
	ep, err := peer.router.GetLastEndpoint()
	must(b, err)
	must(b, e.dealer.Connect(ep))
}

// recvBlock reads one frame with blocking calls.
func (e *bareEnd) recvBlock() ([]byte, error) {
	if _, err := e.router.RecvBytes(0); err != nil { // routing id
		return nil, err
	}
	return e.router.RecvBytes(0)
}

// recvNetpoll reads one frame the listener's way: wait in the netpoller,
// then read all there is without waiting.
func (e *bareEnd) recvNetpoll() ([]byte, error) {
	for len(e.queued) == 0 {
		ok, err := e.w.wait(50 * time.Millisecond)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		for range maxBatch {
			if _, err := e.router.RecvBytes(zmq4.DONTWAIT); err != nil {
				if !isAgain(err) {
					return nil, err
				}
				break
			}
			p, err := e.router.RecvBytes(0)
			if err != nil {
				return nil, err
			}
			e.queued = append(e.queued, p)
		}
	}
	p := e.queued[0]
	e.queued = e.queued[1:]
	return p, nil
}

// receiver returns how the end's answering goroutine gets each frame, and
// starts the receiving goroutine of handoff (which ends on an empty
// frame, the stop signal).
func (e *bareEnd) receiver(wait string) func() ([]byte, error) {
	switch wait {
	case "block":
		return e.recvBlock
	case "netpoll":
		return e.recvNetpoll
	}
	ch := make(chan []byte, 16)
	go func() {
		defer close(ch)
		for {
			p, err := e.recvNetpoll()
			if err != nil {
				e.b.Error(err)
				return
			}
			ch <- p
			if len(p) == 0 {
				return
			}
		}
	}()
	return func() ([]byte, error) {
		p, ok := <-ch
		if !ok {
			return nil, zmq4.ErrorSocketClosed
		}
		return p, nil
	}
}

func must(b testing.TB, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBarePingPong: the baseline of BenchmarkPingPong (see above):
// a bareFrameBytes frame from ctx to gen and back, one in flight, over
// bare zmq4 sockets; ns/op is the mean round trip, p50-µs/p99-µs its
// percentiles.
func BenchmarkBarePingPong(b *testing.B) {
	for _, secure := range []bool{false, true} {
		for _, wait := range bareWaits {
			b.Run(mode(secure)+"/"+wait, func(b *testing.B) { barePingPong(b, secure, wait) })
		}
	}
}

func barePingPong(b *testing.B, secure bool, wait string) {
	a, g := newBareEnd(b, secure), newBareEnd(b, secure)
	a.connect(g)
	g.connect(a)
	recvA, recvG := a.receiver(wait), g.receiver(wait)
	done := make(chan error, 1)
	go func() { // gen: answers each frame with itself; an empty one stops it
		for {
			p, err := recvG()
			if err != nil {
				done <- err
				return
			}
			if len(p) == 0 {
				done <- nil
				return
			}
			if _, err := g.dealer.SendBytes(p, 0); err != nil {
				done <- err
				return
			}
		}
	}()
	ping := make([]byte, bareFrameBytes)
	b.SetBytes(2 * bareFrameBytes)
	// Warm up: both connections up (a DEALER queues before its handshake).
	must(b, sendBytes(a.dealer, ping))
	if _, err := recvA(); err != nil {
		b.Fatal(err)
	}
	rtts := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		binary.LittleEndian.PutUint64(ping, uint64(i+1))
		must(b, sendBytes(a.dealer, ping))
		pong, err := recvA()
		if err != nil {
			b.Fatal(err)
		}
		rtts[i] = time.Since(t0)
		if got := binary.LittleEndian.Uint64(pong); got != uint64(i+1) || len(pong) != bareFrameBytes {
			b.Fatalf("pong %d of %d bytes, want %d of %d", got, len(pong), i+1, bareFrameBytes)
		}
	}
	b.StopTimer()
	must(b, sendBytes(a.dealer, nil)) // stops gen; with handoff, gen's receiver
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if wait == "handoff" { // stop a's receiver: an empty frame of its own
		must(b, sendBytes(g.dealer, nil))
		for p, err := recvA(); err == nil && len(p) != 0; p, err = recvA() {
		}
	}
	reportRTT(b, rtts)
}

func sendBytes(s *zmq4.Socket, p []byte) error {
	_, err := s.SendBytes(p, 0)
	return err
}

// reportRTT reports the p50 and p99 of round trips.
func reportRTT(b *testing.B, rtts []time.Duration) {
	slices.Sort(rtts)
	b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(rtts[len(rtts)*99/100].Nanoseconds())/1e3, "p99-µs")
}
