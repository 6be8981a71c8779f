package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/actors"
)

// Divergence is the first step at which replay did not reproduce the
// recorded run.
type Divergence struct {
	Actor string
	// Session names the actor's session ("tx req-3 on ctx/0"), or its
	// table's kind ("RxTable") for a parent's, the listener's or a
	// worker's call.
	Session string
	Seq     int
	// Type is the message's type ("TxCompleted") or the table call's
	// method ("Route"); "birth" for a birth.
	Type string
	Line int
	// Field is the first digest field that differs ("state", "err",
	// "eff[2]", …), or what else went wrong ("seq", "resolve", "panic",
	// "decode", "birth").
	Field    string
	Expected string
	Got      string
	// Input is a table call's recorded inputs (JSON, shortened), "" for a
	// session's step.
	Input string `json:",omitempty"`
}

func (d *Divergence) Error() string {
	s := fmt.Sprintf("replay diverged at %s (%s) seq %d %s (line %d): %s: expected %q, got %q",
		d.Actor, d.Session, d.Seq, d.Type, d.Line, d.Field, d.Expected, d.Got)
	if d.Input != "" {
		s += "; input " + d.Input
	}
	return s
}

// SessionResult is one session's final state after replay.
type SessionResult struct {
	Actor   string `json:"actor"`
	Engine  string `json:"engine"`
	Side    string `json:"side"`
	Request string `json:"request"`
	State   string `json:"state"`
	Err     string `json:"err,omitempty"`
	Stopped bool   `json:"stopped"`
	// Steps is the number of messages replayed (the birth not counted).
	Steps int `json:"steps"`
	// Diverged: this session's replay stopped at a divergence.
	Diverged bool `json:"diverged,omitempty"`
}

// Result is what Replay found.
type Result struct {
	// Records is the number of records read; Births the sessions born and
	// Steps the messages replayed; Matched the births and steps whose
	// digest matched the recording.
	Records int `json:"records"`
	Births  int `json:"births"`
	Steps   int `json:"steps"`
	Matched int `json:"matched"`
	Engines int `json:"engines"`
	// Skipped counts "msg" records (plain Record calls), which carry no
	// birth to replay from.
	Skipped int `json:"skipped,omitempty"`
	// Truncated: the Writer hit its bound; sessions may end early.
	Truncated bool `json:"truncated,omitempty"`
	// TornLine is the line of a partial last record (the writing process
	// stopped in the middle of it: killed, crashed), 0 when the trace
	// ends in a whole record. The records before it were replayed;
	// sessions may end early.
	TornLine int `json:"torn_line,omitempty"`
	// TornZeros is the zero bytes that line ends in (Torn.Zeros): its
	// machine stopped before the trace's last writes reached the disk.
	TornZeros int `json:"torn_zeros,omitempty"`
	// Version is the trace's format version and Build the kvxfer build
	// that wrote it ("" before headers named it): replay runs this
	// kvxfer's step functions, so a change of behaviour between the two
	// shows as a divergence (Print says so).
	Version int    `json:"version"`
	Build   string `json:"build,omitempty"`
	// Unclosed: the trace lacks the "end" record of its Writer's Close
	// (Reader.Unclosed): its process stopped without closing it, and its
	// last records (up to a flush interval's) may be missing.
	Unclosed bool `json:"unclosed,omitempty"`
	// Dropped is the records the Writer dropped before its Close (its
	// "end" record says): past its bound, or after a write failed.
	Dropped int64 `json:"dropped,omitempty"`
	// Part is the file's place in a rotated trace (WithRotate): 2 for the
	// file the first rotation started, and so on; 0 for a first file.
	Part int `json:"part,omitempty"`
	// Earlier are the sessions and tables of a rotated trace's later part
	// that were born in an earlier file: their records here were skipped,
	// not replayed (their state at the rotation is not recorded). Only a
	// part past the first may have them; in any other trace a record
	// before its actor's birth is malformed.
	Earlier  []EarlierActor  `json:"earlier,omitempty"`
	Sessions []SessionResult `json:"sessions"`
	// Tables are the parents', listener's and workers' tables (version 2
	// traces); Calls counts the table calls replayed and CallsMatched the
	// table births and calls whose outputs matched the recording.
	Tables       []TableResult `json:"tables,omitempty"`
	Calls        int           `json:"calls,omitempty"`
	CallsMatched int           `json:"calls_matched,omitempty"`
	// Panics are the steps recorded as panicking that panicked in replay
	// too, in file order: each reproduced, not a divergence.
	Panics []StepPanic `json:"panics,omitempty"`
	// Divergence is the first divergence in file order (nil: identical);
	// Diverged counts the sessions and tables that diverged.
	Divergence *Divergence `json:"divergence,omitempty"`
	Diverged   int         `json:"diverged,omitempty"`
}

