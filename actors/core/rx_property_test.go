package core

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
	"pgregory.net/rapid"
)

// rxModelWriter is what the model knows of one writer.
type rxModelWriter struct {
	inc     uint64 // the incarnation it is addressed to
	sending bool   // a copy of its RequestData is with the worker
	left    bool   // a copy left this process (RxSent without an error)
	proven  bool   // a proof that it writes no more was stepped
	exact   bool   // a valid SUCCESS of this epoch with the planned bytes
}

type rxModel struct {
	t        *rapid.T
	s        *RxSession
	now      time.Time
	w        []rxModelWriter
	want     []uint64
	begun    bool
	decided  bool
	first    RxState
	quar     bool
	stopped  bool
	finishes int
	timers   map[TimerKind]int
}

const rxModelSelfInc = 11

func newRxModel(rt *rapid.T) *rxModel {
	n := rapid.IntRange(1, 3).Draw(rt, "writers")
	cfg := RxConfig{Request: "r1", Epoch: 7, Self: messages.PeerID{Instance: "gen"}, Blocks: testRxBlocks,
		Incarnation: rxModelSelfInc, CancelResend: time.Second}
	if rapid.Bool().Draw(rt, "deadline") {
		cfg.Deadline = testEpoch0.Add(time.Minute)
	}
	m := &rxModel{t: rt, now: testEpoch0, timers: map[TimerKind]int{}}
	for w := range n {
		var inc uint64
		if rapid.IntRange(0, 3).Draw(rt, fmt.Sprintf("inc-%d", w)) > 0 {
			inc = 100
		}
		want := uint64(32 * (w + 1))
		cfg.Writers = append(cfg.Writers, RxWriter{Peer: ctxPeer(w), Worker: w % 2, Bytes: want, Incarnation: inc,
			Request: &messages.RequestData{RequestID: "r1", Epoch: 7, From: cfg.Self,
				Incarnations: messages.Incarnations{FromIncarnation: rxModelSelfInc, ToIncarnation: inc}}})
		m.w = append(m.w, rxModelWriter{inc: inc})
		m.want = append(m.want, want)
	}
	m.s = NewRxSession(cfg)
	return m
}

// mayWrite reports whether writer w may still write the blocks.
func (m *rxModel) mayWrite(w int) bool {
	return (m.w[w].left || m.w[w].sending) && !m.w[w].proven
}

func (m *rxModel) step(msg any) {
	rt := m.t
	before := m.s.State()
	effs := m.s.Step(msg, m.now)
	after := m.s.State()
	if m.stopped && len(effs) > 0 {
		rt.Fatalf("%T after Stop: %s", msg, fmtEffects(effs))
	}
	if before.Terminal() && after != before {
		rt.Fatalf("%T: terminal %v overwritten by %v", msg, before, after)
	}
	if after.Terminal() && !m.decided {
		m.decided, m.first = true, after
	}
	for _, e := range effs {
		switch e := e.(type) {
		case SendRequestData:
			m.w[e.Writer].sending = true
			if e.Frame.ToIncarnation != m.w[e.Writer].inc {
				rt.Fatalf("%T: RequestData to writer %d addressed to %d, model %d", msg, e.Writer, e.Frame.ToIncarnation, m.w[e.Writer].inc)
			}
		case Readdress:
			m.w[e.Writer].inc = e.Incarnation
		case StartTimer:
			m.timers[e.Kind]++
		case QuarantineDest:
			m.quar = true
		case Finish:
			m.finishes++
			if m.finishes > 1 {
				rt.Fatalf("%T: second Finish", msg)
			}
			if e.Outcome.OK {
				if before.Terminal() {
					rt.Fatalf("%T: READY after %v", msg, before)
				}
				for w := range m.w {
					if !m.w[w].exact {
						rt.Fatalf("%T: READY without writer %d's exact SUCCESS", msg, w)
					}
				}
			}
		case ReleaseDest:
			for w := range m.w {
				if m.mayWrite(w) {
					rt.Fatalf("%T: ReleaseDest while writer %d may write (%+v)", msg, w, m.w[w])
				}
			}
			if e.Quarantined != m.quar {
				rt.Fatalf("%T: ReleaseDest quarantined=%v, model %v", msg, e.Quarantined, m.quar)
			}
		case Stop:
			m.stopped = true
		}
	}
	if after.Terminal() && after != RxReady && !m.quar {
		for w := range m.w {
			if m.mayWrite(w) {
				rt.Fatalf("%T: %v with writer %d unproven, blocks not quarantined", msg, after, w)
			}
		}
	}
}

func (m *rxModel) sendingWriters() []int {
	var out []int
	for w := range m.w {
		if m.w[w].sending {
			out = append(out, w)
		}
	}
	return out
}

