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

// A trace file is untrusted input: a damaged or hand-made one must give
// an error or a divergence naming its line, never a panic of the replay or
// the exporter (kvxfer replay, kvxfer trace export).
func TestMalformedRecordsDoNotPanic(t *testing.T) {
	const v2 = `{"kind":"trace","version":2,"t":1}` + "\n"
	const v1 = `{"kind":"trace","version":1,"t":1}` + "\n"
	for _, c := range []struct{ name, body string }{
		// A known frame type without its body reached the core tables as
		// a typed nil (messages.(*Result).Validate on nil).
		{"RouteFrame, Result without a body", v2 +
			`{"kind":"table","actor":"e/0/listener","engine":"e/0","t":1,"type":"RouteFrame","msg":{}}` + "\n" +
			`{"kind":"call","actor":"e/0/listener","seq":1,"t":1,"type":"RouteFrame","msg":{"Frame":{"Type":"Result"}},"out":{}}` + "\n"},
		{"RxTable Route, Result without a body", v2 +
			`{"kind":"table","actor":"e/0/rx","engine":"e/0","t":1,"type":"RxTable","msg":{"Layout":{}}}` + "\n" +
			`{"kind":"call","actor":"e/0/rx","seq":1,"t":1,"type":"Route","msg":{"Frame":{"Type":"Result"}},"out":{}}` + "\n"},
		// An rx writer without its RequestData: the step's effect carried
		// a typed-nil frame into the digest.
		{"rx writer without a RequestData", v1 +
			`{"kind":"birth","actor":"g/0/1","engine":"g/0","side":"rx","request":"r","t":1,"type":"RxConfig","msg":{"Writers":[{}]},"post":{"state":"REQUESTED","writers_pending":true}}` + "\n" +
			`{"kind":"step","actor":"g/0/1","seq":1,"t":2,"type":"RxBegin","post":{}}` + "\n"},
		{"RxFrame, Result without a body", v1 +
			`{"kind":"birth","actor":"g/0/1","engine":"g/0","side":"rx","request":"r","t":1,"type":"RxConfig","msg":{},"post":{"state":"REQUESTED"}}` + "\n" +
			`{"kind":"step","actor":"g/0/1","seq":1,"t":2,"type":"RxFrame","msg":{"Frame":{"Type":"Result"}},"post":{}}` + "\n"},
		{"AllocQueue, negative count", v2 +
			`{"kind":"table","actor":"e/0/rx/queue","engine":"e/0","t":1,"type":"AllocQueue","msg":{}}` + "\n" +
			`{"kind":"call","actor":"e/0/rx/queue","seq":1,"t":1,"type":"Push","msg":{"Request":"r","Counts":[-5]},"out":{}}` + "\n" +
			`{"kind":"call","actor":"e/0/rx/queue","seq":2,"t":1,"type":"Drain","msg":{"Allocs":[{}]},"out":{}}` + "\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := replay(t, c.body)
			if err == nil && (res == nil || res.Divergence == nil) {
				t.Errorf("replay of a damaged trace: no error and no divergence (%+v)", res)
			}
			if err != nil && !errors.Is(err, trace.ErrFormat) {
				t.Errorf("replay: %v, want ErrFormat", err)
			}
			if err := export(t, c.body); err != nil && !errors.Is(err, trace.ErrFormat) {
				t.Errorf("export: %v, want nil or ErrFormat", err)
			}
		})
	}
}

func replay(t *testing.T, body string) (res *trace.Result, err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("replay panicked: %v", p)
		}
	}()
	return trace.Replay(strings.NewReader(body))
}

func export(t *testing.T, body string) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("export panicked: %v", p)
		}
	}()
	_, err = trace.ExportPerfetto(strings.NewReader(body), io.Discard)
	return err
}

// fuzzSeeds are real traces: v1 ones and v2 ones recorded by the CLI's
// ctx and gen processes.
func fuzzSeeds(f *testing.F) {
	for _, p := range []string{"testdata/v1-ctx.jsonl", "testdata/v1-gen.jsonl", "testdata/v2-ctx.jsonl", "testdata/v2-gen.jsonl"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// FuzzReplay: whatever the bytes, Replay returns (an error, a divergence
// or a match) without panicking, and an error is about the trace
// (ErrFormat) and names where in it (its line), or says it is empty.
func FuzzReplay(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := trace.Replay(bytes.NewReader(b))
		if err != nil && (!errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), "line ") && !strings.Contains(err.Error(), "empty")) {
			t.Fatalf("replay: %v: want ErrFormat naming a line, or the trace empty", err)
		}
	})
}

// FuzzExportPerfetto: whatever the bytes, the exporter returns without
// panicking.
func FuzzExportPerfetto(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = trace.ExportPerfetto(bytes.NewReader(b), io.Discard)
	})
}

