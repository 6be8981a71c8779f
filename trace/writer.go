package trace

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// DefaultMaxBytes bounds a trace file unless WithMaxBytes says otherwise.
const DefaultMaxBytes = 1 << 30

// ErrClosed is returned by a Writer's Flush after Close.
var ErrClosed = errors.New("trace: writer closed")

// Option configures a Writer.
type Option func(*options)

type options struct {
	maxBytes   int64
	bufSize    int
	clock      func() time.Time
	flushEvery time.Duration
	onStop     func(Stop)
	keep       int
	keepPrev   int
}

// DefaultFlushEvery is how often a Writer from Create writes its buffered
// records to the file (WithFlushEvery).
const DefaultFlushEvery = time.Second

// WithMaxBytes bounds the trace at n bytes (0: unbounded). Past it the
// Writer writes one "truncated" record and drops the rest, unless
// WithRotate has it start a new file instead.
func WithMaxBytes(n int64) Option { return func(o *options) { o.maxBytes = n } }

// WithRotate has a Writer from Create rotate its file when it reaches its
// bound (WithMaxBytes) instead of dropping later records: it ends the
// file with its "end" record, starts the next file beside it
// (PATH.rotating, locked), renames PATH.(keep-1) to PATH.keep, …, PATH.1
// to PATH.2 and PATH to PATH.1 (deleting the old PATH.keep) and the next
// file to PATH, and only then closes the ended file; the new PATH begins
// with the header and every engine record the Writer wrote, so that each
// file replays on its own. PATH names a locked file throughout, so a
// Create at PATH during a rotation is refused (ErrInUse) as at any other
// time (on a file system without hard links, not between the two last
// renames). At most keep old files are kept beside PATH; at most
// (keep+1)×MaxBytes of disk, give or take a record a file. keep 0 (the
// default) does not rotate: the trace stops at its bound. Create moves an
// earlier run's PATH and PATH.1 … PATH.N aside (see Create) and removes
// the PATH.1 … PATH.keep left beside them, so that every file of the set
// is this Writer's. A Writer from NewWriter (no path) does not rotate.
//
// A session or table born in an earlier file is not recorded again: the
// later file holds only its later records, which replay skips and names
// (Result.Earlier). The rotation runs on the recording goroutine that
// crossed the bound, under the Writer's lock, like a flush of a full
// buffer: a flush, a create, keep renames, a link, a rename and a close.
// If one fails the Writer stops as after a failed write (WithOnStop,
// Close's error) and the files written so far stay whole.
func WithRotate(keep int) Option { return func(o *options) { o.keep = keep } }

// DefaultKeepPrevious is how many earlier runs' traces Create keeps
// beside its path unless WithKeepPrevious says otherwise.
const DefaultKeepPrevious = 4

// WithKeepPrevious has Create keep the newest n earlier runs' traces
// beside its path (n ≥ 1; default DefaultKeepPrevious): when it moves an
// earlier trace aside (see Create), it removes the sets beyond the newest
// n — each path.prev-<UTC time>[-N] with its parts .1 … — the one it just
// moved always kept, so that a process restarted in a loop does not fill
// its disk with them. Only names of exactly that form are removed, never
// another file beside them; a removal that fails is no error of Create's
// (Writer.NotPruned says why).
func WithKeepPrevious(n int) Option { return func(o *options) { o.keepPrev = n } }

// WithBufferSize sets the write buffer's size (default 256 KiB).
func WithBufferSize(n int) Option { return func(o *options) { o.bufSize = n } }

// WithFlushEvery makes a Writer from Create write its buffered records to
// the file every d (default DefaultFlushEvery; 0: only when the buffer
// fills and at Close), so that a process killed before it closes its
// engine leaves the trace up to the last second, not an empty file.
func WithFlushEvery(d time.Duration) Option { return func(o *options) { o.flushEvery = d } }

// Stop says why a Writer stopped recording before Close: it reached its
// bound (Truncated) or a write failed (Err). Later records are dropped.
type Stop struct {
	Truncated bool
	MaxBytes  int64 // the bound, with Truncated
	Err       error // the write error, without Truncated
}

// Error names why the trace stopped.
func (s Stop) Error() string {
	if s.Truncated {
		return fmt.Sprintf("trace: reached its bound of %d bytes; later records are dropped (replay stops at the truncation)", s.MaxBytes)
	}
	return fmt.Sprintf("trace: write failed, later records are dropped: %v", s.Err)
}

