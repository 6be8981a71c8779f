package trace

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
)

// rotatedFiles lists path.N … path.1, path (oldest first) as they are.
func rotatedFiles(t *testing.T, path string) []string {
	t.Helper()
	var files []string
	for i := 1; ; i++ {
		if _, err := os.Stat(rotated(path, i)); errors.Is(err, fs.ErrNotExist) {
			break
		}
		files = append([]string{rotated(path, i)}, files...)
	}
	return append(files, path)
}

// replayEach replays every file on its own: each must read (header,
// engine record, end record) and replay identically.
func replayEach(t *testing.T, files []string) []*Result {
	t.Helper()
	var out []*Result
	for _, f := range files {
		res, err := ReplayFile(f)
		if err != nil {
			b, _ := os.ReadFile(f)
			t.Fatalf("replay %s on its own: %v\n%s", filepath.Base(f), err, b)
		}
		if !res.Identical() || res.Unclosed || res.Truncated || res.Engines != 1 || res.Matched != res.Births+res.Steps {
			var b strings.Builder
			res.Print(&b)
			t.Fatalf("%s: %+v\n%s", filepath.Base(f), res, b.String())
		}
		out = append(out, res)
	}
	return out
}

// TestRotateKeepsTheNewestFiles: past its bound a Writer with WithRotate
// ends its file, shifts the old ones (path → path.1 → path.2) and starts
// a new path with the header and the engine record again; only keep old
// files stay, each replays on its own, and the files of an earlier run
// are removed at Create. Without rotation the trace stopped at its bound
// (one file, truncated).
func TestRotateKeepsTheNewestFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gen.jsonl")
	for _, stale := range []string{rotated(path, 1), rotated(path, 2), rotated(path, 3)} {
		if err := os.WriteFile(stale, []byte("an earlier run's file\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stops []Stop
	w, err := Create(path, WithMaxBytes(3000), WithRotate(2), WithFlushEvery(0), WithOnStop(func(s Stop) { stops = append(stops, s) }))
	if err != nil {
		t.Fatal(err)
	}
	for _, stale := range []string{rotated(path, 1), rotated(path, 2)} {
		if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Create left the earlier run's %s: %v", filepath.Base(stale), err)
		}
	}
	w.Engine(actors.EngineInfo{Self: gen0, Workers: 2})
	const n = 40
	for i := range n {
		id := fmt.Sprint(i)
		driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(id), actors.RxBegin{}, success(id))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if st.Rotations < 4 || st.Truncated || st.Dropped != 0 || len(stops) != 0 {
		t.Fatalf("stats %+v, stops %v: want 4 or more rotations, nothing dropped", st, stops)
	}
	// path.3 is beyond keep: an earlier run's file left as it was.
	if b, err := os.ReadFile(rotated(path, 3)); err != nil || string(b) != "an earlier run's file\n" {
		t.Fatalf("%s: %q %v", filepath.Base(rotated(path, 3)), b, err)
	}
	files := []string{rotated(path, 2), rotated(path, 1), path}
	births := 0
	for i, res := range replayEach(t, files) {
		if want := st.Rotations + 1 - (2 - i); res.Part != want {
			t.Errorf("%s: part %d, want %d", filepath.Base(files[i]), res.Part, want)
		}
		fi, err := os.Stat(files[i])
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 3000+200 { // the end record may pass the bound
			t.Errorf("%s: %d bytes, bound 3000", filepath.Base(files[i]), fi.Size())
		}
		births += res.Births
	}
	if births == 0 || births >= n {
		t.Fatalf("%d sessions in the kept files, want some but fewer than %d (the oldest files are deleted)", births, n)
	}
}

// TestRotateKeepsThePathLocked: a Create at a rotating Writer's path,
// made at each rename of the rotation (before it), is refused with
// ErrInUse as it is outside a rotation, and the rotated files stay one
// run's, each replaying on its own. (Checked to fail: the rotation closed
// the ended file, releasing its lock, before its renames; a Create then
// took the path and moved the run's files aside under the rotation.)
func TestRotateKeepsThePathLocked(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gen.jsonl")
	var stops []Stop
	w, err := Create(path, WithMaxBytes(2500), WithRotate(2), WithFlushEvery(0), WithOnStop(func(s Stop) { stops = append(stops, s) }))
	if err != nil {
		t.Fatal(err)
	}
	var tries []string
	inCreate := false
	prev := rename
	rename = func(old, new string) error {
		if !inCreate {
			inCreate = true
			w2, err := Create(path, WithFlushEvery(0))
			inCreate = false
			if err == nil {
				_ = w2.Close()
			}
			if !errors.Is(err, ErrInUse) {
				t.Errorf("Create during the rotation, before it renamed %s to %s: %v, want ErrInUse", filepath.Base(old), filepath.Base(new), err)
			}
			tries = append(tries, filepath.Base(old)+" to "+filepath.Base(new))
		}
		return prev(old, new)
	}
	t.Cleanup(func() { rename = prev })
	w.Engine(actors.EngineInfo{Self: gen0, Workers: 2})
	for i := range 20 {
		driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(fmt.Sprint(i)), actors.RxBegin{}, success(fmt.Sprint(i)))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rename = prev
	if st := w.Stats(); st.Rotations < 3 || len(stops) != 0 || len(tries) < 2*st.Rotations {
		t.Fatalf("stats %+v, stops %v, Creates tried before the renames %q: want 3 or more rotations, none stopped, a Create before each rename", st, stops, tries)
	}
	replayEach(t, rotatedFiles(t, path))
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"gen.jsonl", "gen.jsonl.1", "gen.jsonl.2"}; !slices.Equal(names, want) {
		t.Fatalf("the directory holds %q, want %q: the rotated run alone", names, want)
	}
}

