package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Version is the trace format version this package writes. Version 2
// adds the "table" and "call" records (the parents', listener's and
// workers' steps), version 3 the "end" record a Writer's Close writes
// last, version 4 digest lines that tell a ReleaseDest out of quarantine
// from a plain one and name a QuarantineDest's blocks and writers; it
// reads versions MinVersion to Version.
const Version = 4

// endVersion is the first version whose Writer ends a closed trace with
// an "end" record: a trace of an older version without one is not known
// to be cut short.
const endVersion = 3

// MinVersion is the oldest trace format version this package reads.
const MinVersion = 1

// Record kinds.
const (
	KindTrace     = "trace"
	KindEngine    = "engine"
	KindBirth     = "birth"
	KindStep      = "step"
	KindMsg       = "msg"
	KindTruncated = "truncated"
	KindTable     = "table"
	KindCall      = "call"
	// KindEnd is the last record of a trace whose Writer was closed (its
	// Msg an EndStats). A trace of version 3 or later without one was cut
	// short: its process stopped without closing it (killed or crashed),
	// or still writes it.
	KindEnd = "end"
)

// EndStats is an "end" record's message: what the Writer wrote and
// dropped (past its bound, or after a write failed) before its Close.
type EndStats struct {
	Records int64 `json:"records"`
	Dropped int64 `json:"dropped"`
}

// Sides of a session.
const (
	SideTx = "tx"
	SideRx = "rx"
)

// ErrFormat is wrapped by every error about a malformed trace.
var ErrFormat = errors.New("trace: malformed trace")

// Record is one line of a trace (see the package doc for each kind).
type Record struct {
	Kind    string `json:"kind"`
	Version int    `json:"version,omitempty"`
	// Part is a header's place in a rotated trace (WithRotate): 2 for
	// the first file a rotation started, and so on; 0 for a trace's
	// first file. Sessions and tables of a part past the first may have
	// been born in an earlier file.
	Part int `json:"part,omitempty"`
	// Build is a header's kvxfer build, the one that wrote the trace
	// (absent in traces of kvxfer builds before it).
	Build   string          `json:"build,omitempty"`
	Actor   string          `json:"actor,omitempty"`
	Seq     int             `json:"seq,omitempty"`
	Engine  string          `json:"engine,omitempty"`
	Side    string          `json:"side,omitempty"`
	Request string          `json:"request,omitempty"`
	T       int64           `json:"t"`
	Type    string          `json:"type,omitempty"`
	Msg     json.RawMessage `json:"msg,omitempty"`
	Post    *Digest         `json:"post,omitempty"`
	// Out is a "call" record's outputs (an actors.TableOut).
	Out json.RawMessage `json:"out,omitempty"`
	// Panic marks a step that panicked (it has no Post), and PanicValue
	// says with what (fmt.Sprint of the panic's value; absent in traces
	// of builds before it, which readers ignore: not a format change).
	Panic      bool   `json:"panic,omitempty"`
	PanicValue string `json:"panic_value,omitempty"`
	// Line is the record's line in its file (not written).
	Line int `json:"-"`
}

// maxLine bounds one record: an RxConfig naming messages.MaxBlocks blocks
// is the largest a valid run writes (a few MiB).
const maxLine = 64 << 20

// Reader reads a trace record by record.
type Reader struct {
	sc      *bufio.Scanner
	line    int
	started bool
	// unended: the token just scanned is the file's last and has no
	// newline after it.
	unended bool
	torn    Torn
	version int
	part    int
	build   string
	ended   bool
}

// Torn is a trace's last line when it is a partial record: the process
// that wrote it stopped (was killed, crashed) in the middle of writing it.
// The records before it are whole and read as usual.
type Torn struct {
	Line  int // its line number (0: the trace ends in a whole record)
	Bytes int // the partial record's length, its zero bytes not counted
	// Zeros is the zero bytes the line ends in: its machine stopped
	// (crashed, lost power) after the file grew but before the bytes
	// written there reached the disk, which left zeros in their place.
	Zeros int
}

// NewReader reads records from r.
func NewReader(r io.Reader) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	rd := &Reader{sc: sc}
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		adv, tok, err := bufio.ScanLines(data, atEOF)
		rd.unended = atEOF && tok != nil && adv == len(data) && (len(data) == 0 || data[len(data)-1] != '\n')
		return adv, tok, err
	})
	return rd
}

// Torn says whether the trace ended in a partial record, after Next
// returned io.EOF.
func (r *Reader) Torn() Torn { return r.torn }

// Unclosed says, after Next returned io.EOF, whether the trace lacks the
// "end" record its Writer's Close writes last (a trace of a version that
// writes one): its process stopped without closing it (killed or
// crashed), or still writes it, and its last records (up to a flush
// interval's) may be missing. A trace with a torn last line is unclosed
// too.
func (r *Reader) Unclosed() bool { return r.version >= endVersion && !r.ended }

// Version is the trace's format version (its header's). Valid after the
// first Next.
func (r *Reader) Version() int { return r.version }

// Build names the kvxfer build that wrote the trace (its header's Build),
// "" for a trace of a build before headers named it. Valid after the
// first Next.
func (r *Reader) Build() string { return r.build }

// Part is the trace's place in a rotated trace (its header's Part): 0 or
// 1 for a first file, 2 for the file the first rotation started, and so
// on. Valid after the first Next.
func (r *Reader) Part() int { return r.part }