// StepPanic is a step that panicked when it was recorded and panicked
// again in replay.
type StepPanic struct {
	Actor   string `json:"actor"`
	Session string `json:"session"`
	Seq     int    `json:"seq"`
	Type    string `json:"type"`
	Line    int    `json:"line"`
	// Recorded is what the step panicked with when it was recorded (""
	// in a trace of a build before records said) and Got what it
	// panicked with in replay. Two different texts are no divergence
	// (a panic's text may name an address): Print shows both.
	Recorded string `json:"recorded,omitempty"`
	Got      string `json:"got"`
}

// EarlierActor is a session or table born in an earlier file of a
// rotated trace, whose later records replay skipped.
type EarlierActor struct {
	Actor string `json:"actor"`
	// Table: a table's calls ("call" records), not a session's steps.
	Table bool `json:"table,omitempty"`
	// Records is the records skipped.
	Records int `json:"records"`
}

// Identical reports whether every step reproduced its recorded digest.
func (r *Result) Identical() bool { return r.Divergence == nil }

// replayed is one session being replayed.
type replayed struct {
	res  SessionResult
	tx   *actors.TxSession
	rx   *actors.RxSession
	topo *actors.Topology
	seq  int
	dead bool
	// version is the trace's format version: its digests' form.
	version int
}

// session is the session being replayed; nil when its birth failed.
func (s *replayed) session() any {
	switch {
	case s.tx != nil:
		return s.tx
	case s.rx != nil:
		return s.rx
	}
	return nil
}

func (s *replayed) name() string {
	return fmt.Sprintf("%s %s on %s", s.res.Side, s.res.Request, s.res.Engine)
}

// ReplayFile replays the trace at path.
func ReplayFile(path string) (*Result, error) {
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Replay(f)
}

