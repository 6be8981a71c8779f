package core

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/kvxfer/kvxfer/messages"
)

// Scenario tests: readable interleavings in testdata/*.txt, driven by
// datadriven. Regenerate the expected output with
//
//	go test ./actors/ -run Scenario -rewrite
//
// and read the diff: the output is the contract.
//
// Each command prints the effects of one step, one per line (Log effects
// are left out; a step that makes the outcome terminal prints it as
// "outcome: …"), then the session's state.
//
// tx_scenarios.txt commands:
//
//	new [timeout=30s] [groups=2]        a fresh session (prints Init's effects)
//	start prompt=64 [deadline=60s]      TxStart (payload "tok")
//	chunk start=0 end=32 [last]         TxChunk (16-token blocks)
//	request peer=1 expected=(1,2) [epoch=1] [skip=(0,32)] [err=text] [prompt=N]
//	                                    (prompt: the peer's planned prompt; default Send's)
//	submitted peer=1 op=0               TxSubmitted (the worker posted the op)
//	pin-failed chunk=0 group=1 [err=text]  TxPinFailed
//	fence chunk=0 [err=text]            TxFenceFired
//	complete peer=1 op=0 [err=text] [refused]
//	flush peer=1 [err=text]             TxFlushed
//	sent peer=1 [err=text]              TxSent (the stream's terminal frame left, or not)
//	cancel | peer-cancel peer=1 [epoch=1] | panic
//	peer-gone peer=1                    TxPeerGone (the control plane declared gen/1 dead)
//	timeout [kind=drain]                TxTimeout (deadline by default)
//	indoubt peer=1 op=(0,1)             TxInDoubt (worker crashed)
//	retire peer=1 op=(0,1)              TxRetired (endpoint closed)
//	advance d=5s                        move the fake clock
//
// rx_scenarios.txt commands:
//
//	new writers=2 [deadline=10s]        a fresh session, epoch 7
//	begin                               RxBegin
//	result writer=0 status=success [bytes=32] [epoch=7] [payload=x] [err=text]
//	cancel-ack writer=0 [epoch=7]
//	gone writer=0 [err=text]            RxPeerGone (proof: endpoint closed, process dead)
//	suspect writer=0 [err=text]         RxSuspect (missed heartbeats: no proof)
//	abandon                             RxAbandon (the engine closes)
//	sent writer=0 [err=text]            RxSent (the RequestData left, or not)
//	cancel | timeout [kind=resend] | panic
//
// An rx session's writers must each write want bytes (new want=64, the
// default) for READY.

