package actors

import (
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/metrics"
)

func testMeters(t testing.TB) *meters {
	t.Helper()
	m, err := newMeters(metrics.New("test/0"), &Counters{}, NewPools(nil), nil, new(atomic.Int64), new(orphanStats))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// recount is the ops of s by state, counted the slow way.
func recount(s *TxSession) (n [core.NumOpStates]float64) {
	s.EachOp(func(_ OpRef, st OpState) { n[st]++ })
	return n
}

// TestProperty_TxMeterMatchesRecount drives a TxSession through the random
// interleavings of TestProperty_TxInterleavings, with a meter watching it
// as its shell would. After every step the meter's incremental op counts
// (which look only at each stream's ops in flight) equal a full recount,
// the gauges and the bytes counter agree with the session, and once the
// session released everything it has left every gauge at zero.
func TestProperty_TxMeterMatchesRecount(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		mt := testMeters(t)
		m := newTxDriver(rt)
		tm := mt.txSession()
		tm.born(m.s, m.now)
		check := func(when string) {
			if !tm.open {
				return
			}
			if want := recount(m.s); tm.counts != want {
				rt.Fatalf("%s: meter counts %v, recount %v: %s", when, tm.counts, want, fmtTxState(m.s))
			}
			for st, n := range tm.counts {
				if g := value(mt.ops[st]); g != n {
					rt.Fatalf("%s: gauge ops{%v} = %v, want %v", when, OpState(st), g, n)
				}
			}
			if n := m.s.InDoubt(); float64(n) != tm.counts[OpInDoubt] {
				rt.Fatalf("%s: the session counts %d ops IN_DOUBT (Stats.OpsInDoubt, ops_in_doubt), the recount %v", when, n, tm.counts[OpInDoubt])
			}
			var bytes uint64
			for i := range m.s.Streams() {
				bytes += m.s.Stream(i).Bytes()
			}
			if g := value(mt.bytesTx); g != float64(bytes) {
				rt.Fatalf("%s: bytes %v, want %d", when, g, bytes)
			}
			if g := value(mt.txSessions[m.s.State()]); g != 1 {
				rt.Fatalf("%s: sessions{%v} = %v, want 1", when, m.s.State(), g)
			}
		}
		steps := rapid.IntRange(0, 80).Draw(rt, "steps")
		for i := range steps {
			m.randomStep()
			tm.stepped(m.s, nil, m.now)
			check(fmt.Sprintf("step %d", i))
		}
		m.drain()
		tm.stepped(m.s, nil, m.now)
		if !m.s.Stopped() || !m.s.Quiescent() {
			rt.Fatalf("end: %s", fmtTxState(m.s))
		}
		if tm.open {
			rt.Fatalf("meter still open after the session stopped")
		}
		for st := range core.NumOpStates {
			if g := value(mt.ops[st]); g != 0 {
				rt.Fatalf("end: gauge ops{%v} = %v", OpState(st), g)
			}
		}
		for st := range core.NumTxStates {
			if g := value(mt.txSessions[st]); g != 0 {
				rt.Fatalf("end: sessions{%v} = %v", TxState(st), g)
			}
		}
		var failures float64
		for r := range numReasons {
			failures += value(mt.txFail[r])
		}
		if want := map[bool]float64{true: 0, false: 1}[m.s.State() == TxDone]; failures != want {
			rt.Fatalf("end: %v with %v failures counted", m.s.State(), failures)
		}
		if got := histCount(rt, mt.set, "kvxfer_transfer_duration_seconds", "side", "tx", "outcome", m.s.State().String()); got != 1 {
			rt.Fatalf("end: %v durations %d", m.s.State(), got)
		}
	})
}