// Replay re-runs a trace's recorded inputs through the sessions' step
// functions and compares each step's digest with the recorded one. A
// divergence is reported in the Result, not as an error; the error is for
// a trace that cannot be read.
func Replay(r io.Reader) (*Result, error) {
	rd := NewReader(r)
	res := &Result{}
	engines := map[string]*actors.Topology{}
	sessions := map[string]*replayed{}
	tables := map[string]*replayedTable{}
	var tableOrder []*replayedTable
	var order []*replayed
	earlier := map[string]int{} // index in res.Earlier
	skip := func(rec *Record, table bool) bool {
		if rd.Part() < 2 {
			return false
		}
		i, ok := earlier[rec.Actor]
		if !ok {
			i = len(res.Earlier)
			earlier[rec.Actor] = i
			res.Earlier = append(res.Earlier, EarlierActor{Actor: rec.Actor, Table: table})
		}
		res.Earlier[i].Records++
		return true
	}
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			res.TornLine, res.TornZeros, res.Unclosed = rd.Torn().Line, rd.Torn().Zeros, rd.Unclosed()
			break
		}
		if err != nil {
			return res, err
		}
		res.Records++
		switch rec.Kind {
		case KindTrace:
			res.Part, res.Version, res.Build = rec.Part, rec.Version, rec.Build
		case KindEngine:
			var info actors.EngineInfo
			if err := json.Unmarshal(rec.Msg, &info); err != nil {
				return res, fmt.Errorf("%w: line %d: engine: %v", ErrFormat, rec.Line, err)
			}
			engines[rec.Engine] = &info.Topology
			res.Engines++
		case KindBirth:
			if sessions[rec.Actor] != nil {
				return res, fmt.Errorf("%w: line %d: second birth of %s", ErrFormat, rec.Line, rec.Actor)
			}
			s := &replayed{res: SessionResult{Actor: rec.Actor, Engine: rec.Engine, Side: rec.Side, Request: rec.Request}, version: rd.version}
			sessions[rec.Actor] = s
			order = append(order, s)
			res.Births++
			topo := engines[rec.Engine]
			guard(func(p string) { s.diverge(res, rec, "panic", "no panic", p) }, func() { s.birth(rec, topo, res) })
		case KindStep:
			s := sessions[rec.Actor]
			if s == nil && skip(rec, false) {
				continue
			}
			if s == nil {
				return res, fmt.Errorf("%w: line %d: step of %s before its birth", ErrFormat, rec.Line, rec.Actor)
			}
			if !s.dead {
				res.Steps++
				guard(func(p string) { s.diverge(res, rec, "panic", "no panic", p) }, func() { s.step(rec, res) })
			}
		case KindTable:
			if tables[rec.Actor] != nil {
				return res, fmt.Errorf("%w: line %d: second birth of table %s", ErrFormat, rec.Line, rec.Actor)
			}
			t := &replayedTable{res: TableResult{Actor: rec.Actor, Kind: rec.Type}}
			tables[rec.Actor] = t
			tableOrder = append(tableOrder, t)
			guard(func(p string) { t.diverge(res, rec, "panic", "no panic", p) }, func() { t.birth(rec, res) })
		case KindCall:
			t := tables[rec.Actor]
			if t == nil && skip(rec, true) {
				continue
			}
			if t == nil {
				return res, fmt.Errorf("%w: line %d: call on table %s before its birth", ErrFormat, rec.Line, rec.Actor)
			}
			if !t.dead {
				res.Calls++
				guard(func(p string) { t.diverge(res, rec, "panic", "no panic", p) }, func() { t.call(rec, res) })
			}
		case KindMsg:
			res.Skipped++
		case KindTruncated:
			res.Truncated = true
		case KindEnd:
			var st EndStats
			if err := json.Unmarshal(rec.Msg, &st); err != nil {
				return res, fmt.Errorf("%w: line %d: end record: %v", ErrFormat, rec.Line, err)
			}
			res.Dropped = st.Dropped
		default:
			return res, fmt.Errorf("%w: line %d: unknown record kind %q", ErrFormat, rec.Line, rec.Kind)
		}
	}
	for _, s := range order {
		if sess := s.session(); sess != nil {
			guard(func(string) {}, func() {
				d := DigestOf(sess, nil)
				s.res.State, s.res.Err, s.res.Stopped = d.State, d.Err, d.Stopped
			})
		}
		res.Sessions = append(res.Sessions, s.res)
	}
	for _, t := range tableOrder {
		res.Tables = append(res.Tables, t.res)
	}
	slices.SortStableFunc(res.Sessions, func(a, b SessionResult) int {
		return strings.Compare(a.Engine+"\x00"+a.Side+"\x00"+a.Request, b.Engine+"\x00"+b.Side+"\x00"+b.Request)
	})
	return res, nil
}

// seqGap says what a record numbered got after last means.
func seqGap(got, last int) string {
	if got <= last {
		return fmt.Sprintf("%d (a duplicate or out-of-order record: %d already replayed)", got, last)
	}
	return fmt.Sprintf("%d (a record is missing)", got)
}

// guard runs f; a panic in it (a trace is untrusted input: its records
// can build states and effects that no engine reached, on which the step
// functions and the digest may panic) goes to diverged instead of ending
// the process.
func guard(diverged func(p string), f func()) {
	defer func() {
		if p := recover(); p != nil {
			diverged(fmt.Sprint(p))
		}
	}()
	f()
}