func TestScenario_Tx(t *testing.T) {
	var h *txHarness
	datadriven.RunTest(t, "testdata/tx_scenarios.txt", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "new" && h == nil {
			d.Fatalf(t, "no session: start with new")
		}
		if h != nil {
			h.t = t
		}
		before := TxInit
		if h != nil {
			before = h.s.State()
		}
		var effs []Effect
		switch d.Cmd {
		case "new":
			var init []Effect
			h, init = newTxHarness(t, txOpts{timeout: durArg(t, d, "timeout", 0), groups: intArg(t, d, "groups", 1)})
			effs = init
		case "start":
			effs = h.start(intArg(t, d, "prompt", 0), durArg(t, d, "deadline", 0))
		case "chunk":
			effs = h.chunk(intArg(t, d, "start", 0), intArg(t, d, "end", 0), d.HasArg("last"))
		case "request":
			p := intArg(t, d, "peer", 1)
			for _, c := range intsArg(t, d, "skip") {
				h.planner(p).skip[c] = true
			}
			m := TxPeerRequest{Peer: p, Epoch: uint64(intArg(t, d, "epoch", 1)), Expected: intsArg(t, d, "expected"),
				PromptLen: intArg(t, d, "prompt", 0)}
			if err := errArg(t, d); err != nil {
				m.Err = err
			} else {
				m.Route = h.route(p)
			}
			effs = h.step(m)
		case "fence":
			effs = h.step(TxFenceFired{Index: intArg(t, d, "chunk", 0), Err: errArg(t, d)})
		case "submitted":
			effs = h.step(TxSubmitted{Op: h.op(intArg(t, d, "peer", 1), intArg(t, d, "op", 0))})
		case "pin-failed":
			effs = h.step(TxPinFailed{Chunk: intArg(t, d, "chunk", 0), Group: intArg(t, d, "group", 0), Err: errArg(t, d)})
		case "complete":
			effs = h.step(TxCompleted{Op: h.op(intArg(t, d, "peer", 1), intArg(t, d, "op", 0)),
				Err: errArg(t, d), Refused: d.HasArg("refused")})
		case "flush":
			effs = h.flushed(intArg(t, d, "peer", 1), errArg(t, d))
		case "sent":
			effs = h.sent(intArg(t, d, "peer", 1), errArg(t, d))
		case "cancel":
			effs = h.step(TxCancel{})
		case "peer-cancel":
			effs = h.step(TxPeerCancel{Peer: intArg(t, d, "peer", 1), Epoch: uint64(intArg(t, d, "epoch", 1))})
		case "peer-gone":
			effs = h.step(TxPeerGone{Peer: genPeer(intArg(t, d, "peer", 1))})
		case "panic":
			effs = h.step(TxPanic{Err: errors.New("injected panic")})
		case "timeout":
			kind := TimerDeadline
			if d.HasArg("kind") {
				var k string
				d.ScanArgs(t, "kind", &k)
				switch k {
				case "drain":
					kind = TimerDrain
				case "orphan":
					kind = TimerOrphan
				}
			}
			effs = h.step(TxTimeout{Kind: kind})
		case "indoubt", "retire":
			p := intArg(t, d, "peer", 1)
			var ops []OpRef
			for _, i := range intsArg(t, d, "op") {
				ops = append(ops, h.op(p, i))
			}
			if d.Cmd == "indoubt" {
				effs = h.step(TxInDoubt{Ops: ops, Reason: fmt.Errorf("%w: worker 0", ErrWorkerCrashed)})
			} else {
				effs = h.step(TxRetired{Ops: ops})
			}
		case "advance":
			h.advance(durArg(t, d, "d", 0))
		default:
			d.Fatalf(t, "unknown command %q", d.Cmd)
		}
		var b strings.Builder
		for _, e := range effs {
			switch e.(type) {
			case Log, Decide: // the outcome line says it
				continue
			}
			b.WriteString(fmtEffect(e))
			b.WriteByte('\n')
		}
		if st := h.s.State(); st.Terminal() && st != before {
			fmt.Fprintf(&b, "outcome: %v: %v\n", st, h.s.Err())
		}
		b.WriteString(fmtTxState(h.s))
		b.WriteByte('\n')
		return b.String()
	})
}

