package zmq

import (
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
			slices.Sort(rtts)
			b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(rtts[len(rtts)*99/100].Nanoseconds())/1e3, "p99-µs")
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
