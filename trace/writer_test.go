package trace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// rxConfig is a one-writer generation session.
func rxConfig(id string) actors.RxConfig {
	return actors.RxConfig{Request: id, Epoch: 7, Self: gen0, Deadline: at.Add(time.Second),
		Writers: []actors.RxWriter{{Peer: ctx1, Worker: 1, Bytes: 4096, Request: &messages.RequestData{RequestID: id, Epoch: 7, From: gen0}}}}
}

// driveRx runs an RxSession the way its shell does — birth, then for each
// message Record, Step, Stepped (or, when the step panics, StepPanicked)
// — and returns how many steps panicked.
func driveRx(tr actors.Tracer, actor string, cfg actors.RxConfig, msgs ...any) (panics int) {
	s := actors.NewRxSession(cfg)
	st := tr.Session(actor, actors.Birth{Engine: gen0, At: at, Rx: &cfg})
	st.Stepped(s, nil)
	for i, m := range msgs {
		now := at.Add(time.Duration(i+1) * time.Millisecond)
		st.Record(m, now)
		func() {
			defer func() {
				if r := recover(); r != nil {
					panics++
					if p, ok := st.(interface{ StepPanicked(any) }); ok {
						p.StepPanicked(r)
					}
				}
			}()
			eff := s.Step(m, now)
			st.Stepped(s, eff)
		}()
	}
	return panics
}

func success(id string) actors.RxFrame {
	return actors.RxFrame{Writer: 0, Frame: &messages.Result{RequestID: id, Epoch: 7, From: ctx1, Status: messages.StatusSuccess, Bytes: 4096}}
}

func replayBytes(t *testing.T, b []byte) *Result {
	t.Helper()
	res, err := Replay(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, b)
	}
	return res
}

// TestWriterConcurrent: many sessions record at once (run with -race);
// every line is whole and the trace replays identically.
func TestWriterConcurrent(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, WithBufferSize(512)) // small: many flushes under contention
	w.Engine(actors.EngineInfo{Self: gen0, Workers: 2})
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("r%d", i)
			var msgs []any
			switch i % 3 {
			case 0:
				msgs = []any{actors.RxBegin{}, success(id)}
			case 1:
				msgs = []any{actors.RxBegin{}, actors.RxCancel{}, actors.RxFrame{Writer: 0, Frame: &messages.CancelAck{RequestID: id, Epoch: 7, From: ctx1}}}
			case 2:
				msgs = []any{actors.RxBegin{}, actors.RxTimeout{}, actors.RxPeerGone{Writer: 0, Err: errors.New("gone")}, success(id)}
			}
			driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(id), msgs...)
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res := replayBytes(t, buf.Bytes())
	if !res.Identical() || len(res.Sessions) != n || res.Births != n || res.Matched != res.Births+res.Steps {
		t.Fatalf("%+v", res)
	}
	for _, s := range res.Sessions {
		want := map[int]string{0: "READY", 1: "CANCELLED", 2: "TIMED_OUT"}
		var i int
		_, _ = fmt.Sscanf(s.Request, "r%d", &i)
		if s.State != want[i%3] || !s.Stopped {
			t.Errorf("%s: %s stopped=%t, want %s", s.Request, s.State, s.Stopped, want[i%3])
		}
	}
	if st := w.Stats(); st.Records != int64(res.Records) || st.Dropped != 0 {
		t.Errorf("stats %+v, replay read %d records", st, res.Records)
	}
}