// TestRotateWithoutHardLinks: where the file system has no hard links,
// the rotation renames the ended file, then the next one, and the run
// rotates and replays as well.
func TestRotateWithoutHardLinks(t *testing.T) {
	prev := link
	link = func(old, new string) error {
		return &os.LinkError{Op: "link", Old: old, New: new, Err: errors.ErrUnsupported}
	}
	t.Cleanup(func() { link = prev })
	path := filepath.Join(t.TempDir(), "gen.jsonl")
	w, err := Create(path, WithMaxBytes(2500), WithRotate(2), WithFlushEvery(0))
	if err != nil {
		t.Fatal(err)
	}
	w.Engine(actors.EngineInfo{Self: gen0, Workers: 2})
	for i := range 20 {
		driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(fmt.Sprint(i)), actors.RxBegin{}, success(fmt.Sprint(i)))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.Rotations < 3 || st.Dropped != 0 {
		t.Fatalf("stats %+v: want 3 or more rotations, nothing dropped", st)
	}
	if files := rotatedFiles(t, path); len(files) != 3 {
		t.Fatalf("files %q, want path, path.1 and path.2", files)
	}
	replayEach(t, rotatedFiles(t, path))
}

// TestRotateSessionSpanningFiles: a session born before a rotation and
// stepped after it has only its later steps in the new file. Replaying
// that file names it as born in an earlier file and skips its records —
// not a malformed trace, not a divergence — and replays the rest; the
// old file replays the session's start. A file that is not a rotated
// part with such a record is still malformed.
func TestRotateSessionSpanningFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gen.jsonl")
	w, err := Create(path, WithMaxBytes(2500), WithRotate(10), WithFlushEvery(0))
	if err != nil {
		t.Fatal(err)
	}
	w.Engine(actors.EngineInfo{Self: gen0, Workers: 2})
	// The long session is born, then others fill the file; it steps on
	// once they made the Writer rotate.
	long := actors.NewRxSession(rxConfig("long"))
	cfg := rxConfig("long")
	st := w.Session("gen/0/$1/$long", actors.Birth{Engine: gen0, At: at, Rx: &cfg})
	st.Stepped(long, nil)
	st.Record(actors.RxBegin{}, at)
	st.Stepped(long, long.Step(actors.RxBegin{}, at))
	for i := 0; w.Stats().Rotations == 0; i++ {
		if i > 100 {
			t.Fatal("no rotation")
		}
		driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(fmt.Sprint(i)), actors.RxBegin{}, success(fmt.Sprint(i)))
	}
	st.Record(success("long"), at)
	st.Stepped(long, long.Step(success("long"), at))
	if w.Stats().Rotations != 1 {
		t.Fatalf("stats %+v, want one rotation", w.Stats())
	}
	driveRx(w, "gen/0/$1/$after", rxConfig("after"), actors.RxBegin{}, success("after"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files := rotatedFiles(t, path)
	res := replayEach(t, files)
	old, cur := res[0], res[1]
	if !hasSession(old, "long") || hasSession(cur, "long") {
		t.Fatalf("old file's sessions %+v, new file's %+v", old.Sessions, cur.Sessions)
	}
	if !slices.ContainsFunc(res[1:], func(r *Result) bool { return hasSession(r, "after") }) {
		t.Fatal("the session born after the rotation is in no later file")
	}
	if i := slices.IndexFunc(cur.Earlier, func(e EarlierActor) bool { return e.Actor == "gen/0/$1/$long" }); i < 0 ||
		cur.Earlier[i] != (EarlierActor{Actor: "gen/0/$1/$long", Records: 1}) || cur.Part != 2 {
		t.Fatalf("new file: part %d, earlier %+v; want part 2 and the long session's one step", cur.Part, cur.Earlier)
	}
	var b strings.Builder
	cur.Print(&b)
	if !strings.Contains(b.String(), "part 2 of a rotated trace") || !strings.Contains(b.String(), "gen/0/$1/$long") ||
		!strings.Contains(b.String(), "began in an earlier file") || !strings.Contains(b.String(), "identical") {
		t.Errorf("print:\n%s", b.String())
	}

	// The export of the new file says what it left out, as replay names
	// it: the records of the sessions born in the old file (the long
	// session's step among them).
	var exp bytes.Buffer
	f1, err := os.Open(files[1])
	if err != nil {
		t.Fatal(err)
	}
	est, err := ExportPerfetto(f1, &exp)
	f1.Close()
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, e := range cur.Earlier {
		records += e.Records
	}
	if est.Part != 2 || est.Skipped != records || est.SkippedActors != len(cur.Earlier) {
		t.Errorf("export of the new file: part %d, skipped %d records of %d actors; want part 2 and replay's %d records of %d (%+v)",
			est.Part, est.Skipped, est.SkippedActors, records, len(cur.Earlier), cur.Earlier)
	}

	// Without the header's part the same records are malformed.
	body, err := os.ReadFile(files[1])
	if err != nil {
		t.Fatal(err)
	}
	unparted := bytes.Replace(body, []byte(`"part":2,`), nil, 1)
	if bytes.Equal(unparted, body) {
		t.Fatalf("no part in the header:\n%s", body)
	}
	if _, err := Replay(bytes.NewReader(unparted)); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "before its birth") {
		t.Fatalf("a first file with a step before its birth: %v, want ErrFormat", err)
	}
}