// WithOnStop calls f once, when the Writer stops recording before Close
// (truncated at its bound or a failed write), so that its owner can say
// so at once instead of a user finding a short trace later. f runs on the
// recording goroutine with the Writer's lock held: it must not call the
// Writer.
func WithOnStop(f func(Stop)) Option { return func(o *options) { o.onStop = f } }

// WithClock sets the clock of the header and "truncated" records (tests).
func WithClock(f func() time.Time) Option { return func(o *options) { o.clock = f } }

// Writer writes a trace: it is the actors.Tracer an engine records into.
// It is safe for concurrent use; each session encodes its records on its
// own goroutine and the Writer appends whole lines under a mutex.
type Writer struct {
	mu        sync.Mutex
	bw        *bufio.Writer
	closer    io.Closer
	o         options
	bytes     int64
	records   int64
	dropped   int64
	truncated bool
	closed    bool
	err       error
	tables    map[string]int // table births by actor path

	// Rotation (WithRotate): the file Create opened, and what each new
	// file begins with.
	path      string
	file      *os.File
	engines   [][]byte // the engine records written, in order
	part      int      // the current file's place in the run, from 1
	rotations int
	fileStart int64 // bytes written before the current file
	preamble  int64 // bytes written up to the current file's first record past its header and engines
	fileRecs  int64 // records written before the current file
	fileDrops int64 // records dropped before the current file

	// movedAside is where Create moved an earlier trace at its path;
	// notMoved why it could not move it (and truncated it, as before).
	movedAside string
	notMoved   error
	// notPruned is why Create could not remove an earlier run's trace
	// past the newest it keeps (WithKeepPrevious).
	notPruned error

	// The periodic flush of a Writer from Create (WithFlushEvery).
	stopFlush chan struct{}
	flushed   chan struct{} // closed when the flusher returned
	stopOnce  sync.Once
}

var _ actors.Tracer = (*Writer)(nil)

// NewWriter writes a trace to w (the caller closes w after Close).
func NewWriter(w io.Writer, opts ...Option) *Writer {
	o := options{maxBytes: DefaultMaxBytes, bufSize: 256 << 10, clock: time.Now, flushEvery: DefaultFlushEvery}
	for _, f := range opts {
		f(&o)
	}
	t := &Writer{bw: bufio.NewWriterSize(w, o.bufSize), o: o, part: 1}
	// The header is written whatever the bound: without it the trace
	// does not read, not even its "truncated" record.
	b, _ := json.Marshal(&Record{Kind: KindTrace, Version: Version, Build: recorderBuild(), T: o.clock().UnixNano()})
	t.mu.Lock()
	t.write(append(b, '\n'))
	t.preamble = t.bytes
	t.mu.Unlock()
	return t
}

// module is kvxfer's module path, which recorderBuild looks for.
const module = "github.com/kvxfer/kvxfer"

// recorderBuild names the kvxfer build this process runs, for a header's
// Build: the kvxfer module's version (its main module's or its
// dependency's) and, when kvxfer is the main module, its VCS revision
// ("v1.2.0", "(devel) 0123456789ab+modified"); "unknown" for a binary
// without build information.
var recorderBuild = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if bi.Main.Path != module {
		for _, d := range bi.Deps {
			if d.Path == module {
				if d.Replace != nil {
					d = d.Replace
				}
				return cmp.Or(d.Version, "(devel)")
			}
		}
		return "unknown"
	}
	v := cmp.Or(bi.Main.Version, "(devel)")
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(len(s.Value), 12)]
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+modified"
			}
		}
	}
	if rev != "" && !strings.Contains(v, rev) {
		v += " " + rev + dirty
	}
	return v
})

// ErrInUse is returned by Create for a file another Writer (of this
// process or another) has open: both would write it at once, and neither
// trace would read back.
var ErrInUse = errors.New("trace: another Writer (another process's --trace, or another engine's TracePath) writes this file: each needs its own")

