package trace

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Digest is what a step left behind, compact enough to record after every
// step and precise enough that replay finds the first step that differs.
type Digest struct {
	State   string `json:"state"`
	Err     string `json:"err,omitempty"`
	Stopped bool   `json:"stopped,omitempty"`
	// Ops is a TxSession's op states: per stream, in the order the streams
	// opened, "peer:letters" with one OpLetter per op, streams separated
	// by spaces.
	Ops string `json:"ops,omitempty"`
	// Pinned is the number of a TxSession's chunks still pinned.
	Pinned int `json:"pinned,omitempty"`
	// Late is a TxSession's LateCompletions; Stale an RxSession's
	// StaleFrames; Violations a TxSession's illegal transitions.
	Late       int `json:"late,omitempty"`
	Stale      int `json:"stale,omitempty"`
	Violations int `json:"violations,omitempty"`
	// WritersPending: an RxSession still waits for a writer to be quiescent.
	WritersPending bool `json:"writers_pending,omitempty"`
	// Eff is one line per effect the step returned, in order.
	Eff []string `json:"eff,omitempty"`
}

// opLetters maps actors.OpState to its letter in Digest.Ops.
var opLetters = [...]byte{
	actors.OpAdmitted:        'A',
	actors.OpNotSubmitted:    'N',
	actors.OpSubmitting:      'G',
	actors.OpSubmitted:       'S',
	actors.OpBackendDone:     'D',
	actors.OpInDoubt:         '?',
	actors.OpRetired:         'R',
	actors.OpSourcesReleased: 'U',
}

// OpLetter is an op state's letter in Digest.Ops: A ADMITTED, N
// NOT_SUBMITTED, G SUBMITTING, S SUBMITTED, D BACKEND_DONE, ? IN_DOUBT,
// R RETIRED, U SOURCES_RELEASED (cut unproven, its source released).
func OpLetter(s actors.OpState) byte {
	if int(s) < len(opLetters) && opLetters[s] != 0 {
		return opLetters[s]
	}
	return '#'
}

// OpStateOf is the inverse of OpLetter.
func OpStateOf(letter byte) (actors.OpState, bool) {
	for s, l := range opLetters {
		if l == letter && l != 0 {
			return actors.OpState(s), true
		}
	}
	return 0, false
}

// DigestOf digests a session (*actors.TxSession or *actors.RxSession) and
// the effects its last step returned.
func DigestOf(session any, eff []actors.Effect) Digest { return digestOf(session, eff, Version) }