func hasSession(res *Result, request string) bool {
	for _, s := range res.Sessions {
		if s.Request == request {
			return true
		}
	}
	return false
}

// TestRotateOversizedRecord: a record larger than the bound goes in a
// file of its own (rotating once, not for ever, and not dropped).
func TestRotateOversizedRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gen.jsonl")
	w, err := Create(path, WithMaxBytes(400), WithRotate(3), WithFlushEvery(0))
	if err != nil {
		t.Fatal(err)
	}
	w.Engine(actors.EngineInfo{Self: gen0, Workers: 2})
	driveRx(w, "gen/0/$1/$1", rxConfig("1"), actors.RxBegin{}, success("1"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if st.Dropped != 0 || st.Rotations == 0 || st.Rotations > 3 {
		t.Fatalf("stats %+v", st)
	}
	res := replayEach(t, rotatedFiles(t, path))
	steps := 0
	for _, r := range res {
		steps += r.Steps + r.Births
		for _, e := range r.Earlier {
			steps += e.Records
		}
	}
	if steps != 3 {
		t.Fatalf("%d records of the session over %d files, want 3", steps, len(res))
	}
}

// TestRotateFailureIsReported: a rotation that cannot rename the file
// (its directory was moved away) stops the trace as a failed write does:
// WithOnStop says so once, naming the rotation, later records are dropped
// without disturbing the caller, Close returns the error, and the file
// written so far is whole (it ends in its "end" record).
func TestRotateFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "traces"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "traces", "gen.jsonl")
	var mu sync.Mutex
	var stops []Stop
	w, err := Create(path, WithMaxBytes(2500), WithRotate(2), WithFlushEvery(0), WithOnStop(func(s Stop) {
		mu.Lock()
		stops = append(stops, s)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	w.Engine(actors.EngineInfo{Self: gen0, Workers: 2})
	driveRx(w, "gen/0/$1/$0", rxConfig("0"), actors.RxBegin{}, success("0"))
	moved := filepath.Join(dir, "moved")
	if err := os.Rename(filepath.Join(dir, "traces"), moved); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 20; i++ {
		driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(fmt.Sprint(i)), actors.RxBegin{}, success(fmt.Sprint(i)))
	}
	err = w.Close()
	if err == nil || !strings.Contains(err.Error(), "rotate") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Close: %v, want the rotation's error", err)
	}
	if len(stops) != 1 || stops[0].Truncated || !strings.Contains(stops[0].Error(), "rotate") {
		t.Fatalf("OnStop calls %+v, want one naming the rotation", stops)
	}
	if st := w.Stats(); st.Dropped == 0 || st.Rotations != 0 {
		t.Fatalf("stats %+v", st)
	}
	res := replayEach(t, []string{filepath.Join(moved, "gen.jsonl")})
	if res[0].Births == 0 {
		t.Fatalf("%+v", res[0])
	}
}

