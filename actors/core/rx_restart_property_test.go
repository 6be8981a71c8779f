package core

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
	"pgregory.net/rapid"
)

// rrWriter is the truth about one writer: the incarnation that runs now,
// which incarnations hold this request's RequestData (they may write), the
// copy with the worker and what becomes of it.
type rrWriter struct {
	live      uint64
	hello     uint64 // what the control plane's Hello names (may lag live)
	addr      uint64 // the incarnation the session addresses it to
	holders   map[uint64]bool
	sending   bool
	copyTo    uint64                   // the sending copy's address
	mustLeave bool                     // a Misaddressed about the sending copy was delivered
	dropped   []*messages.Misaddressed // answers of incarnations that dropped a copy
	exact     bool
}

type rrModel struct {
	t       *rapid.T
	s       *RxSession
	now     time.Time
	w       []*rrWriter
	begun   bool
	stopped bool
}

func (m *rrModel) step(msg any) {
	rt := m.t
	before := m.s.State()
	effs := m.s.Step(msg, m.now)
	if m.stopped && len(effs) > 0 {
		rt.Fatalf("%T after Stop", msg)
	}
	for _, e := range effs {
		switch e := e.(type) {
		case SendRequestData:
			w := m.w[e.Writer]
			w.sending, w.copyTo, w.mustLeave = true, e.Frame.ToIncarnation, false
		case Readdress:
			m.w[e.Writer].addr = e.Incarnation
			rrStats["readdress"]++
		case Finish:
			if e.Outcome.OK {
				rrStats["ready"]++
				if before.Terminal() {
					rt.Fatalf("%T: READY after %v", msg, before)
				}
				for i, w := range m.w {
					if !w.exact {
						rt.Fatalf("%T: READY without writer %d's SUCCESS", msg, i)
					}
				}
			}
		case ReleaseDest:
			rrStats["release"]++
			for i, w := range m.w {
				if len(w.holders) > 0 || w.sending && w.copyTo == w.live {
					rt.Fatalf("%T: ReleaseDest while writer %d may write: holders %v sending %v", msg, i, w.holders, w.sending)
				}
			}
		case Stop:
			m.stopped = true
		}
	}
}

