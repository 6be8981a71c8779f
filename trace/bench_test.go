package trace

import (
	"io"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// onePlanner plans one segment per chunk.
type onePlanner struct{}

func (onePlanner) Plan(c kvcache.Chunk, _ []kvcache.BlockRun, buf []kvcache.Segment) ([]kvcache.Segment, uint64, error) {
	n := uint64(c.End - c.Start)
	return append(buf, kvcache.Segment{Src: uint64(c.Start), Dst: uint64(c.Start), Len: n}), n, nil
}

// txRun steps one context session through a whole transfer of chunks
// chunks (start, peer, then per chunk: chunk, fence, completion; flush) and
// returns the number of steps; tr may be nil (untraced).
func txRun(tr actors.SessionTracer, chunks int) int {
	s := actors.NewTxSession(actors.TxConfig{Request: "r", Self: ctx1, Workers: 2})
	now := at
	n := 0
	step := func(m any) {
		now = now.Add(time.Microsecond)
		if tr != nil {
			tr.Record(m, now)
		}
		eff := s.Step(m, now)
		if tr != nil {
			tr.Stepped(s, eff)
		}
		n++
	}
	step(actors.TxStart{PromptLen: chunks * 16})
	if tr != nil {
		tr.Resolved(&messages.Hello{From: gen0}, &messages.RequestData{RequestID: "r", From: gen0})
	}
	step(actors.TxPeerRequest{Peer: 0, From: gen0, Epoch: 1, Expected: []int{0},
		Route: &actors.Route{Peer: gen0, Planner: onePlanner{}}})
	for i := range chunks {
		c := kvcache.Chunk{Start: i * 16, End: (i + 1) * 16, FirstBlock: i, Last: i == chunks-1}
		step(actors.TxChunk{Chunk: c, Src: []kvcache.BlockRun{{First: i, IDs: []kvcache.BlockID{kvcache.BlockID(i)}}}})
		step(actors.TxFenceFired{Index: i})
		step(actors.TxCompleted{Op: actors.OpRef{Request: "r", Peer: 0, Seq: i}})
	}
	step(actors.TxFlushed{Peer: 0})
	step(actors.TxSent{Peer: 0})
	return n
}

// BenchmarkStep compares a session step untraced and traced (encoding the
// message and the digest, writing to io.Discard), for sessions of 8 and
// 128 chunks: the digest lists every op, so its cost grows with the
// session.
func BenchmarkStep(b *testing.B) {
	for _, chunks := range []int{8, 128} {
		b.Run("untraced/chunks="+itoa(chunks), func(b *testing.B) {
			steps := 0
			for b.Loop() {
				steps += txRun(nil, chunks)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(steps), "ns/step")
		})
		b.Run("traced/chunks="+itoa(chunks), func(b *testing.B) {
			w := NewWriter(io.Discard)
			steps := 0
			for b.Loop() {
				cfg := actors.TxConfig{Request: "r", Self: ctx1, Workers: 2}
				tr := w.Session("ctx/0/$1/$2", actors.Birth{Engine: ctx1, At: at, Tx: &cfg})
				tr.Stepped(actors.NewTxSession(cfg), nil)
				steps += txRun(tr, chunks)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(steps), "ns/step")
			b.ReportMetric(float64(w.Stats().Bytes)/float64(steps), "B/step")
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