// TestTxMeter_Chunk walks one request through a shell's meter with two
// peers: chunk-to-write latency is observed once per op that lands (not for
// a failed write), bytes move as ops land, and Send → Done is observed once
// with the outcome.
func TestTxMeter_Chunk(t *testing.T) {
	mt := testMeters(t)
	h := newTxStepper(t)
	tm := mt.txSession()
	tm.born(h.s, h.now)
	step := func(msg any) []Effect {
		eff := h.step(msg)
		tm.stepped(h.s, msg, h.now)
		return eff
	}
	step(TxStart{PromptLen: 64})
	h.advance(time.Millisecond)
	step(TxPeerRequest{Peer: 1, Epoch: 1, Route: testRoute(1), Expected: []int{1, 2}})
	step(TxPeerRequest{Peer: 2, Epoch: 1, Route: testRoute(2), Expected: []int{1, 2}})
	step(testChunk(0, 32, false))
	step(testChunk(32, 64, true))
	if g := value(mt.ops[OpAdmitted]); g != 4 {
		t.Fatalf("ADMITTED %v, want 4", g)
	}
	if g := value(mt.txSessions[TxReady]); g != 1 {
		t.Fatalf("sessions{READY} %v, want 1", g)
	}
	h.advance(2 * time.Millisecond)
	step(TxFenceFired{Index: 0})
	step(TxFenceFired{Index: 1})
	if g := value(mt.ops[OpSubmitting]); g != 4 {
		t.Fatalf("SUBMITTING %v, want 4", g)
	}
	h.advance(3 * time.Millisecond)
	for _, r := range []OpRef{h.op(1, 0), h.op(1, 1), h.op(2, 0), h.op(2, 1)} {
		step(TxCompleted{Op: r})
	}
	step(TxCompleted{Op: h.op(1, 0)}) // a duplicate: no second observation
	if got := histCount(t, mt.set, "kvxfer_chunk_write_latency_seconds"); got != 4 {
		t.Fatalf("chunk write observations %d, want 4", got)
	}
	if got := histSum(t, mt.set, "kvxfer_chunk_write_latency_seconds"); got < 4*0.005-1e-9 || got > 4*0.005+1e-9 {
		t.Fatalf("chunk write latency sum %v, want 4 × 5ms", got)
	}
	if g := value(mt.bytesTx); g != 128 {
		t.Fatalf("bytes %v, want 128", g)
	}
	step(TxFlushed{Peer: 1})
	step(TxFlushed{Peer: 2})
	step(TxSent{Peer: 1})
	step(TxSent{Peer: 2})
	if !h.s.Stopped() || h.s.State() != TxDone {
		t.Fatalf("session %v stopped=%v", h.s.State(), h.s.Stopped())
	}
	if got := histCount(t, mt.set, "kvxfer_transfer_duration_seconds", "side", "tx", "outcome", "DONE"); got != 1 {
		t.Fatalf("tx DONE durations %d", got)
	}
	for st := range core.NumOpStates {
		if g := value(mt.ops[st]); g != 0 {
			t.Fatalf("ops{%v} = %v after release", OpState(st), g)
		}
	}
	if g := value(mt.txSessions[TxDone]); g != 0 {
		t.Fatalf("sessions{DONE} %v after release", g)
	}
}

// TestTxMeter_FailedWriteAndInDoubt: a failed write is not a chunk-write
// observation; the session's failure is counted once with its reason; a
// timeout puts ops in doubt (the in-doubt gauge and Counters.OpsInDoubt,
// as the shell publishes them), and retiring them drains both.
func TestTxMeter_FailedWriteAndInDoubt(t *testing.T) {
	mt := testMeters(t)
	h := newTxStepper(t)
	tm := mt.txSession()
	tm.born(h.s, h.now)
	var stats Counters
	var share inDoubtShare
	step := func(msg any) {
		h.step(msg)
		tm.stepped(h.s, msg, h.now)
		share.publish(h.s.InDoubt(), &stats, mt)
	}
	inDoubt := func(want float64) {
		t.Helper()
		if g, n := value(mt.inDoubt), stats.OpsInDoubt.Load(); g != want || float64(n) != want {
			t.Fatalf("ops_in_doubt %v, Counters.OpsInDoubt %d, want %v", g, n, want)
		}
	}
	step(TxStart{PromptLen: 96, Deadline: h.now.Add(time.Second)})
	step(TxPeerRequest{Peer: 1, Epoch: 1, Route: testRoute(1), Expected: []int{1}})
	step(testChunk(0, 32, false))
	step(testChunk(32, 64, false))
	step(TxFenceFired{Index: 0})
	step(TxFenceFired{Index: 1})
	step(TxCompleted{Op: h.op(1, 0), Err: errors.New("remote write failed")})
	if got := histCount(t, mt.set, "kvxfer_chunk_write_latency_seconds"); got != 0 {
		t.Fatalf("a failed write was observed")
	}
	if g := value(mt.txFail[reasonPeerFailed]); g != 1 {
		t.Fatalf("failures{peer_failed} %v", g)
	}
	h.advance(time.Second)
	step(TxTimeout{Kind: TimerDeadline})
	inDoubt(1)
	if g := value(mt.txFail[reasonTimeout]); g != 0 {
		t.Fatalf("a decided session's timeout was counted as a second failure")
	}
	step(TxRetired{Ops: []OpRef{h.op(1, 1)}})
	inDoubt(0)
	if !h.s.Stopped() {
		t.Fatalf("session not released: %s", fmtTxState(h.s))
	}
	if got := histCount(t, mt.set, "kvxfer_transfer_duration_seconds", "side", "tx", "outcome", "FAILED"); got != 1 {
		t.Fatalf("tx FAILED durations %d", got)
	}
	for st := range core.NumOpStates {
		if g := value(mt.ops[st]); g != 0 {
			t.Fatalf("ops{%v} = %v after release", OpState(st), g)
		}
	}
}