func TestScenario_Rx(t *testing.T) {
	var h *rxHarness
	datadriven.RunTest(t, "testdata/rx_scenarios.txt", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "new" && h == nil {
			d.Fatalf(t, "no session: start with new")
		}
		if h != nil {
			h.t = t
		}
		var effs []Effect
		switch d.Cmd {
		case "new":
			h = newRxHarness(t, intArg(t, d, "writers", 1), durArg(t, d, "deadline", 0))
			for i := range h.s.cfg.Writers {
				h.s.cfg.Writers[i].Bytes = uint64(intArg(t, d, "want", 64))
			}
		case "begin":
			effs = h.step(RxBegin{})
		case "result":
			var status string
			d.ScanArgs(t, "status", &status)
			st, ok := map[string]messages.Status{"success": messages.StatusSuccess, "failed": messages.StatusFailed,
				"in-doubt": messages.StatusInDoubt, "cancelled": messages.StatusCancelled}[status]
			if !ok {
				d.Fatalf(t, "unknown status %q", status)
			}
			w := intArg(t, d, "writer", 0)
			r := &messages.Result{RequestID: "r1", Epoch: uint64(intArg(t, d, "epoch", 7)), From: ctxPeer(w),
				Status: st, Bytes: uint64(intArg(t, d, "bytes", 0))}
			if d.HasArg("payload") {
				var p string
				d.ScanArgs(t, "payload", &p)
				r.Payload = []byte(p)
			}
			if err := errArg(t, d); err != nil {
				r.Error = err.Error()
			}
			effs = h.step(RxFrame{Writer: w, Frame: r})
		case "cancel-ack":
			w := intArg(t, d, "writer", 0)
			effs = h.step(RxFrame{Writer: w, Frame: &messages.CancelAck{RequestID: "r1", Epoch: uint64(intArg(t, d, "epoch", 7)), From: ctxPeer(w)}})
		case "gone":
			effs = h.step(RxPeerGone{Writer: intArg(t, d, "writer", 0), Err: errArg(t, d)})
		case "suspect":
			effs = h.step(RxSuspect{Writer: intArg(t, d, "writer", 0), Err: errArg(t, d)})
		case "abandon":
			effs = h.step(RxAbandon{})
		case "cancel":
			effs = h.step(RxCancel{})
		case "timeout":
			kind := TimerDeadline
			if d.HasArg("kind") {
				var k string
				d.ScanArgs(t, "kind", &k)
				kind = map[string]TimerKind{"deadline": TimerDeadline, "drain": TimerDrain, "resend": TimerResend}[k]
			}
			effs = h.step(RxTimeout{Kind: kind})
		case "sent":
			effs = h.step(RxSent{Writer: intArg(t, d, "writer", 0), Err: errArg(t, d)})
		case "panic":
			effs = h.step(RxPanic{Err: errors.New("injected panic")})
		default:
			d.Fatalf(t, "unknown command %q", d.Cmd)
		}
		var b strings.Builder
		for _, e := range effs {
			switch e.(type) {
			case Log, Decide: // the outcome line says it
				continue
			}
			b.WriteString(fmtEffect(e))
			b.WriteByte('\n')
		}
		b.WriteString(fmtRxState(h.s))
		b.WriteByte('\n')
		return b.String()
	})
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	t.Helper()
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func intsArg(t *testing.T, d *datadriven.TestData, key string) []int {
	t.Helper()
	arg, ok := d.Arg(key)
	if !ok {
		return nil
	}
	var out []int
	for _, v := range arg.Vals {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				d.Fatalf(t, "%s: %v", key, err)
			}
			out = append(out, n)
		}
	}
	return out
}

