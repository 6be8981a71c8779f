package core

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// Incarnations of the Misaddressed tests: the generation rank's, the
// writer's that crashed (the request is addressed to it), and its
// successor's on the same endpoint.
const misGen, misOld, misNew = 5, 3, 9

// misHarness is a session of writers writers, each addressed to
// incarnation misOld, on a rank of incarnation misGen, begun.
func misHarness(t *testing.T, writers int) *rxHarness {
	h := newRxHarness(t, writers, 10*time.Second)
	h.s.cfg.Incarnation = misGen
	for i := range h.s.cfg.Writers {
		rd := *h.s.cfg.Writers[i].Request
		rd.Incarnations = messages.Incarnations{FromIncarnation: misGen, ToIncarnation: misOld}
		h.s.cfg.Writers[i].Request, h.s.cfg.Writers[i].Incarnation = &rd, misOld
	}
	h.step(RxBegin{})
	return h
}

// misaddressed is writer w's Misaddressed: its RequestData, addressed to
// incarnation addressed, reached incarnation by, which dropped it.
func misaddressed(w int, addressed, by uint64) RxFrame {
	return RxFrame{Writer: w, Frame: &messages.Misaddressed{RequestID: "r1", Epoch: 7, From: ctxPeer(w), Addressed: addressed,
		Incarnations: messages.Incarnations{FromIncarnation: by, ToIncarnation: misGen}}}
}

func resultOf(w int, st messages.Status, from uint64) RxFrame {
	return RxFrame{Writer: w, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(w), Status: st, Bytes: 32,
		Incarnations: messages.Incarnations{FromIncarnation: from, ToIncarnation: misGen}}}
}

// TestRx_MisaddressedReaddressesToTheRestartedWriter: the zmq restart
// window. The writer's incarnation misOld crashed without a goodbye and
// misNew restarted on its endpoint; this rank still holds misOld's Hello
// as live (no heartbeat missed yet), so the RequestData leaves addressed
// to misOld (Addressing lets it go), and misNew, which takes frames on
// the endpoint before its Hello is read here, gets it and drops it as
// addressed to its predecessor. The session took it as delivered and
// never sent it again: the request was lost (failed on misOld's exit
// proof, or at its deadline, its blocks quarantined meanwhile). misNew
// now answers Misaddressed, which came after its Hello on its
// connection (so the Hello read here names misNew by then): the session
// addresses the writer to misNew, sends the RequestData again, and it
// reaches misNew addressed to it; misOld's answers and proofs count for
// nothing from then on, and misNew's SUCCESS makes the request READY.
//
// Driven as the shell does (Addressing before each send), on the fake
// clock. Checked: without onMisaddressed (the frame counted stale, as any
// frame the session does not know) it fails: the RequestData reached
// misNew once, addressed to misOld, and the session timed out.
func TestRx_MisaddressedReaddressesToTheRestartedWriter(t *testing.T) {
	h := newRxHarness(t, 1, 10*time.Second)
	h.s.cfg.Incarnation = misGen
	rd := *h.s.cfg.Writers[0].Request
	rd.Incarnations = messages.Incarnations{FromIncarnation: misGen, ToIncarnation: misOld}
	h.s.cfg.Writers[0].Request, h.s.cfg.Writers[0].Incarnation = &rd, misOld

	// The control plane here: misOld's Hello, still taken as live.
	hello := &messages.Hello{From: ctxPeer(0), Incarnation: misOld}
	var reached []uint64 // the incarnation each RequestData that reached misNew was addressed to
	var timers []StartTimer
	var readdressed []uint64
	var answers []RxFrame // misNew's Misaddressed, on their way back
	var shell func(effs []Effect)
	shell = func(effs []Effect) {
		for _, e := range effs {
			switch e := e.(type) {
			case StartTimer:
				timers = append(timers, e)
			case Readdress:
				readdressed = append(readdressed, e.Incarnation)
			case SendRequestData:
				if m := Addressing(e, hello, nil); m != nil {
					shell(h.step(m))
					continue
				}
				shell(h.step(RxSent{Writer: e.Writer}))
				reached = append(reached, e.Frame.ToIncarnation)
				if e.Frame.ToIncarnation != misNew {
					// misNew drops it, and says so after its Hello: the
					// Hello read here names misNew from then on.
					hello = &messages.Hello{From: ctxPeer(0), Incarnation: misNew}
					answers = append(answers, misaddressed(0, e.Frame.ToIncarnation, misNew))
				}
			}
		}
	}
	shell(h.step(RxBegin{}))
	for len(answers) > 0 {
		a := answers[0]
		answers = answers[1:]
		shell(h.step(a))
	}
	// misOld's exit proof and a (forged or late) SUCCESS of misOld: no
	// longer this request's.
	if effs := h.step(RxPeerGone{Writer: 0, Incarnation: misOld, Err: fmt.Errorf("%w: misOld exited", ErrPeerGone)}); len(effs) != 0 {
		t.Fatalf("misOld's exit proof after the re-address: %s, want nothing", fmtEffects(effs))
	}
	if effs := h.step(resultOf(0, messages.StatusSuccess, misOld)); len(effs) != 0 {
		t.Fatalf("misOld's SUCCESS after the re-address: %s, want nothing", fmtEffects(effs))
	}
	// The deadline's timer may fire no sooner than it would have.
	for len(timers) > 0 && !h.s.State().Terminal() && !slices.Contains(reached, misNew) {
		slices.SortStableFunc(timers, func(a, b StartTimer) int { return a.At.Compare(b.At) })
		next := timers[0]
		timers = timers[1:]
		h.now = next.At
		shell(h.step(RxTimeout{Kind: next.Kind}))
	}
	if !slices.Equal(reached, []uint64{misOld, misNew}) {
		t.Fatalf("RequestData reached misNew addressed to %v, want [%d %d] (state %v, err %v, quarantined %v)",
			reached, misOld, misNew, h.s.State(), h.s.Err(), h.s.Quarantined())
	}
	if !slices.Equal(readdressed, []uint64{misNew}) {
		t.Fatalf("Readdress to %v, want [%d] (the parent's table follows)", readdressed, misNew)
	}
	h.wantState(RxReceiving)
	if w := h.s.cfg.Writers[0]; w.Incarnation != misNew || w.Request.ToIncarnation != misNew || w.DroppedBy != misNew {
		t.Fatalf("writer addressed to %d (RequestData to %d, dropped by %d), want %d", w.Incarnation, w.Request.ToIncarnation, w.DroppedBy, misNew)
	}
	h.step(resultOf(0, messages.StatusSuccess, misNew))
	h.wantState(RxReady)
}