// digestOf digests as a Writer of trace format version v did (replay
// compares a trace's digests in its own version's form).
func digestOf(session any, eff []actors.Effect, v int) Digest {
	var d Digest
	switch s := session.(type) {
	case *actors.TxSession:
		d.State = s.State().String()
		d.Err = errString(s.Err())
		d.Stopped = s.Stopped()
		d.Ops = opsString(s)
		d.Pinned = s.PinnedCount()
		d.Late = s.LateCompletions
		d.Violations = len(s.Violations())
	case *actors.RxSession:
		d.State = s.State().String()
		d.Err = errString(s.Err())
		d.Stopped = s.Stopped()
		d.Stale = s.StaleFrames
		d.WritersPending = !s.WritersQuiescent()
	default:
		d.State = fmt.Sprintf("%T", session)
	}
	if len(eff) > 0 {
		d.Eff = make([]string, len(eff))
		for i, e := range eff {
			d.Eff[i] = effectString(e, v)
		}
	}
	return d
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func opsString(s *actors.TxSession) string {
	var b []byte
	peer := -1
	s.EachOp(func(r actors.OpRef, st actors.OpState) {
		if r.Peer != peer || b == nil {
			if b != nil {
				b = append(b, ' ')
			}
			b = strconv.AppendInt(b, int64(r.Peer), 10)
			b = append(b, ':')
			peer = r.Peer
		}
		b = append(b, OpLetter(st))
	})
	return string(b)
}

// ParseOps parses Digest.Ops into each stream's op letters, by peer.
func ParseOps(s string) (map[int]string, error) {
	out := map[int]string{}
	for _, f := range strings.Fields(s) {
		p, letters, ok := strings.Cut(f, ":")
		peer, err := strconv.Atoi(p)
		if !ok || err != nil {
			return nil, fmt.Errorf("%w: ops %q", ErrFormat, s)
		}
		out[peer] = letters
	}
	return out, nil
}

var timerNames = map[actors.TimerKind]string{actors.TimerDeadline: "deadline", actors.TimerDrain: "drain", actors.TimerOrphan: "orphan",
	actors.TimerResend: "resend"}

// TimerName names a timer kind.
func TimerName(k actors.TimerKind) string {
	if n, ok := timerNames[k]; ok {
		return n
	}
	return fmt.Sprintf("timer%d", k)
}

// quarantineVersion is the first trace format version whose digest
// tells a ReleaseDest out of quarantine from a plain one and names a
// QuarantineDest's blocks and writers.
const quarantineVersion = 4

// EffectString is an effect's line in Digest.Eff.
func EffectString(e actors.Effect) string { return effectString(e, Version) }

// effectString is an effect's line as a Writer of trace format version v
// wrote it.
func effectString(e actors.Effect, v int) string {
	switch e := e.(type) {
	case actors.Pin:
		return fmt.Sprintf("Pin chunk%d g%d %s", e.Chunk, e.Group, idsString(e.IDs))
	case actors.Unpin:
		return fmt.Sprintf("Unpin g%d %s", e.Group, idsString(e.IDs))
	case actors.WatchFence:
		return fmt.Sprintf("WatchFence chunk%d", e.Chunk)
	case actors.Submit:
		return fmt.Sprintf("Submit w%d peer%d op%d segs=%d bytes=%d", e.Worker, e.Peer, e.Op.Seq, len(e.Segments), e.Bytes)
	case actors.Flush:
		return fmt.Sprintf("Flush w%d peer%d", e.Worker, e.Peer)
	case actors.CloseEndpoint:
		return fmt.Sprintf("CloseEndpoint w%d peer%d", e.Worker, e.Peer)
	case actors.EndStream:
		return fmt.Sprintf("EndStream w%d peer%d", e.Worker, e.Peer)
	case actors.SendFrame:
		return fmt.Sprintf("SendFrame w%d %s %s", e.Worker, e.To, FrameString(e.Frame))
	case actors.SendRequestData:
		return fmt.Sprintf("SendRequestData w%d writer%d %s %s", e.Worker, e.Writer, e.To, FrameString(e.Frame))
	case actors.Decide:
		return "Decide " + e.Status
	case actors.StartTimer:
		return fmt.Sprintf("StartTimer %s at=%d", TimerName(e.Kind), e.At.UnixNano())
	case actors.Finish:
		o := e.Outcome
		return fmt.Sprintf("Finish %s ok=%t bytes=%d blocks=%d payload=%d", o.Status, o.OK, o.Bytes, countIDs(o.Blocks), len(o.Payload))
	case actors.ReleaseDest:
		if e.Quarantined && v >= quarantineVersion {
			return fmt.Sprintf("ReleaseDest blocks=%d quarantined", countIDs(e.Blocks))
		}
		return fmt.Sprintf("ReleaseDest blocks=%d", countIDs(e.Blocks))
	case actors.QuarantineDest:
		if v >= quarantineVersion {
			return fmt.Sprintf("QuarantineDest blocks=%d writers=%v", countIDs(e.Blocks), e.Writers)
		}
	case actors.Stop:
		return "Stop"
	case actors.Log:
		return "Log " + e.Level
	case actors.Readdress:
		return fmt.Sprintf("Readdress writer%d inc=%d", e.Writer, e.Incarnation)
	}
	return fmt.Sprintf("%T", e)
}

// FrameString summarises a control frame.
func FrameString(f messages.Frame) string {
	if nilFrame(f) {
		return "<nil>"
	}
	switch f := f.(type) {
	case nil:
		return "<nil>"
	case *messages.Result:
		return fmt.Sprintf("Result %s epoch=%d status=%s bytes=%d payload=%d", f.RequestID, f.Epoch, f.Status, f.Bytes, len(f.Payload))
	case *messages.CancelAck:
		return fmt.Sprintf("CancelAck %s epoch=%d", f.RequestID, f.Epoch)
	case *messages.Cancel:
		return fmt.Sprintf("Cancel %s epoch=%d reason=%s", f.RequestID, f.Epoch, f.Reason)
	case *messages.RequestData:
		return fmt.Sprintf("RequestData %s epoch=%d", f.RequestID, f.Epoch)
	case *messages.Misaddressed:
		return fmt.Sprintf("Misaddressed %s epoch=%d addressed=%d dropped-by=%d", f.RequestID, f.Epoch, f.Addressed, f.FromIncarnation)
	case Unknown:
		return f.Type
	}
	return fmt.Sprintf("%T", f)
}

// idsString is a block id list as "n=3 [4 5 6]", eliding the middle of a
// long one.
func idsString(ids []kvcache.BlockID) string {
	var b strings.Builder
	fmt.Fprintf(&b, "n=%d [", len(ids))
	const show = 4
	for i, id := range ids {
		if len(ids) > 2*show && i == show {
			b.WriteString("… ")
		}
		if len(ids) > 2*show && i >= show && i < len(ids)-show {
			continue
		}
		b.WriteString(strconv.Itoa(int(id)))
		if i < len(ids)-1 {
			b.WriteByte(' ')
		}
	}
	b.WriteByte(']')
	return b.String()
}

func countIDs[T any](groups [][]T) int {
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	return n
}

// Diff returns the first field in which got differs from want, with both
// values as text; ok is true when they are equal.
func (want Digest) Diff(got Digest) (field, expected, actual string, ok bool) {
	type pair struct {
		name   string
		w, g   string
		differ bool
	}
	fields := []pair{
		{"state", want.State, got.State, want.State != got.State},
		{"err", want.Err, got.Err, want.Err != got.Err},
		{"stopped", strconv.FormatBool(want.Stopped), strconv.FormatBool(got.Stopped), want.Stopped != got.Stopped},
		{"ops", want.Ops, got.Ops, want.Ops != got.Ops},
		{"pinned", strconv.Itoa(want.Pinned), strconv.Itoa(got.Pinned), want.Pinned != got.Pinned},
		{"late", strconv.Itoa(want.Late), strconv.Itoa(got.Late), want.Late != got.Late},
		{"stale", strconv.Itoa(want.Stale), strconv.Itoa(got.Stale), want.Stale != got.Stale},
		{"violations", strconv.Itoa(want.Violations), strconv.Itoa(got.Violations), want.Violations != got.Violations},
		{"writers_pending", strconv.FormatBool(want.WritersPending), strconv.FormatBool(got.WritersPending), want.WritersPending != got.WritersPending},
	}
	for _, f := range fields {
		if f.differ {
			return f.name, f.w, f.g, false
		}
	}
	for i := 0; i < max(len(want.Eff), len(got.Eff)); i++ {
		w, g := "(none)", "(none)"
		if i < len(want.Eff) {
			w = want.Eff[i]
		}
		if i < len(got.Eff) {
			g = got.Eff[i]
		}
		if w != g {
			return fmt.Sprintf("eff[%d]", i), w, g, false
		}
	}
	return "", "", "", true
}

// nilFrame reports whether f is nil, or a nil pointer of a frame type (an
// effect built from a damaged trace record can carry one).
func nilFrame(f messages.Frame) bool {
	if f == nil {
		return true
	}
	v := reflect.ValueOf(f)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