// TestDuplicateRecordIsNamed: a record seen twice is named as a duplicate,
// not as a missing record.
func TestDuplicateRecordIsNamed(t *testing.T) {
	b, err := os.ReadFile("testdata/v1-gen.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	dup := -1
	for i, l := range lines {
		if strings.Contains(l, `"kind":"step"`) {
			dup = i
			break
		}
	}
	if dup < 0 {
		t.Fatal("no step record in testdata/v1-gen.jsonl")
	}
	body := strings.Join(lines[:dup+1], "") + lines[dup] + strings.Join(lines[dup+1:], "")
	res, err := trace.Replay(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if res.Divergence == nil || res.Divergence.Field != "seq" || !strings.Contains(res.Divergence.Got, "duplicate") {
		t.Fatalf("a duplicated step record: divergence %v, want field seq naming a duplicate", res.Divergence)
	}
}

// TestNotATraceIsNamed: a file that is no trace at all (a README, a
// compressed trace) is named as such, not only by the JSON decoder's words.
func TestNotATraceIsNamed(t *testing.T) {
	for _, body := range []string{"# a README\n", "\x1f\x8b\x08\x00binary\n", "[1, 2]\n"} {
		_, err := replay(t, body)
		if !errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), "not a kvxfer trace") || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("replay of %q: %v, want ErrFormat saying line 1 is not a kvxfer trace", body, err)
		}
	}
	// A later line that is no record is named by its line, not as "no trace".
	_, err := replay(t, `{"kind":"trace","version":2,"t":1}`+"\n# later\n")
	if !errors.Is(err, trace.ErrFormat) || strings.Contains(err.Error(), "not a kvxfer trace") || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("replay of a trace whose line 2 is no record: %v, want ErrFormat naming line 2", err)
	}
}

// TestJoinedTracesAreRefused: a trace header after the first line is two
// traces in one file (files joined with cat: the parts of a rotated
// trace, or two processes' traces). Replay refuses it naming the line and
// what to do. (Before, a first trace without its end record was silently
// merged with the second and replayed "identical", and one with its end
// record was blamed on "two writers".)
func TestJoinedTracesAreRefused(t *testing.T) {
	gen, err := os.ReadFile("testdata/v2-gen.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := os.ReadFile("testdata/v2-ctx.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	second := strings.Count(string(ctx), "\n") + 1
	var closed bytes.Buffer
	if err := trace.NewWriter(&closed).Close(); err != nil {
		t.Fatal(err)
	}
	part2 := strings.Replace(string(gen), `"version":2,`, `"version":2,"part":2,`, 1)
	for _, c := range []struct {
		name, body string
		line       int
		want       string
	}{
		{"unclosed first trace", string(ctx) + string(gen), second, "kvxfer replay each file"},
		{"closed first trace", closed.String() + string(gen), 3, "kvxfer replay each file"},
		{"rotated parts", string(ctx) + part2, second, "part 2 of a rotated trace"},
	} {
		_, err := replay(t, c.body)
		if !errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), fmt.Sprintf("line %d:", c.line)) ||
			!strings.Contains(err.Error(), "second trace header") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: replay: %v, want ErrFormat naming line %d as a second trace header and %q", c.name, err, c.line, c.want)
		}
		if err := export(t, c.body); !errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), "second trace header") {
			t.Errorf("%s: export: %v, want ErrFormat naming a second trace header", c.name, err)
		}
	}
}

// TestDamageIsNamedWithWhatToDo: an empty trace, one a newer kvxfer
// wrote, a damaged line inside a trace and a line longer than any record
// are each named (the line) with what to do about it, not only with the
// decoder's words ("empty trace", "unexpected end of JSON input",
// "bufio.Scanner: token too long" after the line before).
func TestDamageIsNamedWithWhatToDo(t *testing.T) {
	ctx, err := os.ReadFile("testdata/v2-ctx.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(ctx), "\n")
	cut := strings.Join(lines[:20], "") + lines[20][:50] + "\n" + strings.Join(lines[21:], "")
	long := lines[0] + `{"kind":"step","msg":"` + strings.Repeat("x", 64<<20) + `"}` + "\n"
	for _, c := range []struct {
		name, body string
		want       []string
	}{
		{"empty", "", []string{"empty", "first flush"}},
		{"blank lines", "\n\n", []string{"empty", "first flush"}},
		{"newer version", strings.Replace(lines[0], `"version":2`, `"version":99`, 1), []string{"line 1", "version 99", "newer kvxfer"}},
		{"damaged line inside", cut, []string{"line 21", "the 20 lines before it are whole", "head -n 20"}},
		{"line too long", long, []string{"line 2", "longer than 64 MiB"}},
	} {
		_, err := replay(t, c.body)
		if !errors.Is(err, trace.ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", c.name, err, w)
			}
		}
	}
}