// Create creates the file at path and writes a trace to it; Close closes
// the file. It holds a regular file's exclusive advisory lock (flock)
// until Close, and refuses a file whose lock another Writer holds
// (ErrInUse).
//
// An earlier trace at path (an engine restarted with the same TracePath,
// a second run with the same --trace) is not destroyed: once it holds the
// lock, Create renames a non-empty path to path.prev-<UTC time>, and the
// earlier run's rotated files path.1 … path.N that begin as a trace to
// path.prev-<UTC time>.1 … .N (with -2, -3, … after the time where that
// name is taken), then starts a new file at path. MovedAside names where
// they went. An empty path is reused as it is. Of the earlier runs' sets
// so moved, it keeps the newest DefaultKeepPrevious (WithKeepPrevious)
// and removes the older ones; NotPruned says why one could not be.
//
// With WithRotate it rotates the file at its bound (see there): path must
// then be a regular file. The earlier run's path.N that begin as a
// trace were moved aside with path, with or without rotation: left, an
// earlier run with a larger keep left more than this one rotates into,
// and their part numbers ran on into this run's, so that a replay of
// path* mixed two runs. What else is left of path.1 … path.keep, which
// rotation would replace, Create removes.
func Create(path string, opts ...Option) (*Writer, error) {
	path = filepath.Clean(path)
	o := options{keepPrev: DefaultKeepPrevious}
	for _, f := range opts {
		f(&o)
	}
	if o.keep < 0 {
		return nil, fmt.Errorf("trace: rotate: keep %d old files of %s: want 0 (no rotation) or more", o.keep, path)
	}
	if o.keepPrev < 1 {
		return nil, fmt.Errorf("trace: keep %d earlier runs' traces beside %s: want 1 or more (the earlier trace Create moves aside is always kept)", o.keepPrev, path)
	}
	if o.clock == nil {
		o.clock = time.Now
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		// A link's target is the trace: it is moved aside and started
		// again where it is, and the link keeps pointing to it.
		path = real
	}
	f, regular, prev, notMoved, err := openAside(path, o.keep, o.clock)
	if err != nil {
		return nil, err
	}
	if o.keep > 0 && !regular {
		_ = f.Close()
		return nil, fmt.Errorf("trace: rotate: %s is not a regular file: only a regular file's trace rotates", path)
	}
	if regular {
		if err := removeRotated(path, o.keep); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("trace: rotate: removing an earlier run's file: %w", err)
		}
	}
	w := NewWriter(f, opts...)
	w.closer = f
	w.movedAside, w.notMoved = prev, notMoved
	if prev != "" {
		w.notPruned = prunePrevious(path, prev, o.keepPrev)
	}
	if w.o.keep > 0 {
		w.path, w.file = path, f
	}
	if d := w.o.flushEvery; d > 0 {
		w.stopFlush, w.flushed = make(chan struct{}), make(chan struct{})
		go w.flushLoop(d)
	}
	return w, nil
}

// MovedAside returns the name Create moved an earlier trace at its path
// to (its rotated files, if any, are that name's .1 … .N), or "" when
// there was none.
func (w *Writer) MovedAside() string { return w.movedAside }

// NotMovedAside says why Create could not move an earlier trace at its
// path aside (a file bind-mounted alone, a directory it may not write),
// so that it truncated it as it always did; nil when it did not have to.
func (w *Writer) NotMovedAside() error { return w.notMoved }

// NotPruned says why Create could not remove an earlier run's trace past
// the newest it keeps beside its path (WithKeepPrevious): the directory
// could not be read, or a file not removed (each named); nil when it
// removed every one it had to, or had none to remove. The trace itself
// is written all the same.
func (w *Writer) NotPruned() error { return w.notPruned }

// prevLayout is the UTC time in the name of an earlier trace Create moved
// aside (path.prev-<UTC time>).
const prevLayout = "20060102T150405Z"

// prunePrevious removes the earlier runs' traces beside path past the
// newest keep: the sets path.prev-<UTC time>[-N] (Create's names, see
// moveAside) and their parts .1 …, newest first by time, then N. The set
// at moved, just moved aside, is kept whatever its time (a clock stepped
// back). Files of any other name are left.
func prunePrevious(path, moved string, keep int) error {
	dir, base := filepath.Split(path)
	ents, err := os.ReadDir(filepath.Clean(dir))
	if err != nil {
		return fmt.Errorf("trace: listing the earlier runs' traces beside %s, to keep the newest %d: %w", path, keep, err)
	}
	type set struct {
		at    time.Time
		n     int
		files []string
	}
	sets := map[string]*set{}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		name, at, n, ok := prevSet(base, e.Name())
		if !ok || filepath.Join(dir, name) == moved {
			continue
		}
		s := sets[name]
		if s == nil {
			s = &set{at: at, n: n}
			sets[name] = s
		}
		s.files = append(s.files, filepath.Join(dir, e.Name()))
	}
	if len(sets) < keep {
		return nil
	}
	older := make([]*set, 0, len(sets))
	for _, s := range sets {
		older = append(older, s)
	}
	slices.SortFunc(older, func(a, b *set) int {
		return cmp.Or(b.at.Compare(a.at), cmp.Compare(b.n, a.n))
	})
	var errs []error
	for _, s := range older[keep-1:] {
		for _, f := range s.files {
			if err := remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("trace: removing the earlier runs' traces beside %s past the newest %d: %w; remove them yourself, or they stay", path, keep, errors.Join(errs...))
	}
	return nil
}

