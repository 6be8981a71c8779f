package trace_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/trace"
)

// TestTornTraceReadsUpToItsLastWholeRecord: a process killed while its
// Writer wrote leaves a trace whose last line is a partial record. Replay
// and export read every whole record before it and name the partial one;
// they do not refuse the whole trace (a crash is when a trace is needed
// most). A damaged line that is not the last is still an error.
func TestTornTraceReadsUpToItsLastWholeRecord(t *testing.T) {
	b, err := os.ReadFile("testdata/v2-ctx.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	keep := len(lines) * 2 / 3
	whole := strings.Join(lines[:keep], "")
	partial := lines[keep][:len(lines[keep])/2]
	torn := whole + partial

	want, err := trace.Replay(strings.NewReader(whole))
	if err != nil {
		t.Fatalf("replay of the whole records: %v", err)
	}
	res, err := trace.Replay(strings.NewReader(torn))
	if err != nil {
		t.Fatalf("replay of a torn trace: %v, want the records before the partial one replayed", err)
	}
	if res.TornLine != keep+1 || res.Records != want.Records || res.Steps != want.Steps || res.Calls != want.Calls || !res.Identical() {
		t.Fatalf("torn trace: line %d, %d records, %d steps, %d calls, identical %t; want line %d, %d records, %d steps, %d calls, identical",
			res.TornLine, res.Records, res.Steps, res.Calls, res.Identical(), keep+1, want.Records, want.Steps, want.Calls)
	}
	if want.TornLine != 0 {
		t.Errorf("a trace ending in a whole record: torn line %d, want 0", want.TornLine)
	}
	var out bytes.Buffer
	res.Print(&out)
	if !strings.Contains(out.String(), "partial record at line ") {
		t.Errorf("replay's report does not name the partial record:\n%s", out.String())
	}

	st, err := trace.ExportPerfetto(strings.NewReader(torn), io.Discard)
	if err != nil || st.TornLine != keep+1 {
		t.Errorf("export of a torn trace: torn line %d, %v; want line %d, no error", st.TornLine, err, keep+1)
	}

	// The same damage before the last line is corruption, not a kill.
	if _, err := trace.Replay(strings.NewReader(whole + partial + "\n" + lines[keep+1])); !errors.Is(err, trace.ErrFormat) {
		t.Errorf("a partial record before the last line: %v, want ErrFormat", err)
	}
	// A last line that is not how a record begins is damage, not a cut.
	if _, err := trace.Replay(strings.NewReader(whole + "\x00\x00garbage")); !errors.Is(err, trace.ErrFormat) {
		t.Errorf("garbage after the last whole record: %v, want ErrFormat", err)
	}
	if _, err := trace.Replay(strings.NewReader("not a trace")); !errors.Is(err, trace.ErrFormat) || strings.Contains(err.Error(), "partial header") {
		t.Errorf("a file that is no trace: %v, want ErrFormat not naming a partial header", err)
	}
	// A partial header is all there is: an error naming it.
	if _, err := trace.Replay(strings.NewReader(lines[0][:10])); !errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), "partial header") {
		t.Errorf("a partial header: %v, want ErrFormat naming a partial header", err)
	}
}

// TestWholeMalformedLastLineIsNotTorn: a last line without its newline
// that is a whole JSON object the reader cannot take (a field of the wrong
// type: damage or a hand edit) is no record cut short by a kill — a cut
// record is never whole JSON. It is an error naming the line, not a "torn"
// record silently left out of a replay that then reports identical.
func TestWholeMalformedLastLineIsNotTorn(t *testing.T) {
	const body = `{"kind":"trace","version":3,"t":1}` + "\n" +
		`{"kind":"birth","actor":"a","engine":"e/0","side":"tx","request":"s","t":1,"type":"TxConfig","msg":{"Request":"s"},"post":{"state":"INIT"}}` + "\n" +
		`{"kind":"step","actor":"a","seq":"1","t":2,"type":"TxCancel","msg":{},"post":{"state":"CANCELLED"}}`
	res, err := trace.Replay(strings.NewReader(body))
	if !errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), "line 3") {
		var torn int
		if res != nil {
			torn = res.TornLine
		}
		t.Fatalf("replay of a trace whose whole last record is malformed: %v (torn line %d), want ErrFormat naming line 3", err, torn)
	}
	if _, err := trace.ExportPerfetto(strings.NewReader(body), io.Discard); !errors.Is(err, trace.ErrFormat) {
		t.Errorf("export of a trace whose whole last record is malformed: %v, want ErrFormat", err)
	}
}

// TestZeroedTailIsTorn: a machine that stopped (crashed, lost power)
// while the trace's last writes were in its page cache can leave the file
// at its new length with zeros where those bytes were never written. The
// whole records before the zeros replay and the note names the zeroed
// tail, as for a record a killed process cut short; zeros inside the
// trace, or garbage after them, are still damage. (Before, a zeroed tail
// refused the whole trace: "invalid character '\x00'".)
func TestZeroedTailIsTorn(t *testing.T) {
	b, err := os.ReadFile("testdata/v2-ctx.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	keep := len(lines) / 2
	whole := strings.Join(lines[:keep], "")
	zeros := strings.Repeat("\x00", 4096)
	want, err := trace.Replay(strings.NewReader(whole))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"zeros after a whole record":   whole + zeros,
		"zeros after a partial record": whole + lines[keep][:40] + zeros,
	} {
		res, err := trace.Replay(strings.NewReader(body))
		if err != nil {
			t.Errorf("%s: %v, want the whole records replayed", name, err)
			continue
		}
		if res.TornLine != keep+1 || res.Records != want.Records || !res.Identical() {
			t.Errorf("%s: torn line %d, %d records, identical %t; want line %d, %d records, identical",
				name, res.TornLine, res.Records, res.Identical(), keep+1, want.Records)
		}
		var out strings.Builder
		res.Print(&out)
		if !strings.Contains(out.String(), fmt.Sprintf("ends in %d zero bytes at line %d", len(zeros), keep+1)) || !strings.Contains(out.String(), "machine stopped") {
			t.Errorf("%s: the report does not name the zeroed tail:\n%s", name, out.String())
		}
		if st, err := trace.ExportPerfetto(strings.NewReader(body), io.Discard); err != nil || st.TornLine != keep+1 {
			t.Errorf("%s: export: torn line %d, %v; want line %d", name, st.TornLine, err, keep+1)
		}
	}
	for name, body := range map[string]string{
		"zeros inside":         whole + zeros + "\n" + lines[keep],
		"garbage after zeros":  whole + zeros + "garbage",
		"zeros in a whole one": whole + strings.Replace(lines[keep], `"kind"`, "\x00\x00\x00\x00\x00\x00", 1),
	} {
		if _, err := trace.Replay(strings.NewReader(body)); !errors.Is(err, trace.ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}