// TestRx_MisaddressedDecidedNeverReached: a request decided (cancelled
// here) while its RequestData was on its way to the writer's endpoint:
// its blocks are quarantined, the writer given no proof, and the Cancel
// addressed to misOld is dropped by misNew too. misNew's Misaddressed
// shows that no incarnation got the RequestData (misOld did not: the one
// copy went to misNew, which dropped it): the writer is quiescent for
// the request, as for a RequestData that never left, and the blocks
// leave quarantine.
func TestRx_MisaddressedDecidedNeverReached(t *testing.T) {
	h := misHarness(t, 1)
	h.step(RxSent{Writer: 0})
	h.step(RxCancel{})
	h.wantState(RxCancelled)
	if !h.s.Quarantined() {
		t.Fatal("cancelled with the RequestData delivered: want the blocks quarantined")
	}
	effs := h.step(misaddressed(0, misOld, misNew))
	wantNo(t, "Misaddressed after the outcome", effs, "SendRequestData", "SendFrame")
	if r := effectsOf[ReleaseDest](effs); len(r) != 1 || !r[0].Quarantined || !h.s.Stopped() {
		t.Fatalf("want the quarantined blocks released: %s", fmtEffects(effs))
	}
}

// TestRx_MisaddressedIgnored: a Misaddressed that does not answer the
// one RequestData copy the writer has out, unanswered, changes nothing
// but the session's stale count: no send, no Readdress, no release, no
// new state, the writer still addressed as it was. Each case, taken,
// would re-address the writer (and let another incarnation's answer free
// blocks misOld might be writing into) or re-send a frame that was never
// lost. Checked: with onMisaddressed's guard reduced to the epoch, every
// case fails but those checked before it (another epoch, invalid, a
// writer out of range).
func TestRx_MisaddressedIgnored(t *testing.T) {
	type setup func(t *testing.T, h *rxHarness)
	sent := func(t *testing.T, h *rxHarness) { h.step(RxSent{Writer: 0}) }
	for _, c := range []struct {
		name  string
		setup setup
		frame RxFrame
	}{
		{"another epoch", sent, func() RxFrame {
			f := misaddressed(0, misOld, misNew)
			f.Frame.(*messages.Misaddressed).Epoch = 8
			return f
		}()},
		{"addressed to another incarnation of the writer", sent, misaddressed(0, misOld+1, misNew)},
		{"addressed to no incarnation", sent, misaddressed(0, 0, misNew)},
		{"dropped by an earlier incarnation", sent, misaddressed(0, misOld, misOld-1)},
		{"dropped by the one it was addressed to", sent, misaddressed(0, misOld, misOld)},
		{"to another incarnation of this rank", sent, func() RxFrame {
			f := misaddressed(0, misOld, misNew)
			f.Frame.(*messages.Misaddressed).ToIncarnation = misGen + 1
			return f
		}()},
		{"invalid", sent, func() RxFrame {
			f := misaddressed(0, misOld, misNew)
			f.Invalid = fmt.Errorf("%w: broken", messages.ErrInvalid)
			return f
		}()},
		{"writer out of range", sent, misaddressed(2, misOld, misNew)},
		{"RequestData refused (never left)", func(t *testing.T, h *rxHarness) {
			h.step(RxSent{Writer: 0, Err: fmt.Errorf("%w: queue full", ErrPeerGone)})
		}, misaddressed(0, misOld, misNew)},
		{"after misOld answered SUCCESS", func(t *testing.T, h *rxHarness) {
			h.step(RxSent{Writer: 0})
			h.step(resultOf(0, messages.StatusSuccess, misOld))
		}, misaddressed(0, misOld, misNew)},
		{"after misOld proved it exited", func(t *testing.T, h *rxHarness) {
			h.step(RxSent{Writer: 0})
			h.step(RxPeerGone{Writer: 0, Incarnation: misOld, Err: fmt.Errorf("%w: exited", ErrPeerGone)})
		}, misaddressed(0, misOld, misNew)},
		{"answered already (a duplicate)", func(t *testing.T, h *rxHarness) {
			h.step(RxSent{Writer: 0})
			h.step(misaddressed(0, misOld, misNew))
			h.step(RxSent{Writer: 0})
		}, misaddressed(0, misOld, misNew)},
		{"a second answer of the same incarnation", func(t *testing.T, h *rxHarness) {
			// Taken once; a Hello that still named misOld addressed it
			// back (RxAddress) and it left: misNew answering again is no
			// distinct copy's answer.
			h.step(RxSent{Writer: 0})
			h.step(misaddressed(0, misOld, misNew))
			h.step(RxAddress{Writer: 0, Incarnation: misOld})
			h.step(RxSent{Writer: 0})
		}, misaddressed(0, misOld, misNew)},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Two writers: writer 1 keeps the request live whatever
			// writer 0 does.
			h := misHarness(t, 2)
			h.step(RxSent{Writer: 1})
			c.setup(t, h)
			state, stale := h.s.State(), h.s.StaleFrames
			writers := slices.Clone(h.s.cfg.Writers)
			sent, ws := slices.Clone(h.s.sent), slices.Clone(h.s.writers)
			if effs := h.step(c.frame); len(effs) != 0 {
				t.Fatalf("%s: %s, want nothing", c.name, fmtEffects(effs))
			}
			if h.s.StaleFrames != stale+1 {
				t.Errorf("stale frames %d, want %d", h.s.StaleFrames, stale+1)
			}
			if h.s.State() != state || !reflect.DeepEqual(h.s.cfg.Writers, writers) ||
				!slices.Equal(h.s.sent, sent) || !slices.Equal(h.s.writers, ws) {
				t.Fatalf("the session changed: state %v (was %v), writers %+v (were %+v)", h.s.State(), state, h.s.cfg.Writers, writers)
			}
		})
	}
	// A later incarnation's answer for the copy addressed back to misOld
	// is taken: it got that copy, misNew did not.
	h := misHarness(t, 1)
	h.step(RxSent{Writer: 0})
	h.step(misaddressed(0, misOld, misNew))
	h.step(RxAddress{Writer: 0, Incarnation: misOld})
	h.step(RxSent{Writer: 0})
	effs := h.step(misaddressed(0, misOld, misNew+1))
	if s := effectsOf[SendRequestData](effs); len(s) != 1 || s[0].Frame.ToIncarnation != misNew+1 {
		t.Fatalf("a later incarnation's answer: %s, want the RequestData addressed to %d", fmtEffects(effs), misNew+1)
	}
}