// TestWriterPanickingStep: a step that panics is recorded without a
// digest, and replay reproduces the panic.
func TestWriterPanickingStep(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	cfg := rxConfig("p")
	// A typed-nil Result makes RxSession.Step panic; the shell then steps
	// RxPanic.
	panics := driveRx(w, "gen/0/$1/$2", cfg, actors.RxBegin{}, actors.RxFrame{Writer: 0, Frame: (*messages.Result)(nil)},
		actors.RxPanic{Err: errors.New("restarted after panic")})
	if panics != 1 {
		t.Fatalf("%d panics, want 1", panics)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"panic":true`) {
		t.Fatalf("no panic record:\n%s", buf.String())
	}
	res := replayBytes(t, buf.Bytes())
	if !res.Identical() || res.Steps != 3 || res.Sessions[0].State != "FAILED" {
		t.Fatalf("%+v %+v", res, res.Divergence)
	}
}

// TestWriterLastStepThatPanicked: a session whose last step panics (no
// step after it, the process may die of it) has that step in its trace
// file, marked and naming the panic, before anything else is written or
// the trace closed; replay panics there too and says so, not a
// divergence. (Checked to fail: the step was written only when a next
// step came, so the file ended at the step before it.)
func TestWriterLastStepThatPanicked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gen.trace")
	w, err := Create(path, WithFlushEvery(0))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A typed-nil Result makes RxSession.Step panic.
	if n := driveRx(w, "gen/0/$1/$2", rxConfig("p"), actors.RxBegin{}, actors.RxFrame{Writer: 0, Frame: (*messages.Result)(nil)}); n != 1 {
		t.Fatalf("%d panics, want 1", n)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"seq":2,`) || !strings.Contains(string(b), `"panic":true,"panic_value":"runtime error: invalid memory address`) {
		t.Fatalf("the file holds no record of the step that panicked (seq 2, marked, naming the panic):\n%s", b)
	}
	res, err := ReplayFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Identical() || res.Steps != 2 || !res.Unclosed || len(res.Panics) != 1 {
		t.Fatalf("replay: %+v %+v; want 2 steps identical, the last one's panic reproduced", res, res.Divergence)
	}
	if p := res.Panics[0]; p.Actor != "gen/0/$1/$2" || p.Seq != 2 || p.Type != "RxFrame" || p.Recorded == "" || p.Got != p.Recorded {
		t.Fatalf("replay's panic %+v: want seq 2's RxFrame, panicking as recorded", p)
	}
	var out strings.Builder
	res.Print(&out)
	if !strings.Contains(out.String(), "note: 1 step panicked in replay as recorded") || !strings.Contains(out.String(), "seq 2 RxFrame panicked with \"runtime error") {
		t.Fatalf("Print does not say that the step panicked:\n%s", out.String())
	}
}

func TestWriterMaxBytes(t *testing.T) {
	var buf bytes.Buffer
	var stops []Stop
	w := NewWriter(&buf, WithMaxBytes(2000), WithOnStop(func(s Stop) { stops = append(stops, s) }))
	for i := range 10 {
		driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(fmt.Sprint(i)), actors.RxBegin{}, success(fmt.Sprint(i)))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if !st.Truncated || st.Dropped == 0 || st.Bytes > 2000 {
		t.Fatalf("stats %+v", st)
	}
	if len(stops) != 1 || !stops[0].Truncated || stops[0].MaxBytes != 2000 || !strings.Contains(stops[0].Error(), "2000 bytes") {
		t.Fatalf("OnStop calls %+v, want one naming the 2000-byte bound", stops)
	}
	res := replayBytes(t, buf.Bytes())
	if !res.Truncated || !res.Identical() {
		t.Fatalf("%+v", res)
	}
	var out strings.Builder
	res.Print(&out)
	if !strings.Contains(out.String(), "truncated") {
		t.Errorf("print does not say the trace was truncated:\n%s", out.String())
	}
}

// TestWriterMaxBytesBelowHeader: a bound smaller than the header line
// still leaves a trace that reads: the header, then the truncation. It
// was dropped like any record past the bound, and the trace began with
// its "truncated" record, which no reader takes.
func TestWriterMaxBytesBelowHeader(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, WithMaxBytes(10))
	driveRx(w, "gen/0/$1/$1", rxConfig("r"), actors.RxBegin{})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := Replay(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("replay of a trace bounded below its header's size: %v\n%s", err, buf.String())
	}
	if !res.Truncated || res.Births != 0 {
		t.Fatalf("a trace bounded below its header's size: %+v, want truncated with no session", res)
	}
}