func durArg(t *testing.T, d *datadriven.TestData, key string, def time.Duration) time.Duration {
	t.Helper()
	if !d.HasArg(key) {
		return def
	}
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

func errArg(t *testing.T, d *datadriven.TestData) error {
	t.Helper()
	if !d.HasArg("err") {
		return nil
	}
	var s string
	d.ScanArgs(t, "err", &s)
	return errors.New(s)
}

// fmtEffect renders one effect compactly; times are relative to testEpoch0.
func fmtEffect(e Effect) string {
	switch e := e.(type) {
	case Pin:
		return fmt.Sprintf("pin g=%d %v", e.Group, e.IDs)
	case Unpin:
		return fmt.Sprintf("unpin g=%d %v", e.Group, e.IDs)
	case WatchFence:
		return fmt.Sprintf("watch-fence chunk=%d", e.Chunk)
	case Submit:
		return fmt.Sprintf("submit p%d/op%d bytes=%d segs=%d", e.Op.Peer, e.Op.Seq, e.Bytes, len(e.Segments))
	case Flush:
		return fmt.Sprintf("flush p%d", e.Peer)
	case CloseEndpoint:
		return fmt.Sprintf("close-endpoint p%d", e.Peer)
	case SendFrame:
		return fmt.Sprintf("send %v %s", e.To, fmtFrame(e.Frame))
	case SendRequestData:
		return fmt.Sprintf("send %v %s (reported)", e.To, fmtFrame(e.Frame))
	case StartTimer:
		kind := map[TimerKind]string{TimerDeadline: "deadline", TimerDrain: "drain", TimerOrphan: "orphan", TimerResend: "resend"}[e.Kind]
		return fmt.Sprintf("timer %s at=+%v", kind, e.At.Sub(testEpoch0))
	case Finish:
		o := e.Outcome
		s := fmt.Sprintf("finish %s", o.Status)
		if o.OK {
			s += " ok"
		}
		s += fmt.Sprintf(" bytes=%d", o.Bytes)
		if o.Blocks != nil {
			s += fmt.Sprintf(" blocks=%v", o.Blocks)
		}
		if o.Payload != nil {
			s += fmt.Sprintf(" payload=%s", o.Payload)
		}
		if o.Err != nil {
			s += fmt.Sprintf(" err=%q", o.Err.Error())
		}
		return s
	case ReleaseDest:
		if e.Quarantined {
			return fmt.Sprintf("release-dest %v from quarantine", e.Blocks)
		}
		return fmt.Sprintf("release-dest %v", e.Blocks)
	case QuarantineDest:
		return fmt.Sprintf("quarantine-dest %v writers=%v", e.Blocks, e.Writers)
	case Stop:
		return "stop"
	case Log:
		return fmt.Sprintf("log %s %q: %v", e.Level, e.Msg, e.Err)
	}
	return fmt.Sprintf("%T %+v", e, e)
}

func fmtEffects(effs []Effect) string {
	if len(effs) == 0 {
		return "[]"
	}
	parts := make([]string, len(effs))
	for i, e := range effs {
		parts[i] = fmtEffect(e)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func fmtFrame(f messages.Frame) string {
	switch f := f.(type) {
	case *messages.Result:
		s := fmt.Sprintf("Result %v epoch=%d bytes=%d", f.Status, f.Epoch, f.Bytes)
		if len(f.Payload) > 0 {
			s += fmt.Sprintf(" payload=%s", f.Payload)
		}
		if f.Error != "" {
			s += fmt.Sprintf(" err=%q", f.Error)
		}
		return s
	case *messages.CancelAck:
		return fmt.Sprintf("CancelAck epoch=%d", f.Epoch)
	case *messages.Cancel:
		return fmt.Sprintf("Cancel epoch=%d reason=%s", f.Epoch, f.Reason)
	case *messages.RequestData:
		return fmt.Sprintf("RequestData epoch=%d", f.Epoch)
	}
	return fmt.Sprintf("%T", f)
}

func fmtTxState(s *TxSession) string {
	ops := s.OpStates()
	refs := make([]OpRef, 0, len(ops))
	for r := range ops {
		refs = append(refs, r)
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Peer != refs[j].Peer {
			return refs[i].Peer < refs[j].Peer
		}
		return refs[i].Seq < refs[j].Seq
	})
	parts := make([]string, len(refs))
	for i, r := range refs {
		parts[i] = fmt.Sprintf("p%d/%d:%v", r.Peer, r.Seq, ops[r])
	}
	out := fmt.Sprintf("state=%v ops=[%s] pinned=%v", s.State(), strings.Join(parts, " "), fmtInts(s.PinnedChunks()))
	if s.LateCompletions > 0 {
		out += fmt.Sprintf(" late=%d", s.LateCompletions)
	}
	if s.Stopped() {
		out += " stopped"
	}
	return out
}

func fmtRxState(s *RxSession) string {
	names := map[writerState]string{writerPending: "PENDING", writerSucceeded: "SUCCEEDED", writerStopped: "STOPPED"}
	ws := make([]string, len(s.writers))
	for i, w := range s.writers {
		ws[i] = names[w]
	}
	out := fmt.Sprintf("state=%v writers=[%s]", s.State(), strings.Join(ws, " "))
	if s.StaleFrames > 0 {
		out += fmt.Sprintf(" stale=%d", s.StaleFrames)
	}
	if s.Stopped() {
		out += " stopped"
	}
	return out
}

func fmtInts(v []int) string {
	if len(v) == 0 {
		return "[]"
	}
	return fmt.Sprint(v)
}