// Next returns the next record, or io.EOF after the last. The first record
// must be the trace header of a version this package reads; blank lines
// are skipped. A last line without its newline that is not a whole record
// (the writer stopped mid-record), or that ends in zero bytes (its
// machine stopped before the bytes reached the disk), ends the trace:
// Next returns io.EOF and Torn names it.
func (r *Reader) Next() (*Record, error) {
	for r.sc.Scan() {
		r.line++
		b := r.sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil {
			nz := bytes.TrimRight(b, "\x00")
			zeros := len(b) - len(nz)
			if r.unended && r.started && (cutShort(b, `{"kind":"`) || zeros > 0 && (len(nz) == 0 || recordPrefix(nz, `{"kind":"`))) {
				r.torn = Torn{Line: r.line, Bytes: len(nz), Zeros: zeros}
				return nil, io.EOF
			}
			if r.unended && !r.started && zeros > 0 && (len(nz) == 0 || recordPrefix(nz, `{"kind":"trace",`)) {
				return nil, fmt.Errorf("%w: line %d: the trace holds %d zero bytes after %d bytes of its header: its machine stopped (crashed, lost power) before the trace reached the disk", ErrFormat, r.line, zeros, len(nz))
			}
			if r.unended && !r.started && cutShort(b, `{"kind":"trace",`) {
				return nil, fmt.Errorf("%w: line %d: the trace holds only a partial header (%d bytes): the process stopped while writing it", ErrFormat, r.line, len(b))
			}
			if !r.started {
				// The first line is no JSON record: not a kvxfer trace
				// at all (a README, a binary, a compressed trace).
				return nil, fmt.Errorf("%w: line %d is no JSON record (%v): not a kvxfer trace, whose first line is its {\"kind\":\"trace\",…} header (compressed? decompress it first)", ErrFormat, r.line, err)
			}
			return nil, fmt.Errorf("%w: line %d is no whole record (%v): the file is damaged there; %s", ErrFormat, r.line, err, r.wholeBefore(r.line))
		}
		rec.Line = r.line
		if !r.started {
			if rec.Kind != KindTrace {
				return nil, fmt.Errorf("%w: line %d: first record is %q, want the %q header", ErrFormat, r.line, rec.Kind, KindTrace)
			}
			if rec.Version > Version {
				return nil, fmt.Errorf("%w: line %d: format version %d, written by a newer kvxfer than this one (which reads versions %d to %d): replay it with that kvxfer or a later one", ErrFormat, r.line, rec.Version, MinVersion, Version)
			}
			if rec.Version < MinVersion {
				return nil, fmt.Errorf("%w: line %d: format version %d, which no kvxfer writes (this one reads versions %d to %d): the header is damaged, or this is no kvxfer trace", ErrFormat, r.line, rec.Version, MinVersion, Version)
			}
			r.started = true
			r.version = rec.Version
			r.part = rec.Part
			r.build = rec.Build
		} else if rec.Kind == KindTrace {
			// A Writer writes its header once, first: a second one is
			// another trace joined after this one.
			what := "another trace's"
			if rec.Part > 1 {
				what = fmt.Sprintf("the header of part %d of a rotated trace,", rec.Part)
			}
			return nil, fmt.Errorf("%w: line %d: a second trace header (%s after the %d lines of this one): this file holds two traces one after the other (joined with cat?), which replay would mix up: kvxfer replay each file on its own (a rotated trace's FILE.N … FILE.1 FILE each replay alone)", ErrFormat, r.line, what, r.line-1)
		}
		if r.ended {
			return nil, fmt.Errorf("%w: line %d: a %q record after the trace's %q record: two writers wrote this file", ErrFormat, r.line, rec.Kind, KindEnd)
		}
		if rec.Kind == KindEnd {
			r.ended = true
		}
		return &rec, nil
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d is longer than %d MiB, more than any record holds: the file is damaged there, or is no kvxfer trace; %s", ErrFormat, r.line+1, maxLine>>20, r.wholeBefore(r.line+1))
		}
		return nil, fmt.Errorf("%w: after line %d: %v", ErrFormat, r.line, err)
	}
	if !r.started {
		return nil, fmt.Errorf("%w: the trace is empty (no header): the process that wrote it stopped before its Writer's first flush (a Writer from Create flushes every second, and at Close), or the file is no trace", ErrFormat)
	}
	return nil, io.EOF
}

// wholeBefore says that the lines before line are whole and how to
// replay them.
func (r *Reader) wholeBefore(line int) string {
	n := line - 1
	if n == 1 {
		return "only its header before it is whole"
	}
	return fmt.Sprintf("the %d lines before it are whole (head -n %d of the file replays them)", n, n)
}

// cutShort reports whether b, a line that does not parse, is how a
// Writer's record begins (prefix), cut short: a record the writing
// process stopped in the middle of, not some other damage. A cut record
// is never whole JSON: one that is (a field of the wrong type) is damage.
func cutShort(b []byte, prefix string) bool {
	return !json.Valid(b) && recordPrefix(b, prefix)
}

// recordPrefix reports whether b begins as a record does (prefix), or is
// the beginning of prefix.
func recordPrefix(b []byte, prefix string) bool {
	if len(b) < len(prefix) {
		return strings.HasPrefix(prefix, string(b))
	}
	return strings.HasPrefix(string(b), prefix)
}