// diverge records a divergence of s at rec and stops replaying s.
func (s *replayed) diverge(res *Result, rec *Record, field, expected, got string) {
	s.dead = true
	s.res.Diverged = true
	res.Diverged++
	if res.Divergence == nil {
		typ := rec.Type
		if rec.Kind == KindBirth {
			typ = "birth"
		}
		res.Divergence = &Divergence{Actor: rec.Actor, Session: s.name(), Seq: rec.Seq, Type: typ, Line: rec.Line,
			Field: field, Expected: expected, Got: got}
	}
}

func (s *replayed) birth(rec *Record, topo *actors.Topology, res *Result) {
	at := time.Unix(0, rec.T)
	var eff []actors.Effect
	switch rec.Side {
	case SideTx:
		var cfg actors.TxConfig
		if err := json.Unmarshal(rec.Msg, &cfg); err != nil {
			s.diverge(res, rec, "decode", "a TxConfig", err.Error())
			return
		}
		s.tx = actors.NewTxSession(cfg)
		eff = s.tx.Init(at)
	case SideRx:
		var cfg actors.RxConfig
		if err := json.Unmarshal(rec.Msg, &cfg); err != nil {
			s.diverge(res, rec, "decode", "an RxConfig", err.Error())
			return
		}
		s.rx = actors.NewRxSession(cfg)
	default:
		s.diverge(res, rec, "birth", "side tx or rx", rec.Side)
		return
	}
	s.topo = topo
	s.check(rec, eff, res)
}

// check compares the session's digest with the recorded one.
func (s *replayed) check(rec *Record, eff []actors.Effect, res *Result) {
	if rec.Post == nil {
		s.diverge(res, rec, "post", "a digest", "none recorded")
		return
	}
	if field, want, got, ok := rec.Post.Diff(digestOf(s.session(), eff, s.version)); !ok {
		s.diverge(res, rec, field, want, got)
		return
	}
	res.Matched++
}

func (s *replayed) step(rec *Record, res *Result) {
	if rec.Seq != s.seq+1 {
		s.diverge(res, rec, "seq", fmt.Sprint(s.seq+1), seqGap(rec.Seq, s.seq))
		return
	}
	s.seq = rec.Seq
	s.res.Steps++
	msg, err := decodeMsg(rec.Type, rec.Msg)
	if err != nil {
		s.diverge(res, rec, "decode", rec.Type, err.Error())
		return
	}
	if u, ok := msg.(Unknown); ok {
		// Stepped as is, it would change nothing (an RxSession ignores
		// it; a TxSession only counts it with invariants on) and the
		// recorded digest could match a step that was never replayed.
		s.diverge(res, rec, "type", "a message type this kvxfer replays",
			fmt.Sprintf("%q, which it does not know (recorded by a newer kvxfer, or by one whose trace did not encode it): replay that trace with the kvxfer that recorded it", u.Type))
		return
	}
	if pr, ok := msg.(peerRequest); ok {
		m, rerr := s.resolve(pr)
		if rerr != nil {
			s.diverge(res, rec, "resolve "+rerr.field, rerr.expected, rerr.got)
			return
		}
		msg = m
	}
	at := time.Unix(0, rec.T)
	eff, panicked := s.stepOn(msg, at)
	switch {
	case rec.Panic && panicked == "":
		s.diverge(res, rec, "panic", "the step panics", "no panic")
	case rec.Panic:
		res.Matched++
		res.Panics = append(res.Panics, StepPanic{Actor: rec.Actor, Session: s.name(), Seq: rec.Seq, Type: rec.Type, Line: rec.Line,
			Recorded: rec.PanicValue, Got: panicked})
	case panicked != "":
		s.diverge(res, rec, "panic", "no panic", panicked)
	default:
		s.check(rec, eff, res)
	}
}