// TestProperty_RxRestarts drives an RxSession whose writers restart at
// random (each restart a new incarnation; the control plane's Hello may
// lag), so that RequestData copies reach incarnations they were not
// addressed to and are dropped (Misaddressed), and checks that its blocks
// are released only once no incarnation that got the request may write.
func TestProperty_RxRestarts(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 2).Draw(rt, "writers")
		cfg := RxConfig{Request: "r1", Epoch: 7, Self: messages.PeerID{Instance: "gen"}, Blocks: testRxBlocks,
			Incarnation: rxModelSelfInc, CancelResend: time.Second, Deadline: testEpoch0.Add(time.Minute)}
		m := &rrModel{t: rt, now: testEpoch0}
		for i := range n {
			cfg.Writers = append(cfg.Writers, RxWriter{Peer: ctxPeer(i), Worker: i, Bytes: 32, Incarnation: 100,
				Request: &messages.RequestData{RequestID: "r1", Epoch: 7, From: cfg.Self,
					Incarnations: messages.Incarnations{FromIncarnation: rxModelSelfInc, ToIncarnation: 100}}})
			m.w = append(m.w, &rrWriter{live: 100, hello: 100, addr: 100, holders: map[uint64]bool{}})
		}
		m.s = NewRxSession(cfg)
		for range rapid.IntRange(0, 60).Draw(rt, "steps") {
			if m.stopped {
				break
			}
			i := rapid.IntRange(0, n-1).Draw(rt, "writer")
			w := m.w[i]
			actions := []string{"restart", "hello", "cancel", "deadline", "ack", "gone"}
			if !m.begun {
				actions = append(actions, "begin", "begin")
			}
			if w.sending {
				actions = append(actions, "sent", "sent", "sent", "address")
			}
			if len(w.holders) > 0 {
				actions = append(actions, "result", "result")
			}
			if len(w.dropped) > 0 {
				actions = append(actions, "misaddressed", "misaddressed")
			}
			switch a := rapid.SampledFrom(actions).Draw(rt, "action"); a {
			case "begin":
				m.begun = true
				m.step(RxBegin{})
				// A copy to an incarnation that is not the live one is
				// dropped by it, which answers at once (it may overtake
				// RxSent).
				for _, w := range m.w {
					if w.sending && w.copyTo != w.live {
						w.dropped = append(w.dropped, &messages.Misaddressed{RequestID: "r1", Epoch: 7, Addressed: w.copyTo,
							Incarnations: messages.Incarnations{FromIncarnation: w.live, ToIncarnation: rxModelSelfInc}})
					}
				}
			case "restart":
				w.live += 500
				if w.sending && w.copyTo != w.live {
					w.dropped = append(w.dropped, &messages.Misaddressed{RequestID: "r1", Epoch: 7, Addressed: w.copyTo,
						Incarnations: messages.Incarnations{FromIncarnation: w.live, ToIncarnation: rxModelSelfInc}})
				}
			case "hello":
				w.hello = w.live
			case "sent":
				var err error
				if !w.mustLeave && rapid.IntRange(0, 3).Draw(rt, "refused") == 0 {
					err = errors.New("queue full")
				}
				if w.mustLeave || err == nil {
					if w.copyTo == w.live {
						w.holders[w.live] = true
					}
				}
				if err != nil {
					// never left: no Misaddressed about it can come
					w.dropped = slices.DeleteFunc(w.dropped, func(f *messages.Misaddressed) bool { return f.Addressed == w.copyTo })
				}
				w.sending = false
				m.step(RxSent{Writer: i, Err: err})
				m.fireResend()
			case "address":
				if w.hello == w.copyTo || w.mustLeave {
					break
				}
				w.sending = false
				w.dropped = slices.DeleteFunc(w.dropped, func(f *messages.Misaddressed) bool { return f.Addressed == w.copyTo })
				w.addr = w.hello
				m.step(RxAddress{Writer: i, Incarnation: w.hello})
				m.fireResend()
			case "misaddressed":
				j := rapid.IntRange(0, len(w.dropped)-1).Draw(rt, "which")
				f := w.dropped[j]
				w.dropped = slices.Delete(w.dropped, j, j+1)
				if w.sending && w.copyTo == f.Addressed {
					w.mustLeave = true
				}
				m.step(RxFrame{Writer: i, Frame: f})
			case "result":
				hs := sortedU64(w.holders)
				y := rapid.SampledFrom(hs).Draw(rt, "holder")
				st := messages.StatusSuccess
				if rapid.IntRange(0, 3).Draw(rt, "status") == 0 {
					st = messages.StatusFailed
				}
				delete(w.holders, y)
				if st == messages.StatusSuccess && y == w.addr && !m.s.State().Terminal() {
					w.exact = true
				}
				m.step(RxFrame{Writer: i, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(i), Status: st, Bytes: 32,
					Incarnations: messages.Incarnations{FromIncarnation: y, ToIncarnation: rxModelSelfInc}}})
			case "ack":
				// Only an answer to a Cancel, which a decided session
				// sends behind any copy its worker holds.
				if !m.s.State().Terminal() || w.sending {
					break
				}
				// The live incarnation answers a Cancel: its own writes
				// are over (it holds the request no more, or never did).
				delete(w.holders, w.live)
				m.step(RxFrame{Writer: i, Frame: &messages.CancelAck{RequestID: "r1", Epoch: 7, From: ctxPeer(i),
					Incarnations: messages.Incarnations{FromIncarnation: w.live, ToIncarnation: rxModelSelfInc}}})
			case "gone":
				// An incarnation that is not the live one has exited.
				if w.live == 100 {
					break
				}
				y := rapid.SampledFrom([]uint64{100, w.live - 500}).Draw(rt, "dead")
				delete(w.holders, y)
				m.step(RxPeerGone{Writer: i, Err: errors.New("exited"), Incarnation: y})
			case "cancel":
				m.step(RxCancel{})
			case "deadline":
				m.now = m.now.Add(time.Minute)
				m.step(RxTimeout{Kind: TimerDeadline})
			default:
				rt.Fatalf("action %q", a)
			}
		}
	})
}

// fireResend re-sends refused RequestData at once (the backoff's timer).
func (m *rrModel) fireResend() {
	for _, w := range m.w {
		_ = w
	}
	if !m.stopped && m.s.resend {
		m.step(RxTimeout{Kind: TimerResend})
	}
}

func sortedU64(set map[uint64]bool) []uint64 {
	var out []uint64
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

var _ = fmt.Sprint

var rrStats = map[string]int{}

func TestZZRRStats(t *testing.T) { t.Log(rrStats) }