func TestWriterClosed(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	n := buf.Len()
	driveRx(w, "gen/0/$1/$2", rxConfig("late"), actors.RxBegin{})
	w.Record("x", actors.RxBegin{}, at)
	if buf.Len() != n || w.Stats().Dropped != 3 {
		t.Fatalf("wrote after Close: %d → %d bytes, stats %+v", n, buf.Len(), w.Stats())
	}
	if err := w.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriterError(t *testing.T) {
	var stops []Stop
	w := NewWriter(failingWriter{}, WithBufferSize(16), WithOnStop(func(s Stop) { stops = append(stops, s) }))
	driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{})
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Close: %v, want the write error", err)
	}
	if len(stops) != 1 || stops[0].Truncated || !strings.Contains(stops[0].Error(), "disk full") {
		t.Fatalf("OnStop calls %+v, want one naming the write error", stops)
	}
}

// plain is a Recorder that is not a Tracer.
type plain struct {
	mu   sync.Mutex
	msgs []string
}

func (p *plain) Record(actor string, msg any, _ time.Time) {
	p.mu.Lock()
	p.msgs = append(p.msgs, fmt.Sprintf("%s %T", actor, msg))
	p.mu.Unlock()
}

func TestTee(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	p := &plain{}
	tr := Tee(w, p)
	driveRx(tr, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, success("r"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("gen/0/$1/$2 %T", actors.RxBegin{}), fmt.Sprintf("gen/0/$1/$2 %T", actors.RxFrame{})}
	if fmt.Sprint(p.msgs) != fmt.Sprint(want) {
		t.Fatalf("plain recorder got %v, want %v", p.msgs, want)
	}
	if res := replayBytes(t, buf.Bytes()); !res.Identical() || res.Steps != 2 {
		t.Fatalf("%+v", res)
	}
	if Tee(w, nil) != actors.Tracer(w) {
		t.Fatal("Tee with no recorder should be the tracer itself")
	}
}

// TestReplayPlainRecords: records from Writer.Record (no birth) are
// skipped, not replayed.
func TestReplayPlainRecords(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Record("sim/ctx", actors.TxTimeout{Kind: actors.TimerDeadline}, at)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res := replayBytes(t, buf.Bytes())
	if res.Skipped != 1 || !res.Identical() {
		t.Fatalf("%+v", res)
	}
}

// TestCreateFlushesPeriodically: a trace file fills while the engine runs,
// so that a process killed before it closes its engine leaves the trace up
// to its last flush (an empty file before: everything sat in the buffer).
func TestCreateFlushesPeriodically(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.trace")
	w, err := Create(path, WithFlushEvery(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, err := os.Stat(path); err == nil && st.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the trace file is still empty 10 s after its header was written: nothing flushes it before Close")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Replay(mustOpen(t, path)); err != nil {
		t.Fatalf("replay of the flushed trace: %v", err)
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestTraceEndRecord: Close ends a trace with an "end" record, so that a
// trace cut on a line boundary (its process killed between flushes, the
// common case: a flush writes whole lines) is told from a whole one; a
// trace of a version before the end record is not called cut; a record
// after the end (two writers of one file) is refused.
func TestTraceEndRecord(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, success("r"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(buf.String(), "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, `{"kind":"end"`) || !strings.Contains(last, `"records":`) {
		t.Fatalf("a closed trace's last line is %q, want its end record", last)
	}
	res := replayBytes(t, buf.Bytes())
	if res.Unclosed || !res.Identical() || res.Steps != 2 {
		t.Fatalf("a closed trace: %+v", res)
	}
	cut := strings.Join(lines[:len(lines)-1], "")
	res = replayBytes(t, []byte(cut))
	if !res.Unclosed || !res.Identical() || res.Steps != 2 || res.TornLine != 0 {
		t.Fatalf("a trace cut before its end record: %+v, want unclosed, its steps replayed", res)
	}
	var out strings.Builder
	res.Print(&out)
	if !strings.Contains(out.String(), "not closed") {
		t.Errorf("replay's report does not say the trace was not closed:\n%s", out.String())
	}
	if st, err := ExportPerfetto(strings.NewReader(cut), io.Discard); err != nil || !st.Unclosed {
		t.Errorf("export of a cut trace: unclosed %t, %v; want unclosed", st.Unclosed, err)
	}
	if st, err := ExportPerfetto(bytes.NewReader(buf.Bytes()), io.Discard); err != nil || st.Unclosed {
		t.Errorf("export of a closed trace: unclosed %t, %v; want closed", st.Unclosed, err)
	}

	// A version 2 trace has no end record and is not called cut.
	v2, err := os.ReadFile("testdata/v2-ctx.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if res := replayBytes(t, v2); res.Unclosed {
		t.Errorf("a version 2 trace is reported unclosed")
	}

	// A record after the end record: two writers wrote the file.
	if _, err := Replay(strings.NewReader(buf.String() + lines[1])); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "two writers") {
		t.Errorf("a record after the end record: %v, want ErrFormat naming two writers", err)
	}
}

// TestCreateMovesAnEarlierTraceAside: an engine restarted with the same
// TracePath (or a second run with the same --trace) truncated the trace
// of the run before it, the one a user wants to debug. Create now moves
// it, and its rotated files, aside to a name it returns (MovedAside), a
// new one each time. (Checked to fail: Create truncated it.)
func TestCreateMovesAnEarlierTraceAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gen.trace")
	clock := func() time.Time { return at }
	record := func(opts ...Option) *Writer {
		t.Helper()
		w, err := Create(path, append([]Option{WithFlushEvery(0), WithClock(clock)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, success("r"))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return w
	}
	replays := func(name string) {
		t.Helper()
		res, err := ReplayFile(name)
		if err != nil || !res.Identical() || res.Steps != 2 {
			t.Fatalf("the earlier trace, at %q: %+v, %v; want its 2 steps replayed", name, res, err)
		}
	}
	if w := record(); w.MovedAside() != "" {
		t.Fatalf("a first trace moved %q aside, want nothing", w.MovedAside())
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	w := record()
	want := path + ".prev-" + at.UTC().Format("20060102T150405Z")
	if got := w.MovedAside(); got != want {
		t.Fatalf("the second Create moved the first trace to %q, want %q", got, want)
	}
	if b, err := os.ReadFile(want); err != nil || !bytes.Equal(b, first) {
		t.Fatalf("%s: %d bytes, %v; want the first trace's %d", want, len(b), err, len(first))
	}
	replays(want)
	replays(path)

	// The same second again: a name of its own, the one before kept.
	if w := record(); w.MovedAside() != want+"-2" {
		t.Fatalf("a third Create in the same second moved %q, want %q", w.MovedAside(), want+"-2")
	}
	replays(want)
	replays(want + "-2")

	// A rotated trace moves with its parts, which keep their numbers.
	record(WithMaxBytes(400), WithRotate(1))
	if _, err := os.Stat(rotated(path, 1)); err != nil {
		t.Fatalf("the rotated run left no %s: %v", filepath.Base(rotated(path, 1)), err)
	}
	part1, err := os.ReadFile(rotated(path, 1))
	if err != nil {
		t.Fatal(err)
	}
	w = record()
	if got := w.MovedAside(); got != want+"-4" {
		t.Fatalf("the rotated trace moved to %q, want %q", got, want+"-4")
	}
	if b, err := os.ReadFile(rotated(want+"-4", 1)); err != nil || !bytes.Equal(b, part1) {
		t.Fatalf("%s: %d bytes, %v; want the rotated part's %d", rotated(want+"-4", 1), len(b), err, len(part1))
	}
	if _, err := os.Stat(rotated(path, 1)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is still there after the move: %v", filepath.Base(rotated(path, 1)), err)
	}
}

// TestCreateKeepsTheNewestEarlierRuns: a process restarted in a loop with
// one trace path kept every earlier run's trace (path.prev-<UTC time>, its
// parts with it) until its disk filled. Create keeps the newest
// DefaultKeepPrevious of them, by the time and -N in their names, removes
// the older ones with their parts, always keeps the one it just moved
// (even when the clock stepped back), and leaves every other name.
// (Checked to fail: every earlier run was kept.)
func TestCreateKeepsTheNewestEarlierRuns(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gen.trace")
	others := []string{"gen.trace.prev-notes.txt", "gen.trace.prev-20200101T000000Z.bak", "gen.trace.prev-20200101T000000Z-1",
		"gen.trace.prev-20200101T000000Z.01", "gen.trace.prevx-20200101T000000Z", "other.trace.prev-20200101T000000Z"}
	for _, n := range others {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("not an earlier run's trace of gen.trace\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	now := t0
	var moved []string // each run's MovedAside, oldest first
	run := func(at time.Time, opts ...Option) {
		t.Helper()
		now = at
		w, err := Create(path, append([]Option{WithFlushEvery(0), WithClock(func() time.Time { return now })}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, success("r"))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.NotPruned(); err != nil {
			t.Fatalf("NotPruned: %v", err)
		}
		if w.MovedAside() != "" {
			moved = append(moved, w.MovedAside())
		}
	}
	// kept checks that the newest DefaultKeepPrevious sets moved are
	// there (the set rotated is the 4th moved, with its part), and none
	// older.
	kept := func(want ...int) {
		t.Helper()
		for i, m := range moved {
			keep := slices.Contains(want, i)
			names := []string{m}
			if i == 3 {
				names = append(names, m+".1")
			}
			for _, n := range names {
				_, err := os.Stat(n)
				if there := err == nil; there != keep {
					ents, _ := os.ReadDir(dir)
					t.Fatalf("after %d runs moved aside, %s there %v, want %v (runs %v kept): the directory holds %v", len(moved), filepath.Base(n), there, keep, want, ents)
				}
			}
		}
	}
	run(t0)
	run(t0.Add(time.Minute))
	run(t0.Add(time.Minute)) // the same second: -2
	run(t0.Add(2*time.Minute), WithMaxBytes(400), WithRotate(1))
	run(t0.Add(3 * time.Minute))
	if want := path + ".prev-20261207T150100Z-2"; moved[1] != want {
		t.Fatalf("moved aside to %q, want %q", moved[1], want)
	}
	kept(0, 1, 2, 3)
	run(t0.Add(4 * time.Minute))
	kept(1, 2, 3, 4) // the oldest removed
	for i := 5; i <= 7; i++ {
		run(t0.Add(time.Duration(i) * time.Minute))
	}
	kept(4, 5, 6, 7) // the rotated one removed with its part
	// A clock stepped back: the trace moved aside now has the oldest
	// name, and is kept all the same.
	run(t0)
	kept(5, 6, 7, 8)
	for _, n := range others {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Fatalf("%s, of another name, was removed: %v", n, err)
		}
	}
}

// TestCreateKeepPrevious: WithKeepPrevious sets how many earlier runs'
// traces Create keeps (1 or more, named when refused), and a removal that
// fails leaves the file, writes the trace all the same and says why
// (NotPruned), naming the file.
func TestCreateKeepPrevious(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gen.trace")
	if _, err := Create(path, WithKeepPrevious(0)); err == nil || !strings.Contains(err.Error(), "keep 0 earlier runs' traces") {
		t.Fatalf("WithKeepPrevious(0): %v, want refused naming 0", err)
	}
	now := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	run := func(opts ...Option) *Writer {
		t.Helper()
		now = now.Add(time.Minute)
		w, err := Create(path, append([]Option{WithFlushEvery(0), WithClock(func() time.Time { return now })}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, success("r"))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return w
	}
	run()
	first := run(WithKeepPrevious(1)).MovedAside()
	second := run(WithKeepPrevious(1)).MovedAside()
	if _, err := os.Stat(first); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("keeping 1: the earlier %s is still there (%v)", filepath.Base(first), err)
	}
	refused := errors.New("operation not permitted (the test's)")
	prev := remove
	remove = func(name string) error { return &os.PathError{Op: "remove", Path: name, Err: refused} }
	t.Cleanup(func() { remove = prev })
	w := run(WithKeepPrevious(1))
	if err := w.NotPruned(); !errors.Is(err, refused) || !strings.Contains(err.Error(), second) {
		t.Fatalf("NotPruned: %v, want the removal's error naming %s", err, second)
	}
	if _, err := os.Stat(second); err != nil {
		t.Fatalf("%s, which could not be removed: %v", filepath.Base(second), err)
	}
	if res, err := ReplayFile(path); err != nil || res.Steps != 2 {
		t.Fatalf("the trace written all the same: %+v, %v", res, err)
	}
}

// TestCreateMovesEveryEarlierPartAside: an earlier run's rotated file
// that does not begin as a trace (its header never reached the disk: the
// machine stopped just after a rotation) or is missing (the process was
// killed inside a rotation's renames) stopped the move there, and Create
// then removed the earlier run's path.2 … path.keep after it.
func TestCreateMovesEveryEarlierPartAside(t *testing.T) {
	for name, part1 := range map[string][]byte{"torn": make([]byte, 64), "missing": nil} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ctx.trace")
			head := []byte(`{"kind":"trace","v":1}` + "\n")
			for _, n := range []string{path, path + ".2", path + ".3"} {
				if err := os.WriteFile(n, head, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if part1 != nil {
				if err := os.WriteFile(path+".1", part1, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			w, err := Create(path, WithRotate(3), WithFlushEvery(0))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			for _, n := range []string{".2", ".3"} {
				if b, err := os.ReadFile(w.MovedAside() + n); err != nil || !bytes.Equal(b, head) {
					ents, _ := os.ReadDir(dir)
					t.Errorf("the earlier run's %s%s is not at %s%s (%v): the directory holds %v", path, n, w.MovedAside(), n, err, ents)
				}
			}
		})
	}
}

// TestCreateThroughALinkOrUnmovable: a trace path that is a symbolic link
// keeps its link (the target is moved aside beside it and started again,
// not the link replaced by a file); a file that cannot be renamed (bound
// into a container alone, a directory the process may not write) is
// truncated, as before traces were moved aside, and NotMovedAside says
// why. (Checked to fail: the link became a regular file; Create failed
// on the rename.)
func TestCreateThroughALinkOrUnmovable(t *testing.T) {
	at := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }
	record := func(path string) *Writer {
		t.Helper()
		w, err := Create(path, WithFlushEvery(0), WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, success("r"))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return w
	}
	t.Run("link", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "real.trace")
		link := filepath.Join(dir, "gen.trace")
		if err := os.WriteFile(target, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		record(link)
		w := record(link)
		if want := target + ".prev-" + at.Format("20060102T150405Z"); w.MovedAside() != want {
			t.Fatalf("moved aside to %q, want %q (the link's target, beside it)", w.MovedAside(), want)
		}
		if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("%s is no longer a link: %v, %v", link, fi, err)
		}
		if res, err := ReplayFile(link); err != nil || res.Steps != 2 {
			t.Fatalf("the new trace through the link: %+v, %v", res, err)
		}
	})
	t.Run("unmovable", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "gen.trace")
		record(path)
		refused := errors.New("device or resource busy (the test's)")
		prev := rename
		rename = func(old, new string) error { return &os.LinkError{Op: "rename", Old: old, New: new, Err: refused} }
		t.Cleanup(func() { rename = prev })
		w := record(path)
		if w.MovedAside() != "" || !errors.Is(w.NotMovedAside(), refused) {
			t.Fatalf("MovedAside %q, NotMovedAside %v; want nothing moved and the rename's error", w.MovedAside(), w.NotMovedAside())
		}
		if res, err := ReplayFile(path); err != nil || res.Steps != 2 {
			t.Fatalf("the new trace, over the truncated one: %+v, %v", res, err)
		}
	})
}