// TestTxMeter_CloseWithoutRelease: an actor that stops without releasing
// (its supervisor gave up) leaves nothing behind in the gauges.
func TestTxMeter_CloseWithoutRelease(t *testing.T) {
	mt := testMeters(t)
	h := newTxStepper(t)
	tm := mt.txSession()
	tm.born(h.s, h.now)
	for _, msg := range []any{TxStart{PromptLen: 32}, TxPeerRequest{Peer: 1, Epoch: 1, Route: testRoute(1), Expected: []int{1}},
		testChunk(0, 32, true), TxFenceFired{Index: 0}} {
		h.step(msg)
		tm.stepped(h.s, msg, h.now)
	}
	if g := value(mt.ops[OpSubmitting]); g != 1 {
		t.Fatalf("SUBMITTING %v", g)
	}
	tm.close()
	tm.close()
	if g := value(mt.ops[OpSubmitting]); g != 0 {
		t.Fatalf("SUBMITTING %v after close", g)
	}
	if g := value(mt.txSessions[TxTransferring]); g != 0 {
		t.Fatalf("sessions{TRANSFERRING} %v after close", g)
	}
}

// TestRxMeter: bytes move with each Result, Receive → outcome is observed
// once when decided, failures carry their reason, late frames count as
// stale rejections, and the session leaves the gauge when it stops.
func TestRxMeter(t *testing.T) {
	mt := testMeters(t)
	h := newRxStepper(2)
	rm := mt.rxSession(h.now.Add(-time.Second)) // Receive was called 1 s before the session began
	rm.born(h.s, h.now)
	step := func(msg any) {
		h.step(msg)
		rm.stepped(h.s, h.now)
	}
	step(RxBegin{})
	if g := value(mt.rxSessions[RxReceiving]); g != 1 {
		t.Fatalf("sessions{RECEIVING} %v", g)
	}
	step(RxFrame{Writer: 0, Frame: &messages.Result{RequestID: "r1", Epoch: 7, From: ctxPeer(0), Status: messages.StatusSuccess, Bytes: 32}})
	if g := value(mt.bytesRx); g != 32 {
		t.Fatalf("rx bytes %v", g)
	}
	step(RxCancel{})
	if g := value(mt.rxFail[reasonCancelled]); g != 1 {
		t.Fatalf("failures{rx,cancelled} %v", g)
	}
	if got := histCount(t, mt.set, "kvxfer_transfer_duration_seconds", "side", "rx", "outcome", "CANCELLED"); got != 1 {
		t.Fatalf("rx CANCELLED durations %d", got)
	}
	if got := histSum(t, mt.set, "kvxfer_transfer_duration_seconds", "side", "rx", "outcome", "CANCELLED"); got != 1 {
		t.Fatalf("rx duration %v, want 1s (from Receive)", got)
	}
	if g := value(mt.rxSessions[RxCancelled]); g != 1 {
		t.Fatalf("sessions{CANCELLED} %v while writer 1 is pending", g)
	}
	step(RxFrame{Writer: 1, Frame: &messages.CancelAck{RequestID: "r1", Epoch: 7, From: ctxPeer(1)}})
	if !h.s.Stopped() {
		t.Fatal("session did not stop")
	}
	if g := value(mt.rxSessions[RxCancelled]); g != 0 {
		t.Fatalf("sessions{CANCELLED} %v after stop", g)
	}
	step(RxFrame{Writer: 1, Frame: &messages.CancelAck{RequestID: "r1", Epoch: 7, From: ctxPeer(1)}})
	if g := value(mt.rejected[rejectStale]); g != 1 {
		t.Fatalf("frames_rejected{stale} %v", g)
	}
}