// TestIncarnationTable_Misaddressed: the listener answers a RequestData
// it refused (Admit) only when it is addressed to an earlier incarnation
// of this rank by a sender not earlier than one heard; deciding so
// changes nothing (a dropped frame teaches no incarnation).
func TestIncarnationTable_Misaddressed(t *testing.T) {
	gen := messages.PeerID{Instance: "gen", Rank: 0}
	rd := func(from, to uint64) *messages.RequestData {
		return &messages.RequestData{RequestID: "r1", Epoch: 7, From: gen, Incarnations: messages.Incarnations{FromIncarnation: from, ToIncarnation: to}}
	}
	tb := NewIncarnationTable(misNew)
	if err := tb.Admit(rd(misGen, misNew)); err != nil { // teaches misGen
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    messages.Frame
		want bool
	}{
		{"addressed to an earlier incarnation", rd(misGen, misOld), true},
		{"from a later incarnation of the sender", rd(misGen+1, misOld), true},
		{"addressed to this one", rd(misGen, misNew), false},
		{"addressed to a later one", rd(misGen, misNew+1), false},
		{"addressed to none", rd(misGen, 0), false},
		{"from no incarnation", rd(0, misOld), false},
		{"from an earlier incarnation of the sender", rd(misGen-1, misOld), false},
		{"a Cancel", &messages.Cancel{RequestID: "r1", From: gen, Incarnations: messages.Incarnations{FromIncarnation: misGen, ToIncarnation: misOld}}, false},
	} {
		if _, got := tb.Misaddressed(c.f); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if got := tb.Of(gen); got != misGen {
		t.Fatalf("the sender's incarnation is %d after Misaddressed, want %d (taught nothing)", got, misGen)
	}
	if _, ok := NewIncarnationTable(0).Misaddressed(rd(misGen, misOld)); ok {
		t.Fatal("a rank of no incarnation answered")
	}
	if d, err := RouteFrame(misaddressed(0, misOld, misNew).Frame); d != FrameToRx || err != nil {
		t.Fatalf("RouteFrame(Misaddressed) = %v, %v; want FrameToRx", d, err)
	}
	bad := &messages.Misaddressed{RequestID: "r1", Epoch: 7, From: ctxPeer(0), Addressed: misNew,
		Incarnations: messages.Incarnations{FromIncarnation: misOld, ToIncarnation: misGen}}
	if d, err := RouteFrame(bad); d != FrameRejected || err == nil {
		t.Fatalf("RouteFrame(an invalid Misaddressed) = %v, %v; want FrameRejected", d, err)
	}
}

// TestMisaddressedAnswer: the writer answers only a sender whose Hello,
// as held now, is of the dropped frame's incarnation and says
// FeatureMisaddressed (a build before it would reject the frame, counted
// and logged); the answer names the request, its epoch, the incarnation
// it was addressed to, and is addressed to the frame's sender.
func TestMisaddressedAnswer(t *testing.T) {
	gen := messages.PeerID{Instance: "gen", Rank: 0}
	self := ctxPeer(0)
	rd := &messages.RequestData{RequestID: "r1", Epoch: 7, From: gen, Incarnations: messages.Incarnations{FromIncarnation: misGen, ToIncarnation: misOld}}
	hello := func(inc, features uint64) *messages.Hello {
		return &messages.Hello{From: gen, Incarnation: inc, Features: features}
	}
	all := messages.FeatureRemap | messages.FeatureLargePayload | messages.FeatureMisaddressed
	want := &messages.Misaddressed{RequestID: "r1", Epoch: 7, From: self, Addressed: misOld,
		Incarnations: messages.Incarnations{FromIncarnation: misNew, ToIncarnation: misGen}}
	if got := MisaddressedAnswer(rd, self, misNew, hello(misGen, all), nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("answer %+v, want %+v", got, want)
	} else if err := got.Validate(); err != nil {
		t.Fatalf("answer invalid: %v", err)
	}
	// No Hello known (a restart: the sender's connection reconnected
	// here unbound), but the RequestData says it takes the answer.
	said := *rd
	said.Features = messages.FeatureMisaddressed
	if got := MisaddressedAnswer(&said, self, misNew, nil, fmt.Errorf("%w: not heard", ErrPeerGone)); !reflect.DeepEqual(got, want) {
		t.Fatalf("answer to a RequestData that says the feature, no Hello known: %+v, want %+v", got, want)
	}
	for name, c := range map[string]struct {
		h       *messages.Hello
		err     error
		selfInc uint64
	}{
		"an older sender (no feature)":      {h: hello(misGen, messages.FeatureRemap|messages.FeatureLargePayload), selfInc: misNew},
		"no Hello known":                    {err: fmt.Errorf("%w: gone", ErrPeerGone), selfInc: misNew},
		"another incarnation of the sender": {h: hello(misGen+1, all), selfInc: misNew},
		"a sender of no incarnation":        {h: hello(0, all), selfInc: misNew},
		"addressed to this incarnation":     {h: hello(misGen, all), selfInc: misOld},
		"addressed to a later incarnation":  {h: hello(misGen, all), selfInc: misOld - 1},
		"another peer's Hello":              {h: &messages.Hello{From: ctxPeer(1), Incarnation: misGen, Features: all}, selfInc: misNew},
	} {
		if got := MisaddressedAnswer(rd, self, c.selfInc, c.h, c.err); got != nil {
			t.Errorf("%s: answered %+v, want none", name, got)
		}
	}
}

// TestRx_MisaddressedBeforeSentIsHeld: the restarted writer's answer can
// overtake the worker's word that the RequestData left (the link hands
// the frame over before the worker reports it sent: seen under the race
// detector in CI, where the answer was counted stale and the request lost
// at its deadline with its blocks quarantined). The answer is held, and
// judged when that word comes: taken if the copy left, dropped if it was
// refused or not sent (a copy that never left answers nothing).
func TestRx_MisaddressedBeforeSentIsHeld(t *testing.T) {
	for _, c := range []struct {
		name  string
		then  any
		taken bool
	}{
		{"then it left", RxSent{Writer: 0}, true},
		{"then it was refused", RxSent{Writer: 0, Err: fmt.Errorf("%w: queue full", ErrPeerGone)}, false},
		{"then it was addressed anew", RxAddress{Writer: 0, Incarnation: misNew}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := misHarness(t, 2)
			h.step(RxSent{Writer: 1})
			stale := h.s.StaleFrames
			writers := slices.Clone(h.s.cfg.Writers)
			if effs := h.step(misaddressed(0, misOld, misNew)); len(effs) != 0 {
				t.Fatalf("the early answer: %s, want nothing yet", fmtEffects(effs))
			}
			if !reflect.DeepEqual(h.s.cfg.Writers, writers) {
				t.Fatalf("the early answer changed the writers: %+v", h.s.cfg.Writers)
			}
			effs := h.step(c.then)
			var readdressed bool
			for _, e := range effs {
				if r, ok := e.(Readdress); ok && r.Writer == 0 && r.Incarnation == misNew {
					readdressed = true
				}
			}
			if c.taken {
				if !readdressed || h.s.cfg.Writers[0].Incarnation != misNew || h.s.cfg.Writers[0].DroppedBy != misNew {
					t.Fatalf("after the copy left: %s, writer %+v; want the answer taken (re-addressed to %d)", fmtEffects(effs), h.s.cfg.Writers[0], misNew)
				}
				return
			}
			if readdressed || h.s.cfg.Writers[0].DroppedBy != 0 || h.s.StaleFrames != stale {
				t.Fatalf("after %s: %s, writer %+v, stale %d: want the held answer dropped", c.name, fmtEffects(effs), h.s.cfg.Writers[0], h.s.StaleFrames)
			}
			// A later RxSent of a later copy does not take it either.
			h.step(RxSent{Writer: 0})
			if h.s.cfg.Writers[0].DroppedBy != 0 {
				t.Fatalf("the dropped answer was taken later: writer %+v", h.s.cfg.Writers[0])
			}
		})
	}
}