func (m *rxModel) randomStep() {
	rt := m.t
	var actions []string
	add := func(name string, weight int) {
		for range weight {
			actions = append(actions, name)
		}
	}
	if !m.begun {
		add("begin", 6)
	}
	if len(m.sendingWriters()) > 0 {
		add("sent", 8)
		add("address", 1)
	}
	add("result", 8)
	add("cancel-ack", 2)
	add("gone", 1)
	add("suspect", 1)
	add("heard", 1)
	add("cancel", 1)
	add("abandon", 1)
	add("panic", 1)
	add("worker-dead", 1)
	for _, k := range []TimerKind{TimerDeadline, TimerDrain, TimerResend} {
		if m.timers[k] > 0 {
			add(fmt.Sprintf("timer-%d", k), 2)
		}
	}
	w := rapid.IntRange(0, len(m.w)-1).Draw(rt, "writer")
	incOf := func(label string) uint64 {
		switch rapid.IntRange(0, 3).Draw(rt, label) {
		case 0:
			return 0
		case 1:
			return 99 // another incarnation
		}
		return m.w[w].inc
	}
	switch a := rapid.SampledFrom(actions).Draw(rt, "action"); a {
	case "begin":
		m.begun = true
		m.step(RxBegin{})
	case "sent":
		w := rapid.SampledFrom(m.sendingWriters()).Draw(rt, "sent-writer")
		var err error
		switch rapid.IntRange(0, 5).Draw(rt, "sent-err") {
		case 0:
			err = errors.New("queue full")
		case 1:
			err = control.ErrFrameRefused
		}
		m.w[w].sending = false
		if err == nil {
			m.w[w].left = true
		}
		m.step(RxSent{Writer: w, Err: err})
	case "address":
		w := rapid.SampledFrom(m.sendingWriters()).Draw(rt, "address-writer")
		m.w[w].sending = false
		m.w[w].inc += 1000
		m.step(RxAddress{Writer: w, Incarnation: m.w[w].inc})
	case "result", "cancel-ack":
		epoch := uint64(7)
		if rapid.IntRange(0, 5).Draw(rt, "stale-epoch") == 0 {
			epoch = 6
		}
		incs := messages.Incarnations{FromIncarnation: incOf("from-inc"), ToIncarnation: rxModelSelfInc}
		if rapid.IntRange(0, 5).Draw(rt, "to-other") == 0 {
			incs.ToIncarnation = 12
		}
		var invalid error
		if rapid.IntRange(0, 7).Draw(rt, "invalid") == 0 {
			invalid = messages.ErrInvalid
		}
		var f messages.Frame
		status := messages.StatusSuccess
		bytes := m.want[w]
		if a == "result" {
			switch rapid.IntRange(0, 7).Draw(rt, "status") {
			case 0:
				status = messages.StatusFailed
			case 1:
				status = messages.StatusCancelled
			case 2:
				status = messages.StatusInDoubt
			}
			if rapid.IntRange(0, 4).Draw(rt, "short") == 0 {
				bytes--
			}
			f = &messages.Result{RequestID: "r1", Epoch: epoch, From: ctxPeer(w), Status: status, Bytes: bytes, Incarnations: incs}
		} else {
			f = &messages.CancelAck{RequestID: "r1", Epoch: epoch, From: ctxPeer(w), Incarnations: incs}
		}
		ours := epoch == 7 && (m.w[w].inc == 0 || incs.FromIncarnation == 0 || incs.FromIncarnation == m.w[w].inc) &&
			(incs.ToIncarnation == 0 || incs.ToIncarnation == rxModelSelfInc)
		if ours && invalid == nil && !m.w[w].proven {
			m.w[w].proven = true
			if a == "result" && status == messages.StatusSuccess && bytes == m.want[w] {
				m.w[w].exact = true
			}
		}
		m.step(RxFrame{Writer: w, Frame: f, Invalid: invalid})
	case "gone":
		inc := incOf("gone-inc")
		if inc == 0 || m.w[w].inc == 0 || inc == m.w[w].inc {
			m.w[w].proven = true
		}
		m.step(RxPeerGone{Writer: w, Err: errors.New("exited"), Incarnation: inc})
	case "suspect":
		m.step(RxSuspect{Writer: w, Incarnation: incOf("suspect-inc")})
	case "heard":
		m.step(RxHeard{Writer: w, Incarnation: incOf("heard-inc")})
	case "cancel":
		m.step(RxCancel{})
	case "abandon":
		m.step(RxAbandon{})
	case "panic":
		m.step(RxPanic{Err: errors.New("nil map")})
	case "worker-dead":
		m.step(RxWorkerDead{Worker: rapid.IntRange(0, 1).Draw(rt, "worker")})
	default:
		var k TimerKind
		if _, err := fmt.Sscanf(a, "timer-%d", &k); err != nil {
			rt.Fatalf("unknown action %q", a)
		}
		m.timers[k]--
		m.now = m.now.Add(time.Minute)
		m.step(RxTimeout{Kind: k})
	}
}

// TestProperty_RxInterleavings drives an RxSession through random
// interleavings of what its environment may deliver and checks the one
// rule at every step: READY only on every writer's exact SUCCESS of this
// epoch and incarnation, ReleaseDest only once no writer whose
// RequestData may have left is without a proof, and a failure with such a
// writer quarantines the blocks.
func TestProperty_RxInterleavings(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newRxModel(rt)
		for range rapid.IntRange(0, 60).Draw(rt, "steps") {
			if m.stopped {
				break
			}
			m.randomStep()
		}
	})
}
