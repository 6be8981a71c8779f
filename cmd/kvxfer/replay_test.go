package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// recordTransfer runs one request between two traced in-process engines
// and returns their trace files.
func recordTransfer(t *testing.T) (ctxTrace, genTrace string) {
	t.Helper()
	dir := t.TempDir()
	l := kvcache.Layout{Name: "test", Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(2)}
	link := control.NewMemLink()
	ctxTrace, genTrace = filepath.Join(dir, "ctx.jsonl"), filepath.Join(dir, "gen.jsonl")
	start := func(inst, path string) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 1 << 20,
			Workers: 1, Link: link, TransferTimeout: 10 * time.Second, TracePath: path})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	ce, ge := start("ctx", ctxTrace), start("gen", genTrace)
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r1", PromptLen: 40, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	src, err := ce.Pools().Alloc([]int{3})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "r1", PromptLen: 40})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []kvcache.Chunk{{Start: 0, End: 32, FirstBlock: 0}, {Start: 32, End: 40, FirstBlock: 2, Last: true}} {
		b0, b1 := c.Blocks(16)
		if err := tx.Chunk(c, []kvcache.BlockRun{{First: b0, IDs: src[0][b0:b1]}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, ch := range []<-chan kvxfer.Outcome{tx.Done(), rx.Done()} {
		select {
		case o := <-ch:
			if !o.OK {
				t.Fatalf("%s: %v", o.Status, o.Err)
			}
			if o.Blocks != nil {
				_ = ge.FreeBlocks(o.Blocks)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no outcome")
		}
	}
	_ = ce.Pools().Free(src)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range []*kvxfer.Engine{ce, ge} {
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return ctxTrace, genTrace
}

func TestReplayCmd(t *testing.T) {
	ctxTrace, genTrace := recordTransfer(t)
	out, err := run("replay", ctxTrace, genTrace)
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	if strings.Count(out, "identical: 1 session") != 2 || !strings.Contains(out, "DONE") || !strings.Contains(out, "READY") {
		t.Fatalf("replay output:\n%s", out)
	}

	out, err = run("replay", "--json", ctxTrace)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Trace    string `json:"trace"`
		Steps    int    `json:"steps"`
		Matched  int    `json:"matched"`
		Sessions []struct {
			State string `json:"state"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Trace != ctxTrace || res.Steps == 0 ||
		len(res.Sessions) != 1 || res.Sessions[0].State != "DONE" {
		t.Fatalf("replay --json: %v\n%s", err, out)
	}

	// Corrupt the generation side's result: replay fails and names the
	// step. Its number is read from the trace: the Result may reach the
	// session before or after the RxSent for its RequestData (the send's
	// completion and the peer's answer travel on different paths).
	b, err := os.ReadFile(genTrace)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, editLine(t, b, `"type":"RxFrame"`, `"Status":1`, `"Status":2`), 0o644); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("seq      %d", seqOfLine(t, b, `"type":"RxFrame"`, `"Status":1`))
	out, err = run("replay", bad)
	if err == nil || !strings.Contains(out, "DIVERGED") || !strings.Contains(out, "RxFrame") || !strings.Contains(out, want) {
		t.Fatalf("replay of a corrupted trace: no %q: %v\n%s", want, err, out)
	}

	// Make the Result the rx parent routed come from a peer that is not
	// the request's writer: replay fails at that parent step and names
	// it, with what it decided then and now.
	if err := os.WriteFile(bad, editLine(t, b, `"type":"Route"`, `"From":{"Instance":"ctx","Rank":0}`, `"From":{"Instance":"ctx","Rank":5}`), 0o644); err != nil {
		t.Fatal(err)
	}
	route := fmt.Sprintf("seq      %d (Route)", seqOfLine(t, b, `"type":"Route"`, `"From":{"Instance":"ctx","Rank":0}`))
	out, err = run("replay", bad)
	for _, s := range []string{"DIVERGED", "gen/0/rx (RxTable)", route, "out.Verdict", "expected 1 (deliver)", "got      3 (not a writer)", `"Rank":5`, "DIVERGED: 1 of 6 actors (1 session, 5 tables)"} {
		if err == nil || !strings.Contains(out, s) {
			t.Fatalf("replay of a trace with an edited parent step: no %q: %v\n%s", s, err, out)
		}
	}

	if _, err := run("replay"); err == nil {
		t.Fatal("replay without a trace succeeded")
	}
	if _, err := run("replay", filepath.Join(t.TempDir(), "missing.jsonl")); err == nil {
		t.Fatal("replay of a missing file succeeded")
	}
}

func TestTraceExportCmd(t *testing.T) {
	ctxTrace, _ := recordTransfer(t)
	dst := filepath.Join(t.TempDir(), "timeline.json")
	out, err := run("trace", "export", "--perfetto", ctxTrace, dst)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.TraceEvents) == 0 {
		t.Fatalf("timeline: %v\n%s", err, b)
	}
	if !strings.Contains(out, "1 sessions") || !strings.Contains(out, "op slices") {
		t.Fatalf("export output: %s", out)
	}
	// The parents' and workers' steps are on tracks of their own.
	tables := 0
	for _, e := range doc.TraceEvents {
		if e["cat"] == "table" {
			tables++
		}
	}
	if tables == 0 || strings.Contains(out, " 0 table calls") {
		t.Fatalf("export shows no parent or worker step (%d table events): %s", tables, out)
	}
	if _, err := run("trace", "export", ctxTrace, dst); err == nil || !strings.Contains(err.Error(), "--perfetto") {
		t.Fatalf("export without a format: %v", err)
	}
	// An output that is the input is refused and the trace kept.
	before, err := os.ReadFile(ctxTrace)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run("trace", "export", "--perfetto", ctxTrace, ctxTrace); err == nil || !strings.Contains(err.Error(), "the output is the input") {
		t.Fatalf("export onto its own input: %v, want it refused", err)
	}
	if after, err := os.ReadFile(ctxTrace); err != nil || string(after) != string(before) {
		t.Fatalf("export onto its own input changed it: %d bytes, were %d (%v)", len(after), len(before), err)
	}
}

// seqOfLine returns the seq of the first trace line that editLine would
// edit.
func seqOfLine(t *testing.T, trace []byte, pick, old string) int {
	t.Helper()
	for _, l := range strings.Split(string(trace), "\n") {
		if strings.Contains(l, pick) && strings.Contains(l, old) {
			var rec struct {
				Seq int `json:"seq"`
			}
			if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Seq == 0 {
				t.Fatalf("no seq in trace line %s: %v", l, err)
			}
			return rec.Seq
		}
	}
	t.Fatalf("no line with %s and %s in the trace", pick, old)
	return 0
}

// editLine replaces old by new in the first line of trace that contains
// pick (and old).
func editLine(t *testing.T, trace []byte, pick, old, new string) []byte {
	t.Helper()
	lines := strings.SplitAfter(string(trace), "\n")
	for i, l := range lines {
		if strings.Contains(l, pick) && strings.Contains(l, old) {
			lines[i] = strings.Replace(l, old, new, 1)
			return []byte(strings.Join(lines, ""))
		}
	}
	t.Fatalf("no line with %s and %s in the trace", pick, old)
	return nil
}

// TestReplayEachTrace: replay reports every trace it is given, also after
// one it cannot read, and exits non-zero; with --json one object each, an
// unreadable trace's with "error". Before, the first bad file stopped the
// run and --json printed nothing.
func TestReplayEachTrace(t *testing.T) {
	ctxTrace, genTrace := recordTransfer(t)
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte("nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run("replay", "--json", bad, ctxTrace, genTrace)
	if err == nil || !strings.Contains(err.Error(), "failed on 1 of 3 traces") || !strings.Contains(err.Error(), "bad.jsonl") {
		t.Fatalf("replay --json with one bad trace: %v, want failed on 1 of 3 naming bad.jsonl\n%s", err, out)
	}
	objs := jsonObjects(t, out)
	if len(objs) != 3 {
		t.Fatalf("%d JSON objects, want 3:\n%s", len(objs), out)
	}
	if objs[0]["trace"] != bad || !strings.Contains(fmt.Sprint(objs[0]["error"]), "malformed") {
		t.Errorf("the bad trace's object %v: want its path and an error", objs[0])
	}
	for i, path := range []string{ctxTrace, genTrace} {
		if o := objs[i+1]; o["trace"] != path || o["error"] != nil || o["sessions"] == nil {
			t.Errorf("object %d %v: want %s replayed", i+1, o, path)
		}
	}
	out, err = run("replay", ctxTrace, bad, genTrace)
	if err == nil || strings.Count(out, "identical: ") != 2 || !strings.Contains(out, "FAILED: replay "+bad) {
		t.Fatalf("replay with a bad trace in the middle: %v, want both good ones replayed and the bad one named\n%s", err, out)
	}
}

// TestTraceUnknownSubcommand: `kvxfer trace bogus` is an error naming it,
// as `kvxfer bogus` is. Before, it printed the help and exited 0.
func TestTraceUnknownSubcommand(t *testing.T) {
	for _, args := range [][]string{{"bogus"}, {"trace", "bogus"}, {"bench", "bogus"}} {
		if out, err := run(args...); err == nil || !strings.Contains(err.Error(), `unknown command "bogus"`) {
			t.Errorf("kvxfer %s: %v, want unknown command\n%s", strings.Join(args, " "), err, out)
		}
	}
	if out, err := run("trace"); err != nil || !strings.Contains(out, "export") {
		t.Errorf("kvxfer trace: %v, want its help\n%s", err, out)
	}
}

// replay and trace export say what arguments they want, and export names
// its OUT when OUT's directory is not there. (Checked to fail without
// the Args functions and checkOutDir: the errors were cobra's "requires at
// least 1 arg(s), only received 0" and "accepts 2 arg(s), received 1",
// naming neither a trace nor OUT, and "export …: open
// …/missing/.out.json.NNN.tmp: no such file or directory", naming a
// temporary file instead of OUT.)
func TestReplayAndExportNameTheirArguments(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "ctx.trace")
	if err := os.WriteFile(trace, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay"}, "want one or more trace files to replay"},
		{[]string{"trace", "export", "--perfetto"}, "want a trace and the file to write, got 0 argument(s)"},
		{[]string{"trace", "export", "--perfetto", trace}, "want a trace and the file to write, got 1 argument(s)"},
		{[]string{"trace", "export", "--perfetto", trace, filepath.Join(missing, "out.json")},
			"cannot write " + filepath.Join(missing, "out.json") + ": directory " + missing + " does not exist"},
		{[]string{"trace", "export", "--perfetto", trace, filepath.Join(file, "out.json")},
			"cannot write " + filepath.Join(file, "out.json") + ": " + file + " is not a directory"},
	} {
		if _, err := run(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kvxfer %s: %v, want an error containing %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

// A directory given as a trace (kvxfer demo --trace DIR writes one file
// per engine and mode there) is named as a directory with its files, by
// replay and by trace export, and an export's OUT that is a directory is
// named too. (Checked to fail: without notADir replay said "malformed
// trace: after line 0: read DIR: is a directory", and without the OUT
// check export said "rename ./.DIR.N.tmp DIR: file exists".)
func TestTraceArgumentIsADirectory(t *testing.T) {
	dir := t.TempDir()
	traces := filepath.Join(dir, "traces")
	if err := os.Mkdir(traces, 0o755); err != nil {
		t.Fatal(err)
	}
	one := filepath.Join(traces, "ctx-pipelined.jsonl")
	// A trace's header alone: it exports (with a note), so that OUT's
	// check is what the last case meets.
	if err := os.WriteFile(one, []byte(`{"kind":"trace","version":4,"t":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := traces + " is a directory, not a trace file: name a trace file in it (" + one + ")"
	if _, err := run("replay", traces); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("replay DIR: %v, want %q", err, want)
	}
	if _, err := run("trace", "export", "--perfetto", traces, filepath.Join(dir, "out.json")); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("trace export DIR: %v, want %q", err, want)
	}
	if _, err := run("trace", "export", "--perfetto", one, traces); err == nil || !strings.Contains(err.Error(), "cannot write "+traces+": it is a directory") {
		t.Errorf("trace export TRACE DIR: %v, want it to name the directory", err)
	}
}

// An argument a command does not take is named with what was likely
// meant: a subcommand close to it (kvxfer bench smal: small), or, for a
// command that takes flags only, the flag (kvxfer gen insecure:
// --insecure), and not as an "unknown command" of a command that has
// none. (Checked to fail with cobra.NoArgs back: `unknown command "smal"
// for "kvxfer bench"` with no suggestion, `unknown command "insecure" for
// "kvxfer gen"`.)
func TestStrayArgumentNamesWhatWasMeant(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "smal"}, `unknown command "smal" for "kvxfer bench": did you mean small?`},
		{[]string{"trace", "exprot"}, `unknown command "exprot" for "kvxfer trace": did you mean export?`},
		{[]string{"gen", "insecure"}, `unexpected argument "insecure": kvxfer gen takes flags only: did you mean --insecure?`},
		{[]string{"demo", "procesess"}, `unexpected argument "procesess": kvxfer demo takes flags only: did you mean --processes?`},
		{[]string{"bench", "small", "extra"}, `unexpected argument "extra": kvxfer bench small takes flags only (kvxfer bench small --help lists its flags)`},
	} {
		if out, err := run(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kvxfer %s: %v, want %q\n%s", strings.Join(c.args, " "), err, c.want, out)
		}
	}
}

// TestReplayOneFailedTraceSaysItOnce: replay of a single trace it cannot
// read printed "FAILED: replay …" and cobra's "Error: replay …", one
// failure said twice. It is now said once, as the command's error.
// (Checked to fail: both were printed.)
func TestReplayOneFailedTraceSaysItOnce(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte("nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runApp(newApp(), "replay", bad)
	if err == nil || !strings.Contains(err.Error(), "replay "+bad) {
		t.Fatalf("replay of a bad trace: %v, want an error naming it", err)
	}
	if n := strings.Count(out+errOut, "replay "+bad+":"); n != 1 {
		t.Fatalf("the failure is said %d times, want once:\nstdout:\n%s\nstderr:\n%s", n, out, errOut)
	}
}
