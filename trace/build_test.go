package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
)

// TestDivergenceNamesTheRecordingKvxfer: a trace's header names the
// kvxfer build that wrote it, and replay's report of a divergence says
// when the trace came from another build (or an older format, or a
// kvxfer before the header named its build): replay runs this kvxfer's
// step functions, so a change of behaviour between the two shows as a
// divergence that is no fault of the recorded run. (Before, an
// incident's trace replayed by a newer kvxfer diverged with nothing
// saying so: testdata/v2-gen.jsonl diverges at the RequestData's
// Features, which later builds set.)
func TestDivergenceNamesTheRecordingKvxfer(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, success("r"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(buf.String(), "\n")
	var hdr struct{ Build string }
	if err := json.Unmarshal([]byte(lines[0]), &hdr); err != nil {
		t.Fatal(err)
	}
	if hdr.Build == "" {
		t.Fatalf("header %s names no build", lines[0])
	}
	report := func(body string) (*Result, string) {
		t.Helper()
		res := replayBytes(t, []byte(body))
		var out strings.Builder
		res.Print(&out)
		return res, out.String()
	}
	if res, out := report(buf.String()); !res.Identical() || strings.Contains(out, "recorded by") {
		t.Fatalf("the trace as written: identical %t:\n%s", res.Identical(), out)
	}
	last := len(lines) - 3 // the last step, before the end record and ""
	if !strings.Contains(lines[last], `"kind":"step"`) {
		t.Fatalf("line %d is no step: %s", last+1, lines[last])
	}
	lines[last] = strings.Replace(lines[last], `"post":{"state":"`, `"post":{"state":"X`, 1)
	diverged := strings.Join(lines, "")
	if res, out := report(diverged); res.Identical() || strings.Contains(out, "recorded by") {
		t.Fatalf("a divergence in a trace of this build: identical %t, or it blames the build:\n%s", res.Identical(), out)
	}
	for name, c := range map[string]struct{ header, want string }{
		"another build": {strings.Replace(lines[0], `"build":`, `"build":"v0.0.1","was":`, 1),
			"recorded by kvxfer v0.0.1, replayed by kvxfer " + hdr.Build},
		"no build": {strings.Replace(lines[0], `"build":`, `"was":`, 1), "recorded by a kvxfer that did not name its build"},
	} {
		body := c.header + strings.Join(lines[1:], "")
		if _, out := report(body); !strings.Contains(out, c.want) || !strings.Contains(out, "change of behaviour") {
			t.Errorf("%s: the report does not say %q and what it means:\n%s", name, c.want, out)
		}
		if _, out := report(c.header + strings.Join(lines[1:len(lines)-3], "")); strings.Contains(out, "recorded by") {
			t.Errorf("%s: a trace that replays identically blames the build:\n%s", name, out)
		}
	}
	v2, err := os.ReadFile("testdata/v2-gen.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if res, out := report(string(v2)); res.Identical() || !strings.Contains(out, "recorded in format version 2 by an older kvxfer") ||
		!strings.Contains(out, "change of behaviour") {
		t.Errorf("a version 2 trace that diverges: the report does not say an older kvxfer wrote it:\n%s", out)
	}
}