// stepOn steps the session, recovering a panic as the shell's supervisor
// would.
func (s *replayed) stepOn(msg any, at time.Time) (eff []actors.Effect, panicked string) {
	defer func() {
		if p := recover(); p != nil {
			panicked = fmt.Sprint(p)
		}
	}()
	if s.tx != nil {
		return s.tx.Step(msg, at), ""
	}
	return s.rx.Step(msg, at), ""
}

// resolveError says how a route did not rebuild as recorded.
type resolveError struct{ field, expected, got string }

// resolve rebuilds a TxPeerRequest's Route from the recorded Hello and
// RequestData, as the tx parent built it, and checks that the error and
// the expected peers come out as recorded.
func (s *replayed) resolve(pr peerRequest) (actors.TxPeerRequest, *resolveError) {
	m := pr.msg
	if pr.hello == nil {
		// The control plane did not know the peer: no route, the
		// recorded error stands.
		if m.Err == nil {
			return m, &resolveError{"inputs", "a Hello and RequestData", "none recorded"}
		}
		return m, nil
	}
	if pr.rd == nil {
		return m, &resolveError{"inputs", "a RequestData", "none recorded"}
	}
	if s.topo == nil {
		return m, &resolveError{"topology", "an engine record for " + s.res.Engine, "none"}
	}
	route, expected, err := actors.ResolveRequest(*s.topo, pr.hello, pr.rd)
	if got, want := errString(err), errString(m.Err); got != want {
		return m, &resolveError{"err", want, got}
	}
	if !slices.Equal(expected, m.Expected) {
		return m, &resolveError{"expected", fmt.Sprint(m.Expected), fmt.Sprint(expected)}
	}
	m.Route, m.Expected = route, expected
	if err != nil {
		m.Err = err
	}
	return m, nil
}

