package trace

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// ExportStats counts what ExportPerfetto wrote.
type ExportStats struct {
	// Events is every trace event written, metadata included.
	Events int `json:"events"`
	// Engines (processes) and Sessions (thread tracks, each with one
	// session slice).
	Engines  int `json:"engines"`
	Sessions int `json:"sessions"`
	// States is the number of state slices nested in session slices;
	// Instants one per stepped message; Ops the async op slices (each a
	// begin and an end event).
	States   int `json:"states"`
	Instants int `json:"instants"`
	Ops      int `json:"ops"`
	// Tables are the parents', listener's and workers' thread tracks;
	// Calls one instant per table call on them (version 2 traces).
	Tables int `json:"tables,omitempty"`
	Calls  int `json:"calls,omitempty"`
	// TornLine is the line of the trace's partial last record (its
	// process stopped while writing it), 0 when it ends in a whole one:
	// the records before it were exported.
	TornLine int `json:"torn_line,omitempty"`
	// TornZeros is the zero bytes that line ends in (Torn.Zeros): its
	// machine stopped before the trace's last writes reached the disk.
	TornZeros int `json:"torn_zeros,omitempty"`
	// Unclosed: the trace lacks its Writer's "end" record (its process
	// stopped without closing it; Reader.Unclosed).
	Unclosed bool `json:"unclosed,omitempty"`
	// Part is the file's place in a rotated trace (its header's part: 2
	// for the first file a rotation began), 0 when it is not one.
	Part int `json:"part,omitempty"`
	// Skipped counts the step and table-call records left out because
	// their session or table was born before the file began (in an
	// earlier part of a rotated trace), and SkippedActors those actors.
	Skipped       int `json:"skipped,omitempty"`
	SkippedActors int `json:"skipped_actors,omitempty"`
}