// remove is os.Remove (a variable for tests: a file that cannot be
// removed).
var remove = os.Remove

// prevSet reports whether name is an earlier trace Create moved aside
// beside base, or one of its parts: base.prev-<UTC time>, with -N (N ≥ 2)
// after the time where that name was taken, and .I (I ≥ 1) for a part;
// set is the name without .I, at its time and n its N (1 without).
func prevSet(base, name string) (set string, at time.Time, n int, ok bool) {
	rest, found := strings.CutPrefix(name, base+".prev-")
	if !found || len(rest) < len(prevLayout) {
		return "", time.Time{}, 0, false
	}
	at, err := time.Parse(prevLayout, rest[:len(prevLayout)])
	if err != nil || at.Format(prevLayout) != rest[:len(prevLayout)] {
		return "", time.Time{}, 0, false
	}
	set, n = name, 1
	suffix := rest[len(prevLayout):] // "", "-N", ".I" or "-N.I"
	if i := strings.IndexByte(suffix, '.'); i >= 0 {
		if _, ok := count(suffix[i+1:]); !ok {
			return "", time.Time{}, 0, false
		}
		set, suffix = name[:len(name)-len(suffix)+i], suffix[:i]
	}
	if suffix != "" {
		num, found := strings.CutPrefix(suffix, "-")
		if n, ok = count(num); !found || !ok || n < 2 {
			return "", time.Time{}, 0, false
		}
	}
	return set, at, n, true
}

// count parses s as a count as Create writes one: decimal, from 1, no
// leading zero.
func count(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 1 && strconv.Itoa(n) == s
}

// openAside opens the file at path for Create: as openLocked, but a
// regular file that holds an earlier trace (or has rotated files beside
// it) is moved aside (moveAside) under the lock instead of truncated, and
// a new file is started at path. prev is where the earlier one went.
func openAside(path string, keep int, clock func() time.Time) (f *os.File, regular bool, prev string, notMoved, err error) {
	for range 3 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o666)
		if err != nil {
			return nil, false, "", nil, err
		}
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			return f, false, "", nil, nil
		}
		if err := lockFile(f); err != nil {
			_ = f.Close()
			return nil, false, "", nil, &os.PathError{Op: "create trace", Path: path, Err: err}
		}
		if now, err := os.Stat(path); err != nil || !os.SameFile(st, now) {
			// Another Create moved this file aside between the open
			// and the lock: open the one at path now.
			_ = f.Close()
			continue
		}
		prev, err := moveAside(path, st.Size(), keep, clock)
		var le *os.LinkError
		if err != nil && errors.As(err, &le) && le.Old == path {
			// The file itself cannot be renamed (bound into a
			// container alone, a directory this process may not
			// write): nothing moved, so it is truncated, as before
			// files were moved aside; the caller says so.
			if terr := f.Truncate(0); terr != nil {
				_ = f.Close()
				return nil, false, "", nil, fmt.Errorf("trace: %s: moving the earlier trace aside: %w; truncating it: %w", path, err, terr)
			}
			return f, true, "", err, nil
		}
		if err != nil {
			_ = f.Close()
			return nil, false, "", nil, fmt.Errorf("trace: moving the earlier trace %s aside: %w; move or remove it, or trace to another file", path, err)
		}
		if prev == "" {
			return f, true, "", nil, nil // empty, nothing beside it
		}
		_ = f.Close() // the earlier trace, now at prev
		f, regular, err = openLocked(path)
		return f, regular, prev, nil, err
	}
	return nil, false, "", nil, &os.PathError{Op: "create trace", Path: path, Err: ErrInUse}
}

