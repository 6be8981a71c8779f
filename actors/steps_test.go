package actors

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// What the meter tests need of the pure steps (actors/core has the step
// tests themselves, with their own, stricter harnesses): a TxSession and an
// RxSession stepped on a fake clock, and a random driver of a TxSession
// through its exported messages only.

const testBlockTokens = 16

var testEpoch0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// fakePlanner plans one segment per chunk with bytes = tokens.
type fakePlanner struct{}

func (fakePlanner) Plan(c kvcache.Chunk, _ []kvcache.BlockRun, buf []kvcache.Segment) ([]kvcache.Segment, uint64, error) {
	n := uint64(c.Tokens())
	if n == 0 {
		return buf, 0, nil
	}
	return append(buf, kvcache.Segment{Src: uint64(c.Start), Dst: uint64(c.Start), Len: n}), n, nil
}

func genPeer(p int) messages.PeerID { return messages.PeerID{Instance: "gen", Rank: int32(p)} }
func ctxPeer(p int) messages.PeerID { return messages.PeerID{Instance: "ctx", Rank: int32(p)} }

// testChunk builds the chunk [start, end) of one layer group.
func testChunk(start, end int, last bool) TxChunk {
	first := start / testBlockTokens
	var run kvcache.BlockRun
	run.First = first
	for b := first; b < (end+testBlockTokens-1)/testBlockTokens; b++ {
		run.IDs = append(run.IDs, kvcache.BlockID(b))
	}
	return TxChunk{Chunk: kvcache.Chunk{Start: start, End: end, FirstBlock: first, Last: last}, Src: []kvcache.BlockRun{run}}
}

func testRoute(p int) *Route {
	return &Route{Peer: genPeer(p), AgentAddr: []byte(fmt.Sprintf("gen-%d", p)), Planner: fakePlanner{}}
}

// txStepper steps a TxSession on a fake clock.
type txStepper struct {
	t      testing.TB
	s      *TxSession
	now    time.Time
	prompt int // TxStart's, for a TxPeerRequest that names none
}

func newTxStepper(t testing.TB) *txStepper {
	return &txStepper{t: t, now: testEpoch0, s: NewTxSession(TxConfig{Request: "r1", Self: ctxPeer(0),
		Workers: 1, DrainGrace: 5 * time.Second})}
}

// step steps msg; a TxPeerRequest without a prompt length gets TxStart's
// (the generation rank planned for the same prompt).
func (h *txStepper) step(msg any) []Effect {
	switch m := msg.(type) {
	case TxStart:
		h.prompt = m.PromptLen
	case TxPeerRequest:
		if m.PromptLen == 0 {
			m.PromptLen = h.prompt
			msg = m
		}
	}
	return h.s.Step(msg, h.now)
}

func (h *txStepper) advance(d time.Duration) { h.now = h.now.Add(d) }
func (h *txStepper) op(peer, seq int) OpRef  { return OpRef{Request: "r1", Peer: peer, Seq: seq} }

// rxStepper steps an RxSession on a fake clock.
type rxStepper struct {
	s   *RxSession
	now time.Time
}

func newRxStepper(writers int) *rxStepper {
	cfg := RxConfig{Request: "r1", Epoch: 7, Self: genPeer(0), Blocks: [][]kvcache.BlockID{{0, 1}}}
	for w := range writers {
		cfg.Writers = append(cfg.Writers, RxWriter{Peer: ctxPeer(w), Worker: w % 2, Bytes: 32,
			Request: &messages.RequestData{RequestID: "r1", Epoch: 7, From: cfg.Self}})
	}
	return &rxStepper{s: NewRxSession(cfg), now: testEpoch0}
}

func (h *rxStepper) step(msg any) []Effect { return h.s.Step(msg, h.now) }

