package actors

import (
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// BenchmarkTxChunkPath runs whole TxSessions through their chunk path —
// per chunk: TxChunk, TxFenceFired and one TxCompleted per peer — the way
// the shell steps them, with metrics off (the shell's nil check) and on (a
// meter after every step). ns/step is the figure to compare; the
// difference is the metrics' cost per step.
func BenchmarkTxChunkPath(b *testing.B) {
	const chunks, peers = 64, 2
	for _, on := range []bool{false, true} {
		name := "metrics=off"
		if on {
			name = "metrics=on"
		}
		b.Run(name, func(b *testing.B) {
			var mt *meters
			if on {
				mt = testMeters(b)
			}
			msgs := chunkPathMessages(chunks, peers)
			expected := make([]int, peers)
			for p := range expected {
				expected[p] = p + 1
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				s := NewTxSession(TxConfig{Request: "r1", Self: messages.PeerID{Instance: "ctx"}, Workers: 2, DrainGrace: time.Second})
				tm := mt.txSession()
				now := testEpoch0
				s.Init(now)
				if tm != nil {
					tm.born(s, now)
				}
				for _, m := range msgs {
					now = now.Add(time.Microsecond)
					s.Step(m, now)
					if tm != nil {
						tm.stepped(s, m, now)
					}
				}
				if !s.Stopped() || s.State() != TxDone {
					b.Fatalf("session %v stopped=%v", s.State(), s.Stopped())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/step")
		})
	}
}

// chunkPathMessages is one request's messages: start, a RequestData from
// each peer, then each chunk handed over, its fence, each peer's
// completion, and the flushes.
func chunkPathMessages(chunks, peers int) []any {
	var msgs []any
	msgs = append(msgs, TxStart{PromptLen: 32 * chunks})
	var expected []int
	for p := 1; p <= peers; p++ {
		expected = append(expected, p)
	}
	for p := 1; p <= peers; p++ {
		msgs = append(msgs, TxPeerRequest{Peer: p, From: genPeer(p), Epoch: 1, PromptLen: 32 * chunks, Route: testRoute(p), Expected: expected})
	}
	for c := range chunks {
		msgs = append(msgs, testChunk(c*32, (c+1)*32, c == chunks-1), TxFenceFired{Index: c})
		for p := 1; p <= peers; p++ {
			msgs = append(msgs, TxCompleted{Op: OpRef{Request: "r1", Peer: p, Seq: c}})
		}
	}
	for p := 1; p <= peers; p++ {
		msgs = append(msgs, TxFlushed{Peer: p})
	}
	for p := 1; p <= peers; p++ {
		msgs = append(msgs, TxSent{Peer: p})
	}
	return msgs
}