// moveAside renames an earlier trace at path (size bytes), the rotated
// files path.1 … path.keep that are there, and path.N after them that
// begin as a trace, to prev, prev.1 … prev.N, where prev is
// path.prev-<UTC time> and a name none of them takes. It moves nothing, and returns "", for an empty path with no
// rotated files.
func moveAside(path string, size int64, keep int, clock func() time.Time) (string, error) {
	// Every path.1 … path.keep that is there goes too, whatever it holds
	// (a gap, or one whose header never reached the disk): Create
	// removes what is left of them. Past keep, those that begin as a
	// trace, one after another.
	parts := 0
	for i := 1; ; i++ {
		name := rotated(path, i)
		if i > keep && !beginsAsTrace(name) {
			break
		}
		if _, err := os.Lstat(name); err == nil {
			parts = i
		}
	}
	if size == 0 && parts == 0 {
		return "", nil
	}
	base := path + ".prev-" + clock().UTC().Format(prevLayout)
	prev := base
	for n := 2; taken(prev, parts); n++ {
		prev = fmt.Sprintf("%s-%d", base, n)
	}
	if err := rename(path, prev); err != nil {
		return "", err
	}
	for i := 1; i <= parts; i++ {
		if err := rename(rotated(path, i), rotated(prev, i)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s moved to %s, but: %w", path, prev, err)
		}
	}
	return prev, nil
}

// rename is os.Rename (a variable for tests: a file that cannot be
// renamed, as one bound into a container alone).
var rename = os.Rename

// taken reports whether name or any of name.1 … name.parts is there.
func taken(name string, parts int) bool {
	for i := 0; i <= parts; i++ {
		n := name
		if i > 0 {
			n = rotated(name, i)
		}
		if _, err := os.Lstat(n); !errors.Is(err, fs.ErrNotExist) {
			return true
		}
	}
	return false
}

// openLocked opens the file at path for a trace: a regular file is
// locked, then truncated; a device or a pipe (/dev/stderr, a FIFO a
// reader drains) is written as it is.
func openLocked(path string) (f *os.File, regular bool, err error) {
	f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, false, err
	}
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		if err := lockFile(f); err != nil {
			_ = f.Close()
			return nil, false, &os.PathError{Op: "create trace", Path: path, Err: err}
		}
		if err := f.Truncate(0); err != nil {
			_ = f.Close()
			return nil, false, err
		}
		return f, true, nil
	}
	return f, false, nil
}

// rotated is the name of a trace's i-th old file (WithRotate).
func rotated(path string, i int) string { return fmt.Sprintf("%s.%d", path, i) }

// removeOld removes an old rotated file; one that is not there is fine.
// removeRotated removes path.1 … path.keep, and after them path.N while
// it is there and begins as a trace does (a file of another kind under
// such a name is left, and so are those after it).
func removeRotated(path string, keep int) error {
	for i := 1; ; i++ {
		name := rotated(path, i)
		if i > keep && !beginsAsTrace(name) {
			return nil
		}
		if err := removeOld(name); err != nil {
			return err
		}
	}
}

// beginsAsTrace reports whether the file name begins as a trace's first
// line does ({"kind":"trace",…).
func beginsAsTrace(name string) bool {
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	const head = `{"kind":"trace",`
	b := make([]byte, len(head))
	_, err = io.ReadFull(f, b)
	return err == nil && string(b) == head
}