// fmtTxState is the session's state and its ops, for failure messages.
func fmtTxState(s *TxSession) string {
	ops := s.OpStates()
	refs := make([]OpRef, 0, len(ops))
	for r := range ops {
		refs = append(refs, r)
	}
	slices.SortFunc(refs, cmpRef)
	out := fmt.Sprintf("%v err=%v stopped=%v", s.State(), s.Err(), s.Stopped())
	for _, r := range refs {
		out += fmt.Sprintf(" p%d/%d:%v", r.Peer, r.Seq, ops[r])
	}
	return out
}

func cmpRef(a, b OpRef) int {
	if a.Peer != b.Peer {
		return a.Peer - b.Peer
	}
	return a.Seq - b.Seq
}

// txDriver drives a TxSession with two peers and four chunks through
// random interleavings of its messages: what a worker, a peer, the fences,
// the timers and the serving process may send it, in any order the shell
// allows. It follows the session's effects (Submit, Flush, StartTimer) to
// know what may come back.
type txDriver struct {
	rt       *rapid.T
	s        *TxSession
	now      time.Time
	started  bool
	sent     int // chunks handed over
	fences   []int
	inflight map[OpRef]bool
	doubted  map[OpRef]bool
	flushing map[int]bool
	sending  map[int]bool // streams whose terminal frame a worker holds (no TxSent yet)
	timers   map[TimerKind]bool
	asked    map[int]bool
}

func newTxDriver(rt *rapid.T) *txDriver {
	return &txDriver{rt: rt, now: testEpoch0, s: NewTxSession(TxConfig{Request: "r1", Self: ctxPeer(0), Workers: 2,
		DrainGrace: time.Second, Timeout: time.Minute}),
		inflight: map[OpRef]bool{}, doubted: map[OpRef]bool{}, flushing: map[int]bool{}, sending: map[int]bool{}, timers: map[TimerKind]bool{}, asked: map[int]bool{}}
}

func (d *txDriver) step(msg any) {
	for _, e := range d.s.Step(msg, d.now) {
		switch e := e.(type) {
		case WatchFence:
			d.fences = append(d.fences, e.Chunk)
		case Submit:
			d.inflight[e.Op] = true
		case Flush:
			d.flushing[e.Peer] = true
		case SendFrame:
			if e.FromStream {
				d.sending[e.Peer] = true // its worker reports TxSent
			}
		case StartTimer:
			d.timers[e.Kind] = true
		}
	}
}