// Print writes the result: the final state of every session and a summary
// line, or the divergence.
func (r *Result) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ENGINE\tSIDE\tREQUEST\tSTATE\tSTEPS\tSTOPPED\tERROR")
	for _, s := range r.Sessions {
		state := s.State
		if s.Diverged {
			state += " (diverged)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%t\t%s\n", s.Engine, s.Side, s.Request, state, s.Steps, s.Stopped, oneLine(s.Err, 100))
	}
	_ = tw.Flush()
	if len(r.Tables) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "ACTOR\tTABLE\tCALLS")
		for _, t := range r.Tables {
			calls := fmt.Sprint(t.Calls)
			if t.Diverged {
				calls += " (diverged)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Actor, t.Kind, calls)
		}
		_ = tw.Flush()
	}
	if r.Truncated {
		fmt.Fprintln(w, "note: the trace was truncated at its size bound; sessions may end early")
	}
	if r.Part > 1 {
		fmt.Fprintf(w, "note: this file is part %d of a rotated trace (its writer's bound started a new file %d times before it)", r.Part, r.Part-1)
		if len(r.Earlier) > 0 {
			var sessions, tables []string
			n := 0
			for _, e := range r.Earlier {
				n += e.Records
				if e.Table {
					tables = append(tables, e.Actor)
				} else {
					sessions = append(sessions, e.Actor)
				}
			}
			fmt.Fprintf(w, "; %s and %s began in an earlier file: their %d records here were skipped, not replayed (not a divergence)",
				namedList(sessions, "session"), namedList(tables, "table"), n)
		}
		fmt.Fprintln(w)
	}
	switch {
	case r.TornLine > 0 && r.TornZeros > 0:
		fmt.Fprintf(w, "note: the trace ends in %d zero bytes at line %d (its machine stopped, crashed or lost power, before the file's last writes reached the disk); the %d whole records before them were replayed, sessions may end early\n",
			r.TornZeros, r.TornLine, r.Records)
	case r.TornLine > 0:
		fmt.Fprintf(w, "note: the trace ends in a partial record at line %d (its process stopped while writing it: killed or crashed); the %d whole records before it were replayed, sessions may end early\n",
			r.TornLine, r.Records)
	case r.Unclosed:
		fmt.Fprintf(w, "note: the trace was not closed (no end record after its %d records): its process stopped without closing its engine (killed or crashed), or still writes it; its last second of records may be missing and sessions may end early\n",
			r.Records)
	}
	if r.Dropped > 0 && !r.Truncated {
		fmt.Fprintf(w, "note: the trace's writer dropped %d records (a write failed); sessions may end early\n", r.Dropped)
	}
	if len(r.Panics) > 0 {
		p := r.Panics[0]
		fmt.Fprintf(w, "note: %s panicked in replay as recorded (reproduced, not a divergence); the first, line %d: %s (%s) seq %d %s panicked with %q",
			plural(len(r.Panics), "step"), p.Line, p.Actor, p.Session, p.Seq, p.Type, oneLine(p.Got, 200))
		if p.Recorded != "" && p.Recorded != p.Got {
			fmt.Fprintf(w, " (recorded with %q)", oneLine(p.Recorded, 200))
		}
		fmt.Fprintln(w)
	}
	if d := r.Divergence; d != nil {
		if len(r.Tables) == 0 {
			fmt.Fprintf(w, "DIVERGED: %d of %d sessions; first at line %d:\n", r.Diverged, len(r.Sessions), d.Line)
		} else {
			fmt.Fprintf(w, "DIVERGED: %d of %d actors (%s, %s); first at line %d:\n", r.Diverged, len(r.Sessions)+len(r.Tables),
				plural(len(r.Sessions), "session"), plural(len(r.Tables), "table"), d.Line)
		}
		fmt.Fprintf(w, "  actor    %s (%s)\n  seq      %d (%s)\n  field    %s\n  expected %s\n  got      %s\n",
			d.Actor, d.Session, d.Seq, d.Type, d.Field, d.Expected, d.Got)
		if d.Input != "" {
			fmt.Fprintf(w, "  input    %s\n", d.Input)
		}
		if note := r.recorderNote(); note != "" {
			fmt.Fprintf(w, "note: %s\n", note)
		}
		return
	}
	fmt.Fprintf(w, "identical: %s on %s; %d records, %d births and %d steps replayed, every digest matched",
		plural(len(r.Sessions), "session"), plural(r.Engines, "engine"), r.Records, r.Births, r.Steps)
	if len(r.Tables) > 0 {
		fmt.Fprintf(w, "; %s, %d calls replayed, every output matched", plural(len(r.Tables), "table"), r.Calls)
	}
	fmt.Fprintln(w)
}

// recorderNote says, for a divergence, that another kvxfer than this one
// recorded the trace: "" when this build did.
func (r *Result) recorderNote() string {
	const means = "replay runs this kvxfer's step functions, so a change of behaviour between the two shows as a divergence that is no fault of the recorded run; replay the trace with the kvxfer that recorded it to tell them apart"
	switch {
	case r.Version < Version:
		by := ""
		if r.Build != "" {
			by = " " + r.Build
		}
		return fmt.Sprintf("this trace was recorded in format version %d by an older kvxfer%s; this is kvxfer %s, which writes version %d: %s",
			r.Version, by, recorderBuild(), Version, means)
	case r.Build == "":
		return fmt.Sprintf("this trace was recorded by a kvxfer that did not name its build, one older than this kvxfer %s: %s", recorderBuild(), means)
	case r.Build != recorderBuild():
		return fmt.Sprintf("this trace was recorded by kvxfer %s, replayed by kvxfer %s: %s", r.Build, recorderBuild(), means)
	}
	return ""
}

func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// namedList is "2 sessions (a, b)", naming at most 5.
func namedList(names []string, what string) string {
	if len(names) == 0 {
		return "no " + what + "s"
	}
	s := plural(len(names), what)
	shown := names
	if len(shown) > 5 {
		shown = shown[:5]
	}
	s += " (" + strings.Join(shown, ", ")
	if len(shown) < len(names) {
		s += ", …"
	}
	return s + ")"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