func removeOld(name string) error {
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// rotate ends the current file, shifts the old ones and starts a new file
// at w.path with the header and the engine records (WithRotate). Called
// with w.mu held, on the recording goroutine that crossed the bound. A
// failure stops the Writer (setErr) and leaves the files written so far
// whole: the ended file is renamed last, after the old ones made room.
//
// The file at w.path is locked throughout: the next file is made and
// locked beside it (w.path.rotating) before anything moves, and the
// ended file is closed, its lock released, only once the next one has
// taken its place (switchIn). A Create at w.path during the rotation is
// refused (ErrInUse), as it is before and after: with the ended file
// closed first, one there between the close and the next file's lock
// took the path, moved this run's files aside under the rotation and
// wrote beside it.
func (w *Writer) rotate() {
	w.writeEnd()
	if w.err == nil {
		w.setErr(w.bw.Flush())
	}
	if w.err != nil {
		return
	}
	next := w.path + ".rotating"
	nf, _, err := openLocked(next)
	if err != nil {
		w.setErr(fmt.Errorf("trace: rotate %s: start the next file: %w; the trace stops here, its files so far are whole", w.path, err))
		return
	}
	if err := w.shift(next); err != nil {
		_ = nf.Close()
		_ = os.Remove(next)
		w.setErr(fmt.Errorf("trace: rotate %s: %w; the trace stops here, its files so far are whole", w.path, err))
		return
	}
	f := w.file
	w.file, w.closer = nf, nf
	if err := f.Close(); err != nil {
		w.setErr(fmt.Errorf("trace: rotate %s: close the ended file (now %s): %w", w.path, rotated(w.path, 1), err))
		return
	}
	w.bw.Reset(nf)
	w.rotations++
	w.part++
	w.fileStart, w.fileRecs, w.fileDrops = w.bytes, w.records, w.dropped
	b, _ := json.Marshal(&Record{Kind: KindTrace, Version: Version, Part: w.part, Build: recorderBuild(), T: w.o.clock().UnixNano()})
	w.write(append(b, '\n'))
	for _, e := range w.engines {
		w.write(e)
	}
	w.preamble = w.bytes
}

// shift makes room for the ended file at w.path as w.path.1 and puts the
// next file (at next) in its place: it removes w.path.keep, renames each
// w.path.i to w.path.(i+1), newest last, then switches the two (switchIn).
func (w *Writer) shift(next string) error {
	if err := removeOld(rotated(w.path, w.o.keep)); err != nil {
		return err
	}
	for i := w.o.keep - 1; i >= 1; i-- {
		if err := rename(rotated(w.path, i), rotated(w.path, i+1)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return switchIn(w.path, next)
}

// switchIn makes the file at path path.1 and the file at next path, so
// that path always names one of the two (both locked by the rotating
// Writer): it links path as path.1, then renames next over path. Where
// the file system has no hard links it renames path to path.1 and then
// next to path, and a Create between the two renames is not refused.
func switchIn(path, next string) error {
	if err := link(path, rotated(path, 1)); err != nil {
		if err := rename(path, rotated(path, 1)); err != nil {
			return err
		}
		return rename(next, path)
	}
	if err := rename(next, path); err != nil {
		_ = os.Remove(rotated(path, 1)) // undo the link: path is still the ended file
		return err
	}
	return nil
}

// link is os.Link (a variable for tests: a file system without hard
// links).
var link = os.Link

// flushLoop writes the buffered records to the file every d until Close.
func (w *Writer) flushLoop(d time.Duration) {
	defer close(w.flushed)
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.mu.Lock()
			if !w.closed && w.err == nil && w.bw.Buffered() > 0 {
				w.setErr(w.bw.Flush())
			}
			w.mu.Unlock()
		case <-w.stopFlush:
			return
		}
	}
}

// Stats counts what a Writer wrote and dropped, over all its files;
// Rotations counts the files it ended and rotated (WithRotate).
type Stats struct {
	Records, Bytes, Dropped int64
	Truncated               bool
	Rotations               int
}

// Stats returns the Writer's counters.
func (w *Writer) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Stats{Records: w.records, Bytes: w.bytes, Dropped: w.dropped, Truncated: w.truncated, Rotations: w.rotations}
}

// Flush writes buffered records to the underlying writer.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if w.err == nil {
		w.setErr(w.bw.Flush())
	}
	return w.err
}