// TestRotateUnwritableDirectory: as above, with the trace's directory
// made read-only (root writes there anyway: skipped).
func TestRotateUnwritableDirectory(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes into a read-only directory")
	}
	dir := filepath.Join(t.TempDir(), "traces")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gen.jsonl")
	var stops []Stop
	w, err := Create(path, WithMaxBytes(2500), WithRotate(2), WithFlushEvery(0), WithOnStop(func(s Stop) { stops = append(stops, s) }))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
	for i := range 20 {
		driveRx(w, fmt.Sprintf("gen/0/$1/$%d", i), rxConfig(fmt.Sprint(i)), actors.RxBegin{}, success(fmt.Sprint(i)))
	}
	if err := w.Close(); err == nil || !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("Close: %v, want the rotation's permission error", err)
	}
	if len(stops) != 1 || !strings.Contains(stops[0].Error(), "rotate") {
		t.Fatalf("OnStop calls %+v", stops)
	}
	replayEach(t, []string{path})
}

// TestRotateRefusesBadInput: a negative keep, and rotation of a file that
// is not a regular one, are refused at Create, naming the value.
func TestRotateRefusesBadInput(t *testing.T) {
	if _, err := Create(filepath.Join(t.TempDir(), "t"), WithRotate(-1)); err == nil || !strings.Contains(err.Error(), "keep -1") {
		t.Fatalf("keep -1: %v", err)
	}
	if _, err := Create(os.DevNull, WithRotate(1)); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("rotating %s: %v", os.DevNull, err)
	}
}

// TestCreateRemovesAnEarlierRunsRotatedFiles: an earlier run with a larger
// keep (or any keep, before a run without rotation) left rotated files past
// this run's keep, whose part numbers run on into this run's: replaying
// path* mixed two runs. Create removes path.N while it begins as a trace,
// with or without rotation, and stops at the first that does not (a file
// of another kind under such a name is not the trace's to remove).
// (Found in a review; checked to fail: Create removed path.1 … path.keep
// only.)
func TestCreateRemovesAnEarlierRunsRotatedFiles(t *testing.T) {
	const header = `{"kind":"trace","version":4,"part":7,"t":1}` + "\n"
	for _, keep := range []int{0, 1} {
		dir := t.TempDir()
		path := filepath.Join(dir, "gen.jsonl")
		for i, body := range []string{header, header, header, "a file of another kind\n", header} {
			if err := os.WriteFile(rotated(path, i+1), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		opts := []Option{WithFlushEvery(0)}
		if keep > 0 {
			opts = append(opts, WithMaxBytes(3000), WithRotate(keep))
		}
		w, err := Create(path, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 5; i++ {
			_, err := os.Stat(rotated(path, i))
			if gone := errors.Is(err, fs.ErrNotExist); gone != (i <= 3) {
				t.Fatalf("keep %d: %s gone %v, want the earlier run's traces .1-.3 gone and the rest left", keep, filepath.Base(rotated(path, i)), gone)
			}
		}
	}
}