func sortedOps(set map[OpRef]bool) []OpRef {
	out := make([]OpRef, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	slices.SortFunc(out, cmpRef)
	return out
}

func sortedPeers(set map[int]bool) []int {
	out := make([]int, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

const driverChunks = 4

func (d *txDriver) chunk() TxChunk {
	c := testChunk(d.sent*16, (d.sent+1)*16, d.sent == driverChunks-1)
	d.sent++
	return c
}

func (d *txDriver) randomStep() {
	rt := d.rt
	actions := []string{"cancel", "panic", "tick"}
	if !d.started {
		actions = append(actions, "start", "start")
	}
	if d.started && d.sent < driverChunks {
		actions = append(actions, "chunk", "chunk", "chunk")
	}
	if len(d.fences) > 0 {
		actions = append(actions, "fence", "fence", "fence")
	}
	if len(d.asked) < 2 {
		actions = append(actions, "request", "request")
	}
	if len(d.inflight) > 0 {
		actions = append(actions, "complete", "complete", "complete", "submitted", "crash")
	}
	if len(d.doubted) > 0 {
		actions = append(actions, "retire", "retire")
	}
	if len(d.flushing) > 0 {
		actions = append(actions, "flush", "flush")
	}
	if len(d.sending) > 0 {
		actions = append(actions, "sent", "sent")
	}
	for k := range d.timers {
		actions = append(actions, fmt.Sprintf("timer-%d", k))
	}
	slices.Sort(actions) // map order must not leak into the draw
	switch a := rapid.SampledFrom(actions).Draw(rt, "action"); a {
	case "start":
		d.started = true
		d.step(TxStart{PromptLen: 16 * driverChunks, Deadline: d.now.Add(time.Minute)})
	case "chunk":
		d.step(d.chunk())
	case "fence":
		i := rapid.IntRange(0, len(d.fences)-1).Draw(rt, "fence")
		c := d.fences[i]
		d.fences = slices.Delete(d.fences, i, i+1)
		var err error
		if rapid.IntRange(0, 7).Draw(rt, "fence-err") == 0 {
			err = errors.New("producer failed")
		}
		d.step(TxFenceFired{Index: c, Err: err})
	case "request":
		p := 1
		if d.asked[1] {
			p = 2
		}
		d.asked[p] = true
		d.step(TxPeerRequest{Peer: p, From: genPeer(p), Epoch: 1, PromptLen: 16 * driverChunks, Route: testRoute(p), Expected: []int{1, 2}})
	case "complete":
		r := rapid.SampledFrom(sortedOps(d.inflight)).Draw(rt, "op")
		delete(d.inflight, r)
		msg := TxCompleted{Op: r}
		if rapid.IntRange(0, 5).Draw(rt, "outcome") == 5 {
			msg.Err = errors.New("remote write failed")
		}
		d.step(msg)
	case "submitted":
		d.step(TxSubmitted{Op: rapid.SampledFrom(sortedOps(d.inflight)).Draw(rt, "op")})
	case "crash":
		ops := sortedOps(d.inflight)
		for _, r := range ops {
			d.doubted[r] = true
			delete(d.inflight, r)
		}
		d.step(TxInDoubt{Ops: ops, Reason: ErrWorkerCrashed})
	case "retire":
		ops := sortedOps(d.doubted)
		clear(d.doubted)
		d.step(TxRetired{Ops: ops})
	case "flush":
		p := rapid.SampledFrom(sortedPeers(d.flushing)).Draw(rt, "peer")
		delete(d.flushing, p)
		d.step(TxFlushed{Peer: p})
	case "sent":
		p := rapid.SampledFrom(sortedPeers(d.sending)).Draw(rt, "peer")
		delete(d.sending, p)
		msg := TxSent{Peer: p}
		if rapid.IntRange(0, 5).Draw(rt, "sent-err") == 5 {
			msg.Err = errors.New("queue full")
		}
		d.step(msg)
	case "cancel":
		d.step(TxCancel{})
	case "panic":
		d.step(TxPanic{Err: errors.New("nil map")})
	case "tick":
		d.now = d.now.Add(time.Second)
	default:
		var k TimerKind
		if _, err := fmt.Sscanf(a, "timer-%d", &k); err != nil {
			rt.Fatalf("unknown action %q", a)
		}
		delete(d.timers, k)
		d.step(TxTimeout{Kind: k})
	}
}

// drain delivers everything outstanding until the session stops.
func (d *txDriver) drain() {
	for i := 0; !d.s.Stopped(); i++ {
		if i > 1000 {
			d.rt.Fatalf("no progress: %s", fmtTxState(d.s))
		}
		switch {
		case len(d.fences) > 0:
			c := d.fences[0]
			d.fences = d.fences[1:]
			d.step(TxFenceFired{Index: c})
		case len(d.inflight) > 0:
			r := sortedOps(d.inflight)[0]
			delete(d.inflight, r)
			d.step(TxCompleted{Op: r})
		case len(d.doubted) > 0:
			ops := sortedOps(d.doubted)
			clear(d.doubted)
			d.step(TxRetired{Ops: ops})
		case len(d.flushing) > 0:
			p := sortedPeers(d.flushing)[0]
			delete(d.flushing, p)
			d.step(TxFlushed{Peer: p})
		case len(d.sending) > 0:
			p := sortedPeers(d.sending)[0]
			delete(d.sending, p)
			d.step(TxSent{Peer: p})
		case d.timers[TimerDrain]:
			delete(d.timers, TimerDrain)
			d.step(TxTimeout{Kind: TimerDrain})
		case !d.s.State().Terminal():
			d.step(TxCancel{})
		default:
			d.rt.Fatalf("stuck: nothing outstanding, not stopped: %s", fmtTxState(d.s))
		}
	}
}