// Close writes the "end" record, flushes the trace and closes the file
// Create opened. Records that arrive later are dropped. It reports the
// first write error.
func (w *Writer) Close() error {
	w.stopOnce.Do(func() {
		if w.stopFlush != nil {
			close(w.stopFlush)
			<-w.flushed
		}
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	if w.err == nil {
		// The end record, past the bound too: it says the trace was
		// closed, not cut short (Reader.Unclosed).
		w.writeEnd()
	}
	w.closed = true
	if w.err == nil {
		w.err = w.bw.Flush()
	}
	if w.closer != nil {
		if err := w.closer.Close(); err != nil && w.err == nil {
			w.err = err
		}
	}
	return w.err
}

// writeEnd writes the current file's "end" record: its records and drops.
func (w *Writer) writeEnd() {
	end, _ := json.Marshal(EndStats{Records: w.records - w.fileRecs, Dropped: w.dropped - w.fileDrops})
	b, _ := json.Marshal(&Record{Kind: KindEnd, T: w.o.clock().UnixNano(), Msg: end})
	w.write(append(b, '\n'))
}

// writeRecord encodes and appends one record (header records only: they
// are rare, so encoding under the lock is fine).
func (w *Writer) writeRecord(r *Record) {
	b, err := json.Marshal(r)
	if err != nil {
		w.mu.Lock()
		w.dropped++
		w.setErr(err)
		w.mu.Unlock()
		return
	}
	w.append(append(b, '\n'))
}

// append writes one encoded line, or drops it once the trace is closed,
// failed or full.
func (w *Writer) append(line []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.appendLocked(line)
}

// appendLocked is append with w.mu held.
func (w *Writer) appendLocked(line []byte) {
	if w.closed || w.err != nil || w.truncated {
		w.dropped++
		return
	}
	if w.o.maxBytes > 0 && w.bytes-w.fileStart+int64(len(line)) > w.o.maxBytes && w.file != nil && w.bytes > w.preamble {
		// A new file, unless this one holds nothing past its preamble:
		// a record larger than the bound then gets a file of its own.
		if w.rotate(); w.err != nil {
			w.dropped++
			return
		}
	}
	if w.o.maxBytes > 0 && w.bytes-w.fileStart+int64(len(line)) > w.o.maxBytes && w.file == nil {
		w.truncated = true
		w.dropped++
		b, _ := json.Marshal(&Record{Kind: KindTruncated, T: w.o.clock().UnixNano()})
		w.write(append(b, '\n'))
		if w.o.onStop != nil {
			w.o.onStop(Stop{Truncated: true, MaxBytes: w.o.maxBytes})
		}
		return
	}
	w.write(line)
}

func (w *Writer) write(line []byte) {
	if _, err := w.bw.Write(line); err != nil {
		w.setErr(err)
		return
	}
	w.bytes += int64(len(line))
	w.records++
}

// Engine implements actors.Tracer: it records the engine's topology.
func (w *Writer) Engine(info actors.EngineInfo) {
	msg, err := json.Marshal(info)
	if err != nil {
		w.fail(err)
		return
	}
	b, err := json.Marshal(&Record{Kind: KindEngine, Engine: info.Self.String(), T: w.o.clock().UnixNano(), Msg: msg})
	if err != nil {
		w.fail(err)
		return
	}
	line := append(b, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	w.appendLocked(line)
	// Every file a rotation starts begins with it again (after the
	// ones before it: a rotation this append made wrote those).
	w.engines = append(w.engines, line)
}

func (w *Writer) fail(err error) {
	w.mu.Lock()
	w.setErr(err)
	w.mu.Unlock()
}

// setErr keeps the first error and, while the trace is open and was not
// already stopped, reports it (WithOnStop). Called with w.mu held.
func (w *Writer) setErr(err error) {
	if err == nil || w.err != nil {
		return
	}
	w.err = err
	if w.o.onStop != nil && !w.closed && !w.truncated {
		w.o.onStop(Stop{Err: err})
	}
}

// Record implements actors.Recorder for callers other than an engine's
// sessions: it writes a "msg" record, which replay skips.
func (w *Writer) Record(actor string, msg any, at time.Time) {
	typ, wire := encodeMsg(msg, nil, nil)
	raw, err := json.Marshal(wire)
	if err != nil {
		w.fail(err)
		return
	}
	w.writeRecord(&Record{Kind: KindMsg, Actor: actor, T: at.UnixNano(), Type: typ, Msg: raw})
}

// Session implements actors.Tracer: it records the session's birth and
// returns the recorder of its steps.
func (w *Writer) Session(actor string, b actors.Birth) actors.SessionTracer {
	s := &session{w: w, actor: actor}
	s.enc = json.NewEncoder(&s.buf)
	r := &s.pending
	*r = Record{Kind: KindBirth, Actor: actor, Engine: b.Engine.String(), T: b.At.UnixNano()}
	var cfg any
	switch {
	case b.Tx != nil:
		r.Side, r.Request, r.Type, cfg = SideTx, b.Tx.Request, "TxConfig", b.Tx
	case b.Rx != nil:
		r.Side, r.Request, r.Type, cfg = SideRx, b.Rx.Request, "RxConfig", b.Rx
	default:
		return nil
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		w.fail(err)
		return nil
	}
	r.Msg = raw
	s.has = true
	return s
}

// session records one session's steps. Its methods run on the session's
// actor only.
type session struct {
	w       *Writer
	actor   string
	seq     int
	pending Record // the birth or message awaiting its digest
	has     bool
	hello   *messages.Hello
	rd      *messages.RequestData
	buf     bytes.Buffer
	enc     *json.Encoder
}

func (s *session) Resolved(hello *messages.Hello, rd *messages.RequestData) {
	s.hello, s.rd = hello, rd
}

func (s *session) Record(msg any, at time.Time) {
	if s.has {
		// The previous step panicked: it got no digest.
		s.pending.Panic = true
		s.flush()
	}
	typ, wire := encodeMsg(msg, s.hello, s.rd)
	s.hello, s.rd = nil, nil
	s.seq++
	s.pending = Record{Kind: KindStep, Actor: s.actor, Seq: s.seq, T: at.UnixNano(), Type: typ}
	s.has = true
	if wire == nil {
		return
	}
	raw, err := json.Marshal(wire)
	if err != nil {
		s.w.fail(err)
		return
	}
	s.pending.Msg = raw
}

func (s *session) Stepped(session any, eff []actors.Effect) {
	if !s.has {
		return
	}
	d := DigestOf(session, eff)
	s.pending.Post = &d
	s.flush()
}

// StepPanicked implements actors.StepPanicTracer: the step on the
// message Record took panicked with v. Its record ("panic":true, and v)
// is written at once, and the trace flushed to its file, before the panic
// goes on: the session's last step is in the trace even when nothing
// comes after it, and so it is when the process dies of the panic.
func (s *session) StepPanicked(v any) {
	if !s.has {
		return
	}
	s.pending.Panic, s.pending.PanicValue = true, fmt.Sprint(v)
	s.flush()
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	if !s.w.closed && s.w.err == nil {
		s.w.setErr(s.w.bw.Flush())
	}
}

var (
	_ actors.StepPanicTracer = (*session)(nil)
	_ actors.StepPanicTracer = (*teeSession)(nil)
)

func (s *session) flush() {
	s.has = false
	s.buf.Reset()
	if err := s.enc.Encode(&s.pending); err != nil {
		s.w.fail(err)
		return
	}
	s.w.append(s.buf.Bytes())
	s.pending = Record{}
}

// Tee returns a recorder that records into t and also hands every message
// to r (a Recorder of the caller's own, as kvxfer.Config.Recorder beside
// Config.TracePath).
func Tee(t actors.Tracer, r actors.Recorder) actors.Tracer {
	if r == nil {
		return t
	}
	return &tee{t: t, r: r}
}

type tee struct {
	t actors.Tracer
	r actors.Recorder
}

func (t *tee) Record(actor string, msg any, at time.Time) {
	t.t.Record(actor, msg, at)
	t.r.Record(actor, msg, at)
}

func (t *tee) Engine(info actors.EngineInfo) {
	t.t.Engine(info)
	if o, ok := t.r.(actors.Tracer); ok {
		o.Engine(info)
	}
}

func (t *tee) Session(actor string, b actors.Birth) actors.SessionTracer {
	st := &teeSession{actor: actor, r: t.r, a: t.t.Session(actor, b)}
	if o, ok := t.r.(actors.Tracer); ok {
		st.b = o.Session(actor, b)
	}
	return st
}

type teeSession struct {
	actor string
	r     actors.Recorder
	a, b  actors.SessionTracer
}

func (s *teeSession) Record(msg any, at time.Time) {
	if s.a != nil {
		s.a.Record(msg, at)
	}
	if s.b != nil {
		s.b.Record(msg, at)
	} else {
		s.r.Record(s.actor, msg, at)
	}
}

func (s *teeSession) Resolved(hello *messages.Hello, rd *messages.RequestData) {
	if s.a != nil {
		s.a.Resolved(hello, rd)
	}
	if s.b != nil {
		s.b.Resolved(hello, rd)
	}
}

func (s *teeSession) Stepped(session any, eff []actors.Effect) {
	if s.a != nil {
		s.a.Stepped(session, eff)
	}
	if s.b != nil {
		s.b.Stepped(session, eff)
	}
}

func (s *teeSession) StepPanicked(v any) {
	for _, t := range []actors.SessionTracer{s.a, s.b} {
		if p, ok := t.(actors.StepPanicTracer); ok {
			p.StepPanicked(v)
		}
	}
}