func TestReasonOf(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: request r", ErrTimeout), "timeout"},
		{fmt.Errorf("%w: request r", ErrClosed), "closed"},
		{ErrCancelled, "cancelled"},
		{fmt.Errorf("%w: request r by gen/0", ErrPeerCancelled), "peer_cancelled"},
		{fmt.Errorf("%w: worker 2", ErrWorkerCrashed), "worker_crashed"},
		{fmt.Errorf("%w: request r: x", ErrSessionCrashed), "session_crashed"},
		{fmt.Errorf("%w: request r chunk 1", ErrFence), "fence"},
		{fmt.Errorf("%w: op", ErrPeerFailed), "peer_failed"},
		{fmt.Errorf("%w: gen/1", ErrPeerGone), "peer_gone"},
		// A Result that did not leave, whatever the control plane said.
		{fmt.Errorf("%w: the Result for gen/1: %w", ErrFrameUnsent, ErrPeerGone), "unsent"},
		{fmt.Errorf("%w: request r: %w", ErrBadRequest, errors.New("kvcache")), "bad_request"},
		{ErrBadChunk, "bad_chunk"},
		{fmt.Errorf("%w: request r writer ctx/0 sent an invalid Result: x", ErrMismatch), "mismatch"},
		{errors.New("something else"), "other"},
		{nil, "other"},
	}
	for _, c := range cases {
		if got := failReasons[reasonOf(c.err)].name; got != c.want {
			t.Errorf("reasonOf(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// histogram returns the sample count and sum of the histogram series of
// name whose labels include the pairs given.
func histogram(t fataler, set *metrics.Set, name string, labels ...string) (uint64, float64) {
	t.Helper()
	mfs, err := set.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0, 0
}

func histCount(t fataler, set *metrics.Set, name string, labels ...string) uint64 {
	t.Helper()
	n, _ := histogram(t, set, name, labels...)
	return n
}

func histSum(t fataler, set *metrics.Set, name string, labels ...string) float64 {
	t.Helper()
	_, s := histogram(t, set, name, labels...)
	return s
}

// fataler is what both *testing.T and *rapid.T offer.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// value reads a counter or gauge.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if c := d.GetCounter(); c != nil {
		return c.GetValue()
	}
	return d.GetGauge().GetValue()
}

// TestMeters_OneSetPerEngine: a Set's scrape-time series can be registered
// once; a second engine on the same Set is refused.
func TestMeters_OneSetPerEngine(t *testing.T) {
	set := metrics.New("e/0")
	if _, err := newMeters(set, &Counters{}, NewPools(nil), nil, new(atomic.Int64), new(orphanStats)); err != nil {
		t.Fatal(err)
	}
	if _, err := newMeters(set, &Counters{}, NewPools(nil), nil, new(atomic.Int64), new(orphanStats)); err == nil {
		t.Fatal("a second engine registered on the same Set")
	}
}

// TestMeters_EveryCounterScraped: every Counters field is scraped as a
// series of its own with the counter's value, except the frame counts that
// kvxfer_frames_rejected_total already counts by reason (the shells count
// those series as frames are refused, not from Counters). A counter added
// without a metric fails here, as the engine-failure counters once did.
func TestMeters_EveryCounterScraped(t *testing.T) {
	byReason := map[string]bool{"FramesRejected": true, "FramesStale": true, "FramesShed": true,
		"CancelsDeferred": true, "FramesSilenced": true}
	named := map[string]string{ // a few by name, so that a rename shows
		"SessionPanicsPastBudget": "kvxfer_session_panics_past_budget_total",
		"ParentPanics":            "kvxfer_parent_panics_total",
		"StreamViolations":        "kvxfer_stream_violations_total",
		"ClosesUnproven":          "kvxfer_closes_unproven_total",
		"DestBlockErrors":         "kvxfer_dest_block_errors_total",
		"OpsInDoubt":              "kvxfer_ops_in_doubt",
	}
	set := metrics.New("test/0")
	stats := &Counters{}
	m, err := newMeters(set, stats, NewPools(nil), nil, new(atomic.Int64), new(orphanStats))
	if err != nil {
		t.Fatal(err)
	}
	cv := reflect.ValueOf(stats).Elem()
	want := map[float64]string{} // a distinct value per field
	for i := range cv.NumField() {
		f := cv.Type().Field(i)
		c, ok := cv.Field(i).Addr().Interface().(*atomic.Int64)
		if !ok {
			t.Fatalf("Counters.%s is a %s, not an atomic.Int64: extend this test", f.Name, f.Type)
		}
		v := int64(1000 + 7*i)
		if f.Name == "OpsInDoubt" {
			// Kept with its gauge, not read at scrape: moved as a shell does.
			var share inDoubtShare
			share.publish(int(v), stats, m)
		} else {
			c.Store(v)
		}
		want[float64(v)] = f.Name
	}
	mfs, err := set.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	scraped := map[string]string{} // field → the metric that shows its value
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != 1 { // engine only
				continue
			}
			v := m.GetCounter().GetValue()
			if m.GetCounter() == nil {
				v = m.GetGauge().GetValue()
			}
			if field, ok := want[v]; ok {
				scraped[field] = mf.GetName()
			}
		}
	}
	for i := range cv.NumField() {
		name := cv.Type().Field(i).Name
		got, ok := scraped[name]
		switch {
		case byReason[name]:
			if ok {
				t.Errorf("Counters.%s is scraped as %s: drop it from this test's byReason", name, got)
			}
		case !ok:
			t.Errorf("Counters.%s has no metric: register one in newMeters and document it in package metrics", name)
		case named[name] != "" && got != named[name]:
			t.Errorf("Counters.%s is scraped as %s, want %s", name, got, named[name])
		}
	}
}