// event is one Chrome trace event.
type event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	ID   string         `json:"id,omitempty"`
	S    string         `json:"s,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// pfSession is a session's track while the export runs.
type pfSession struct {
	pid, tid   int
	actor      string
	label      string
	request    string
	birth      int64
	last       int64
	state      string
	stateSince int64
	ended      bool
	steps      int
	err        string
	ops        map[int]string    // peer → op letters after the last step
	open       map[string]openOp // async id → op
}

// openOp is an op slice begun and not yet ended.
type openOp struct {
	peer  int
	begin int64
}

type exporter struct {
	enc      *json.Encoder
	bw       *bufio.Writer
	t0       int64
	first    bool
	stats    ExportStats
	pids     map[string]int
	sessions map[string]*pfSession
	order    []*pfSession
	nextTid  int
	// tables: a table's actor → its track (pid, tid).
	tables map[string][2]int
	// skipped: the actors whose records were left out (born before the
	// file began).
	skipped map[string]bool
}

// ErrSameFile: an export's output names its input (the same path, or a
// link to it); writing it would destroy the trace before it is read.
var ErrSameFile = errors.New("trace: the output is the input")

// ExportPerfettoFile exports the trace at in to the file at out. It refuses
// an out that names in (ErrSameFile), writes a temporary file in out's
// directory and renames it to out only once the export succeeded: a
// failed export leaves out as it was and no partial file behind.
func ExportPerfettoFile(in, out string) (ExportStats, error) {
	in, out = filepath.Clean(in), filepath.Clean(out)
	f, err := os.Open(in)
	if err != nil {
		return ExportStats{}, err
	}
	defer f.Close()
	if ist, err := f.Stat(); err == nil {
		if ost, err := os.Stat(out); err == nil && os.SameFile(ist, ost) {
			return ExportStats{}, fmt.Errorf("%w: %s and %s are one file", ErrSameFile, in, out)
		}
	}
	o, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*.tmp")
	if err != nil {
		return ExportStats{}, err
	}
	st, err := ExportPerfetto(f, o)
	if cerr := o.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes the file 0600; an export is no secret.
		err = os.Chmod(o.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(o.Name(), out)
	}
	if err != nil {
		_ = os.Remove(o.Name())
		return st, err
	}
	return st, nil
}

// ExportPerfetto reads a trace from r and writes it to w as Chrome
// trace-event JSON (the package doc describes the tracks). Timestamps are
// microseconds since the trace's header, whose wall-clock time is
// otherData.trace_start (and trace_start_ns). It streams: memory grows with
// the number of sessions, not with the trace.
func ExportPerfetto(r io.Reader, w io.Writer) (ExportStats, error) {
	x := &exporter{bw: bufio.NewWriter(w), first: true, pids: map[string]int{}, sessions: map[string]*pfSession{}, tables: map[string][2]int{}, skipped: map[string]bool{}}
	x.enc = json.NewEncoder(x.bw)
	rd := NewReader(r)
	for started := false; ; {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			x.stats.TornLine, x.stats.TornZeros, x.stats.Unclosed = rd.Torn().Line, rd.Torn().Zeros, rd.Unclosed()
			break
		}
		if err != nil {
			return x.stats, err
		}
		if !started {
			// The header (Next refuses a trace that begins otherwise):
			// its wall-clock time is what every ts counts from.
			started = true
			if err := x.preamble(rec.T); err != nil {
				return x.stats, err
			}
		}
		if err := x.safeRecord(rec); err != nil {
			return x.stats, err
		}
	}
	for _, s := range x.order {
		if !s.ended {
			if err := x.end(s, s.last, "trace ended"); err != nil {
				return x.stats, err
			}
		}
	}
	if _, err := x.bw.WriteString("]}\n"); err != nil {
		return x.stats, err
	}
	return x.stats, x.bw.Flush()
}

// preamble opens the document. otherData.trace_start is the trace
// header's wall-clock time (RFC 3339, and trace_start_ns in Unix
// nanoseconds), from which every ts counts: it lines up the exports of
// the two processes of a run, and the timeline with their logs.
func (x *exporter) preamble(t0 int64) error {
	other, err := json.Marshal(map[string]any{"source": "kvxfer trace", "version": 1,
		"trace_start": time.Unix(0, t0).UTC().Format(time.RFC3339Nano), "trace_start_ns": t0})
	if err != nil {
		return err
	}
	_, err = x.bw.WriteString(`{"displayTimeUnit":"ms","otherData":` + string(other) + `,"traceEvents":[` + "\n")
	return err
}

func (x *exporter) emit(e *event) error {
	if !x.first {
		if _, err := x.bw.WriteString(","); err != nil {
			return err
		}
	}
	x.first = false
	x.stats.Events++
	return x.enc.Encode(e) // ends the line
}

func (x *exporter) ts(t int64) float64 { return float64(t-x.t0) / 1e3 }

func (x *exporter) pid(engine string) (int, error) {
	if p, ok := x.pids[engine]; ok {
		return p, nil
	}
	p := len(x.pids) + 1
	x.pids[engine] = p
	x.stats.Engines++
	return p, x.emit(&event{Name: "process_name", Ph: "M", Pid: p, Args: map[string]any{"name": "engine " + engine}})
}

func (x *exporter) record(rec *Record) error {
	switch rec.Kind {
	case KindTrace:
		x.t0 = rec.T
		x.stats.Part = rec.Part
	case KindEngine:
		_, err := x.pid(rec.Engine)
		return err
	case KindBirth:
		return x.birth(rec)
	case KindStep:
		if s := x.sessions[rec.Actor]; s != nil {
			return x.step(s, rec)
		}
		x.skip(rec.Actor)
	case KindTable:
		return x.table(rec)
	case KindCall:
		if tr, ok := x.tables[rec.Actor]; ok {
			return x.call(tr, rec)
		}
		x.skip(rec.Actor)
	case KindMsg, KindTruncated, KindEnd:
		// Nothing to draw (Replay reads them).
	default:
		// As Replay: a record of an unknown kind is damage, and taking
		// it as nothing would leave out what it was (a birth: its
		// session's records then counted as begun before the file).
		return fmt.Errorf("%w: line %d: unknown record kind %q", ErrFormat, rec.Line, rec.Kind)
	}
	return nil
}

// skip counts a record left out: its actor's birth (or table) is not in
// this file, as in a later part of a rotated trace.
func (x *exporter) skip(actor string) {
	x.stats.Skipped++
	if !x.skipped[actor] {
		x.skipped[actor] = true
		x.stats.SkippedActors++
	}
}

// table opens a parent's, the listener's or a worker's track, above the
// sessions' tracks of its engine.
func (x *exporter) table(rec *Record) error {
	pid, err := x.pid(rec.Engine)
	if err != nil {
		return err
	}
	x.nextTid++
	tid := x.nextTid
	x.tables[rec.Actor] = [2]int{pid, tid}
	x.stats.Tables++
	name := strings.TrimPrefix(rec.Actor, rec.Engine+"/") + " (" + rec.Type + ")"
	if err := x.emit(&event{Name: "thread_name", Ph: "M", Pid: pid, Tid: tid, Args: map[string]any{"name": name}}); err != nil {
		return err
	}
	return x.emit(&event{Name: "thread_sort_index", Ph: "M", Pid: pid, Tid: tid, Args: map[string]any{"sort_index": tid - 1<<20}})
}

// call is an instant on its table's track: the method and what tells the
// call apart, with its inputs and outputs as arguments.
func (x *exporter) call(tr [2]int, rec *Record) error {
	args := map[string]any{"seq": rec.Seq}
	if len(rec.Msg) > 0 && string(rec.Msg) != "{}" {
		args["in"] = rec.Msg
	}
	if len(rec.Out) > 0 && string(rec.Out) != "{}" {
		args["out"] = rec.Out
	}
	x.stats.Calls++
	return x.emit(&event{Name: callLabel(rec.Type, rec.Msg), Cat: "table", Ph: "i", S: "t", Ts: x.ts(rec.T), Pid: tr[0], Tid: tr[1], Args: args})
}

// callLabel names a table call's instant: its method and what it is about.
func callLabel(method string, raw json.RawMessage) string {
	var w wireTableIn
	if unmarshal(raw, &w) != nil {
		return method
	}
	in := w.tableIn()
	switch {
	case in.Op != nil:
		return method + " " + in.Op.String()
	case in.Msg != "":
		return method + " " + in.Msg
	case in.RequestData != nil:
		return method + " " + in.RequestData.RequestID + " from " + in.RequestData.From.String()
	case in.Cancel != nil:
		return method + " " + in.Cancel.RequestID + " from " + in.Cancel.From.String()
	case in.Frame != nil:
		return method + " " + frameKind(in.Frame) + " " + in.Frame.Request() + " from " + in.Frame.Sender().String()
	case in.Open != nil:
		return method + " " + in.Open.Request
	case in.Peer != nil:
		return method + " " + in.Peer.String()
	case in.Request != "":
		return method + " " + in.Request
	}
	return method
}

func (x *exporter) birth(rec *Record) error {
	pid, err := x.pid(rec.Engine)
	if err != nil {
		return err
	}
	x.nextTid++
	s := &pfSession{pid: pid, tid: x.nextTid, actor: rec.Actor, label: rec.Side + " " + rec.Request, request: rec.Request,
		birth: rec.T, last: rec.T, stateSince: rec.T, ops: map[int]string{}, open: map[string]openOp{}}
	if rec.Post != nil {
		s.state = rec.Post.State
	}
	x.sessions[rec.Actor] = s
	x.order = append(x.order, s)
	x.stats.Sessions++
	if err := x.emit(&event{Name: "thread_name", Ph: "M", Pid: pid, Tid: s.tid, Args: map[string]any{"name": s.label}}); err != nil {
		return err
	}
	return x.emit(&event{Name: "thread_sort_index", Ph: "M", Pid: pid, Tid: s.tid, Args: map[string]any{"sort_index": s.tid}})
}

func (x *exporter) step(s *pfSession, rec *Record) error {
	s.last = max(s.last, rec.T)
	s.steps++
	args := map[string]any{"seq": rec.Seq}
	if len(rec.Msg) > 0 {
		args["msg"] = rec.Msg
	}
	if rec.Panic {
		args["panic"] = true
		if rec.PanicValue != "" {
			args["panic_value"] = rec.PanicValue
		}
	}
	if d := rec.Post; d != nil {
		args["state"] = d.State
		if len(d.Eff) > 0 {
			args["effects"] = d.Eff
		}
	}
	x.stats.Instants++
	if err := x.emit(&event{Name: msgLabel(rec.Type, rec.Msg), Cat: msgCategory(rec.Type), Ph: "i", S: "t",
		Ts: x.ts(rec.T), Pid: s.pid, Tid: s.tid, Args: args}); err != nil {
		return err
	}
	d := rec.Post
	if d == nil || s.ended {
		return nil
	}
	if err := x.opsChanged(s, rec.T, d.Ops); err != nil {
		return fmt.Errorf("line %d: %w", rec.Line, err)
	}
	s.err = d.Err
	if d.State != s.state {
		if err := x.stateSlice(s, rec.T); err != nil {
			return err
		}
		s.state, s.stateSince = d.State, rec.T
	}
	if d.Stopped {
		return x.end(s, rec.T, "")
	}
	return nil
}

// opsChanged opens an op slice when an op reaches the backend (SUBMITTING
// or later) and closes it when the op is quiescent.
func (x *exporter) opsChanged(s *pfSession, t int64, ops string) error {
	if ops == "" {
		return nil
	}
	byPeer, err := ParseOps(ops)
	if err != nil {
		return err
	}
	peers := make([]int, 0, len(byPeer))
	for p := range byPeer {
		peers = append(peers, p)
	}
	sort.Ints(peers)
	for _, p := range peers {
		letters := byPeer[p]
		if letters == s.ops[p] {
			continue
		}
		for i := 0; i < len(letters); i++ {
			st, _ := OpStateOf(letters[i])
			id := fmt.Sprintf("%s/peer%d/op%d", s.actor, p, i)
			_, isOpen := s.open[id]
			inFlight := st == actors.OpSubmitting || st == actors.OpSubmitted || st == actors.OpInDoubt
			switch {
			case inFlight && !isOpen:
				s.open[id] = openOp{peer: p, begin: t}
				if err := x.emit(&event{Name: x.opName(s, p), Cat: "op", Ph: "b", ID: id, Ts: x.ts(t), Pid: s.pid, Tid: s.tid,
					Args: map[string]any{"op": fmt.Sprintf("%s/peer%d/op%d", s.request, p, i)}}); err != nil {
					return err
				}
			case st.SourceQuiescent() && isOpen: // SOURCES_RELEASED: the writer is done with it
				if err := x.closeOp(s, id, t, st.String()); err != nil {
					return err
				}
			}
		}
		s.ops[p] = letters
	}
	return nil
}

func (x *exporter) opName(s *pfSession, peer int) string {
	return fmt.Sprintf("%s → peer %d ops", s.request, peer)
}

func (x *exporter) closeOp(s *pfSession, id string, t int64, outcome string) error {
	o := s.open[id]
	delete(s.open, id)
	x.stats.Ops++
	return x.emit(&event{Name: x.opName(s, o.peer), Cat: "op", Ph: "e", ID: id, Ts: x.ts(t), Pid: s.pid, Tid: s.tid,
		Args: map[string]any{"outcome": outcome, "us": float64(t-o.begin) / 1e3}})
}

func (x *exporter) stateSlice(s *pfSession, until int64) error {
	dur := x.ts(until) - x.ts(s.stateSince)
	x.stats.States++
	return x.emit(&event{Name: s.state, Cat: "state", Ph: "X", Ts: x.ts(s.stateSince), Dur: &dur, Pid: s.pid, Tid: s.tid})
}

// end closes a session's track: its open ops, its last state and the
// session slice.
func (x *exporter) end(s *pfSession, t int64, why string) error {
	s.ended = true
	ids := make([]string, 0, len(s.open))
	for id := range s.open {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := x.closeOp(s, id, t, "unfinished"); err != nil {
			return err
		}
	}
	if err := x.stateSlice(s, t); err != nil {
		return err
	}
	dur := x.ts(t) - x.ts(s.birth)
	args := map[string]any{"actor": s.actor, "state": s.state, "steps": s.steps}
	if s.err != "" {
		args["err"] = s.err
	}
	if why != "" {
		args["end"] = why
	}
	return x.emit(&event{Name: s.label, Cat: "session", Ph: "X", Ts: x.ts(s.birth), Dur: &dur, Pid: s.pid, Tid: s.tid, Args: args})
}

func msgCategory(typ string) string {
	switch typ {
	case "TxTimeout", "RxTimeout":
		return "timeout"
	case "TxPeerRequest", "TxPeerCancel", "TxPeerGone", "RxFrame", "RxPeerGone":
		return "peer"
	case "TxCompleted", "TxFlushed", "TxSent", "TxInDoubt", "TxRetired":
		return "worker"
	}
	return "local"
}

// msgLabel names a message's instant: its type and what tells it apart.
func msgLabel(typ string, raw json.RawMessage) string {
	m, err := decodeMsg(typ, raw)
	if err != nil {
		return typ
	}
	errSuffix := func(err error) string {
		if err != nil {
			return " (error)"
		}
		return ""
	}
	switch m := m.(type) {
	case actors.TxChunk:
		last := ""
		if m.Chunk.Last {
			last = " last"
		}
		return fmt.Sprintf("TxChunk [%d,%d)%s", m.Chunk.Start, m.Chunk.End, last)
	case actors.TxFenceFired:
		return fmt.Sprintf("TxFenceFired chunk%d%s", m.Index, errSuffix(m.Err))
	case peerRequest:
		return fmt.Sprintf("TxPeerRequest peer%d%s", m.msg.Peer, errSuffix(m.msg.Err))
	case actors.TxCompleted:
		if m.Refused {
			return fmt.Sprintf("TxCompleted peer%d op%d refused", m.Op.Peer, m.Op.Seq)
		}
		return fmt.Sprintf("TxCompleted peer%d op%d%s", m.Op.Peer, m.Op.Seq, errSuffix(m.Err))
	case actors.TxFlushed:
		return fmt.Sprintf("TxFlushed peer%d%s", m.Peer, errSuffix(m.Err))
	case actors.TxSent:
		return fmt.Sprintf("TxSent peer%d%s", m.Peer, errSuffix(m.Err))
	case actors.TxTimeout:
		return "TxTimeout " + TimerName(m.Kind)
	case actors.TxPeerCancel:
		return fmt.Sprintf("TxPeerCancel peer%d", m.Peer)
	case actors.TxPeerGone:
		return "TxPeerGone " + m.Peer.String()
	case actors.RxFrame:
		if m.Invalid != nil {
			return fmt.Sprintf("RxFrame writer%d invalid %s", m.Writer, frameKind(m.Frame))
		}
		return fmt.Sprintf("RxFrame writer%d %s", m.Writer, frameKind(m.Frame))
	case actors.RxPeerGone:
		return fmt.Sprintf("RxPeerGone writer%d", m.Writer)
	}
	return typ
}

// safeRecord is record, with a panic on a record no engine wrote (a
// trace is untrusted input) returned as a format error naming its line.
func (x *exporter) safeRecord(rec *Record) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: line %d: %s record the exporter cannot take: %v", ErrFormat, rec.Line, rec.Kind, p)
		}
	}()
	return x.record(rec)
}

func frameKind(f messages.Frame) string {
	if nilFrame(f) {
		return "<nil>"
	}
	switch f := f.(type) {
	case *messages.Result:
		return "Result " + f.Status.String()
	case *messages.CancelAck:
		return "CancelAck"
	case nil:
		return "<nil>"
	case Unknown:
		return f.Type
	}
	return fmt.Sprintf("%T", f)
}
