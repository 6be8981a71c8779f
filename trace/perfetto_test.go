package trace_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/trace"
)

type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	ID   string         `json:"id"`
	Args map[string]any `json:"args"`
}

// TestExportPerfetto exports real traces and checks the timeline: valid
// JSON, one track per session, an instant per step, an op slice (begin and
// end) per Submit effect, and state slices nested in session slices.
func TestExportPerfetto(t *testing.T) {
	ctxTrace, genTrace := recordScenarios(t)
	for _, path := range []string{ctxTrace, genTrace} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			res := replayFile(t, path)
			submits := 0
			for _, l := range readLines(t, path) {
				if post, ok := l["post"].(map[string]any); ok {
					for _, e := range asSlice(post["eff"]) {
						if strings.HasPrefix(e.(string), "Submit ") {
							submits++
						}
					}
				}
			}
			out := filepath.Join(t.TempDir(), "out.json")
			st, err := trace.ExportPerfettoFile(path, out)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				TraceEvents     []chromeEvent `json:"traceEvents"`
				DisplayTimeUnit string        `json:"displayTimeUnit"`
			}
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			count := map[string]int{}
			sessions := map[[2]int]chromeEvent{}
			begins := map[string]chromeEvent{}
			for _, e := range doc.TraceEvents {
				count[e.Ph+" "+e.Cat+e.Name]++
				if e.Ph != "M" && e.Ts < 0 {
					t.Errorf("negative timestamp: %+v", e)
				}
				switch {
				case e.Ph == "X" && e.Cat == "session":
					sessions[[2]int{e.Pid, e.Tid}] = e
				case e.Ph == "b":
					begins[e.ID] = e
				case e.Ph == "e":
					bg, ok := begins[e.ID]
					if !ok || bg.Name != e.Name || e.Ts < bg.Ts {
						t.Errorf("op end %+v without a matching begin (%+v)", e, bg)
					}
					delete(begins, e.ID)
				}
			}
			if len(begins) != 0 {
				t.Errorf("%d op slices never end", len(begins))
			}
			n := func(ph, cat string) int {
				c := 0
				for _, e := range doc.TraceEvents {
					if e.Ph == ph && e.Cat == cat {
						c++
					}
				}
				return c
			}
			checks := []struct {
				what      string
				got, want int
			}{
				{"process_name", count["M process_name"], 1},
				{"thread_name", count["M thread_name"], len(res.Sessions) + len(res.Tables)},
				{"session slices", n("X", "session"), len(res.Sessions)},
				{"instants", n("i", "timeout") + n("i", "peer") + n("i", "worker") + n("i", "local"), res.Steps},
				{"op begins", n("b", "op"), submits},
				{"op ends", n("e", "op"), submits},
				{"events", len(doc.TraceEvents), st.Events},
				{"stats.Sessions", st.Sessions, len(res.Sessions)},
				{"stats.Instants", st.Instants, res.Steps},
				{"stats.Ops", st.Ops, submits},
				{"stats.States", st.States, n("X", "state")},
				{"table call instants", n("i", "table"), res.Calls},
				{"stats.Tables", st.Tables, len(res.Tables)},
				{"stats.Calls", st.Calls, res.Calls},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
				}
			}
			for _, e := range doc.TraceEvents {
				if e.Ph != "X" || e.Cat != "state" {
					continue
				}
				s, ok := sessions[[2]int{e.Pid, e.Tid}]
				if !ok || e.Ts < s.Ts || e.Ts+*e.Dur > s.Ts+*s.Dur+1e-3 {
					t.Errorf("state slice %+v not inside its session slice %+v", e, s)
				}
			}
			if strings.Contains(path, "ctx") && submits == 0 {
				t.Error("the context trace submitted no op")
			}
			if len(res.Tables) == 0 || res.Calls == 0 {
				t.Errorf("no parent or worker steps to export: %d tables, %d calls", len(res.Tables), res.Calls)
			}
			// Every admitted op is on its worker's track, named.
			admits := 0
			for _, e := range doc.TraceEvents {
				if e.Ph == "i" && e.Cat == "table" && strings.HasPrefix(e.Name, "Admit ") {
					admits++
					if !strings.Contains(e.Name, "/peer") {
						t.Errorf("worker instant %q does not name its op", e.Name)
					}
				}
			}
			if strings.Contains(path, "ctx") && admits != submits {
				t.Errorf("%d Admit instants on the workers' tracks, %d ops submitted", admits, submits)
			}
			t.Logf("%s: %d events: %+v", filepath.Base(path), len(doc.TraceEvents), st)
		})
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func TestExportPerfettoMalformed(t *testing.T) {
	var out bytes.Buffer
	if _, err := trace.ExportPerfetto(strings.NewReader("nope\n"), &out); err == nil {
		t.Fatal("export of a non-trace succeeded")
	}
}

// TestExportPerfettoFileKeepsItsInput: an output that names the input (the
// same path, or a link to it) is refused before anything is written, and a
// failed export leaves the output as it was, with no partial file beside
// it. Before, os.Create truncated the input to 0 bytes first, and a failed
// export left an empty or partial output.
func TestExportPerfettoFileKeepsItsInput(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "g.trace")
	body := []byte("nope\n")
	if err := os.WriteFile(in, body, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink("g.trace", link); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{in, link, filepath.Join(dir, ".", "g.trace")} {
		if _, err := trace.ExportPerfettoFile(in, out); !errors.Is(err, trace.ErrSameFile) {
			t.Errorf("export %s to %s: %v, want ErrSameFile", in, out, err)
		}
		if b, err := os.ReadFile(in); err != nil || !bytes.Equal(b, body) {
			t.Fatalf("after export to %s the input holds %q (%v), want %q", out, b, err, body)
		}
	}
	// A failed export (the input is no trace) keeps an existing output and
	// leaves nothing else behind.
	prev := filepath.Join(dir, "prev.json")
	if err := os.WriteFile(prev, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := trace.ExportPerfettoFile(in, prev); err == nil {
		t.Fatal("export of a non-trace succeeded")
	}
	if b, err := os.ReadFile(prev); err != nil || string(b) != "{}" {
		t.Errorf("a failed export changed the existing output: %q (%v)", b, err)
	}
	fresh := filepath.Join(dir, "fresh.json")
	if _, err := trace.ExportPerfettoFile(in, fresh); err == nil {
		t.Fatal("export of a non-trace succeeded")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"g.trace", "link.json", "prev.json"}; !slices.Equal(names, want) {
		t.Errorf("after failed exports the directory holds %q, want %q", names, want)
	}
}

// TestExportPerfettoNamesItsStart: an export says the wall-clock time its
// timestamps count from (the trace header's), so that the exports of a
// run's two processes, and its logs, can be lined up: each export's ts
// counts from its own trace's start.
func TestExportPerfettoNamesItsStart(t *testing.T) {
	for _, path := range []string{"testdata/v2-ctx.jsonl", "testdata/v2-gen.jsonl"} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		hdr, err := trace.NewReader(f).Next()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		f, err = os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		_, err = trace.ExportPerfetto(f, &out)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			OtherData struct {
				Start   string `json:"trace_start"`
				StartNS int64  `json:"trace_start_ns"`
			} `json:"otherData"`
		}
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatalf("%s: not JSON: %v", path, err)
		}
		want := time.Unix(0, hdr.T).UTC().Format(time.RFC3339Nano)
		if doc.OtherData.StartNS != hdr.T || doc.OtherData.Start != want {
			t.Errorf("%s: otherData trace_start %q (%d ns), want %q (%d ns), the header's time", path,
				doc.OtherData.Start, doc.OtherData.StartNS, want, hdr.T)
		}
	}
}
